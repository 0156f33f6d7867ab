"""``python -m dcco`` (and ``torchrun ... -m dcco``): the command line."""

from dcco.cli import main

raise SystemExit(main())
