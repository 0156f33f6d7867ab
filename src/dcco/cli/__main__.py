"""``python -m dcco.cli``: the ``dcco`` command."""

import sys

from dcco.cli import main

sys.exit(main())
