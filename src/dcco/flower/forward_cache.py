"""Phase 1's forwards that a node's process keeps for its phase 2 (``answer(reuse_forward=
True)``): an object with a memory bound and an eviction rule, one a process."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

KEPT_BYTES = 1 << 30
"""The default bound: the most activation bytes the kept forwards of a process hold
together (1 GiB)."""
EVICTIONS = ("oldest", "largest")


@dataclass
class ForwardCache:
    """Phase 1's forward of each node a process answered, with its two views, by a key
    whose first part is the node (``answer``'s: node id, run id, round, views seed), for
    that node's phase 2 if it reaches the same process; elsewhere phase 2 encodes again.

    A node keeps at most one forward (a new round's replaces its earlier ones); a forward
    larger than ``max_bytes`` alone is not kept; past the bound, forwards are dropped in the
    order ``evict`` says: ``"oldest"`` first (a node that failed between its phases leaves
    one behind, and it is the oldest), or ``"largest"`` first (more nodes keep theirs).

    >>> import torch
    >>> from types import SimpleNamespace
    >>> cache = ForwardCache(max_bytes=100)
    >>> x = torch.zeros(1)
    >>> cache.put((1, 0, 1, 7), SimpleNamespace(saved_bytes=60), x, x)
    >>> cache.put((2, 0, 1, 7), SimpleNamespace(saved_bytes=60), x, x)  # over 100: node 1 goes
    >>> cache.keys(), cache.saved_bytes
    ([(2, 0, 1, 7)], 60)
    """

    max_bytes: int = KEPT_BYTES
    evict: str = "oldest"
    _entries: dict[Hashable, tuple[Any, Tensor, Tensor]] = field(default_factory=dict,
                                                                 repr=False)

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {self.max_bytes}")
        if self.evict not in EVICTIONS:
            raise ValueError(f"evict must be one of {', '.join(EVICTIONS)}, got {self.evict!r}")

    @property
    def saved_bytes(self) -> int:
        """What the kept forwards hold together."""
        return sum(kept.saved_bytes for kept, _, _ in self._entries.values())

    def keys(self) -> list[Hashable]:
        """The keys kept, oldest first."""
        return list(self._entries)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: tuple, kept: Any, x1: Tensor, x2: Tensor) -> None:
        """Keep ``kept`` (a ``KeptForward``: its ``saved_bytes``) and its views under
        ``key``, dropping the node's earlier forwards, then others past the bound."""
        for old in [k for k in self._entries if k[0] == key[0]]:
            del self._entries[old]
        if kept.saved_bytes <= self.max_bytes:
            self._entries[key] = (kept, x1, x2)
        while self.saved_bytes > self.max_bytes:
            order = (next(iter(self._entries)) if self.evict == "oldest" else
                     max(self._entries, key=lambda k: self._entries[k][0].saved_bytes))
            del self._entries[order]

    def pop(self, key: Hashable) -> tuple[Any, Tensor, Tensor] | None:
        """The forward kept under ``key`` (and forget it), or None."""
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


__all__ = ["EVICTIONS", "KEPT_BYTES", "ForwardCache"]
