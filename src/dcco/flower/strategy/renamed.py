"""``DCCO``, the strategy's first name: ``DCCOStrategy`` with a warning, by every import path
(``DCCO`` names the method)."""

from __future__ import annotations

import warnings

from dcco.callers import caller_stacklevel
from dcco.flower.strategy.strategy import DCCOStrategy


def renamed_strategy(path: str) -> type[DCCOStrategy]:
    """``DCCOStrategy``, with a ``DeprecationWarning`` that ``path`` is its old name."""
    warnings.warn(f"{path} is now dcco.flower.DCCOStrategy (DCCO also names the method); "
                  f"the old name goes in a later release", DeprecationWarning,
                  stacklevel=caller_stacklevel())
    return DCCOStrategy


__all__ = ["renamed_strategy"]
