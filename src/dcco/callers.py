"""Where a warning of dcco's points: at the user's line that led to it, not at dcco's own."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parent)
"""The folder of dcco's source: a frame whose file lies under it is dcco's own."""


def caller_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn``, called from the function that warns, that
    names the first frame outside dcco: the user's call of ``dcco.fit``, whatever depth of
    dcco's own calls lies between (1, the warning function itself, if none is outside)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and str(Path(frame.f_code.co_filename).resolve()
                                           ).startswith(PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


__all__ = ["caller_stacklevel"]
