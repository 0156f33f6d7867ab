"""The clients' kept states on disk (``train.client_state_store = "disk"``): the store of
``dcco.core.client_state`` for runs whose clients' models do not fit in memory.

FedU and FedEMA keep a client's whole model from one round it takes part in to the next. At
the paper's client counts that outgrows the machine: 60,000 one-photo clients, 128 a round,
meet 28,268 distinct clients in 300 rounds, 24.5 GiB in float16 for the `small` network. On
disk, each client's state is one safetensors file in the run directory's
``client_states/live`` (``<client>.safetensors``), read when the client is sampled and
replaced, atomically, when its round ends; the memory it takes is a round's clients'.

Disk. The store takes its live files, plus, between checkpoints, the earlier versions of
the files replaced since the last snapshot and the one before it: up to three versions of a
client that every round samples, about one for a client seen rarely. A run is refused
before it starts where the live files alone would not fit.

Checkpoints. A checkpoint holds no client's tensors, only the number of a snapshot of
``live``: ``state`` hard-links every live file into ``client_states/snapshot-<n>`` (a
link, not a copy: a file that a later round replaces keeps its old content under the
snapshot's name, so the two together take the disk of the files changed since), after
flushing the files to disk. ``from_state`` puts ``live`` back as the checkpoint's snapshot
left it, so a resumed run gives every client the state it had at the checkpoint, to the bit,
as the memory store does. The two newest snapshots are kept: the one the last checkpoint
written names, and the one a checkpoint being written names. Where the file system cannot
link, the snapshot copies.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from dcco.core.client_state import restored, stored
from dcco.errors import UserError
from dcco.tensorfile import write_tensors

SNAPSHOT_KEY = "client_state_disk.snapshot"
"""A checkpoint's key for the number of its snapshot of the store's files."""
SUFFIX = ".safetensors"
SNAPSHOT = re.compile(r"snapshot-(\d+)")


class DiskClientStates:
    """``dcco.core.client_state.ClientStates`` on disk: each client's tensors in a file of
    ``directory/live``, held as ``stored`` holds them (float32 tensors in ``dtype``).

    A new store is empty: it clears ``live`` (what a run that stopped before its first
    checkpoint left there) and keeps the snapshots, for ``from_state``.
    """

    def __init__(self, directory: str | Path, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self.directory = Path(directory)
        self.live = self.directory / "live"
        if self.live.exists():
            shutil.rmtree(self.live)
        self.live.mkdir(parents=True)
        self._clients: set[int] = set()

    def _path(self, client: int) -> Path:
        return self.live / f"{int(client)}{SUFFIX}"

    def __len__(self) -> int:
        return len(self._clients)

    def __contains__(self, client: int) -> bool:
        return int(client) in self._clients

    def get(self, client: int, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict[str, Tensor] | None:
        """Client ``client``'s tensors on ``device`` (those held in the store's dtype in
        ``dtype``), or None for a client never seen."""
        entry = self.held(client)
        return None if entry is None else restored(entry, self.dtype, device, dtype)

    def put(self, client: int, state: Mapping[str, Tensor]) -> None:
        """Keep ``state`` as client ``client``'s, replacing its file (``stored``'s dtypes)."""
        self.hold(client, stored(state, self.dtype))

    def held(self, client: int) -> dict[str, Tensor] | None:
        """Client ``client``'s entry as it is held (read from its file), or None."""
        if int(client) not in self._clients:
            return None
        return load_file(self._path(client))

    def hold(self, client: int, entry: Mapping[str, Tensor]) -> None:
        """Write ``entry``, as a store's ``held`` gave it, as client ``client``'s file."""
        write_tensors(self._path(client), {k: v.contiguous() for k, v in entry.items()},
                      sync=False)  # made durable by the snapshot that a checkpoint names
        self._clients.add(int(client))

    @property
    def nbytes(self) -> int:
        """Bytes of the live files on disk."""
        return sum(self._path(c).stat().st_size for c in self._clients)

    def _snapshots(self) -> dict[int, Path]:
        found = {}
        for path in self.directory.iterdir():
            match = SNAPSHOT.fullmatch(path.name)
            if match and path.is_dir():
                found[int(match.group(1))] = path
        return found

    def state(self) -> dict[str, Tensor]:
        """A snapshot of the live files for a checkpoint, its number as the checkpoint's
        only tensor of the store; the snapshots older than the one before it deleted."""
        snapshots = self._snapshots()
        number = max(snapshots, default=0) + 1
        os.sync()  # the live files' bytes on disk before a checkpoint names them
        partial = self.directory / f".snapshot-{number}.tmp"
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        for client in sorted(self._clients):
            _link(self._path(client), partial / f"{client}{SUFFIX}")
        _sync_directory(partial)
        partial.rename(self.directory / f"snapshot-{number}")
        _sync_directory(self.directory)
        for old, path in snapshots.items():
            if old < number - 1:
                shutil.rmtree(path)
        return {SNAPSHOT_KEY: torch.tensor(number, dtype=torch.int64)}

    def load(self, state: Mapping[str, Tensor]) -> None:
        """The store as the checkpoint ``state`` left it: ``live`` made its snapshot's
        files again, and the snapshots after it (from a checkpoint that was never written)
        deleted.

        Raises:
            UserError: the checkpoint names no snapshot, or one this directory lacks.
        """
        if SNAPSHOT_KEY not in state:
            raise UserError(f"the checkpoint holds no snapshot of the clients' states on "
                             f"disk ({SNAPSHOT_KEY}); was it written with "
                             f"train.client_state_store = 'memory'?")
        number = int(state[SNAPSHOT_KEY])
        snapshots = self._snapshots()
        if number not in snapshots:
            raise UserError(f"the checkpoint's clients' states, snapshot-{number}, are "
                             f"missing from {self.directory}; the run cannot resume them")
        shutil.rmtree(self.live)
        self.live.mkdir()
        clients = set()
        for path in snapshots[number].iterdir():
            if path.name.endswith(SUFFIX):
                _link(path, self.live / path.name)
                clients.add(int(path.name[:-len(SUFFIX)]))
        self._clients = clients
        for later, path in snapshots.items():
            if later > number:
                shutil.rmtree(path)


def bytes_under(directory: Path) -> int:
    """Bytes of the files under ``directory`` (0 if there is none), a file linked under
    several names counted once."""
    seen, total = set(), 0
    for root, _, files in os.walk(directory):
        for name in files:
            info = os.stat(os.path.join(root, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


_copied: list[Path] = []
"""A folder where hard links failed and snapshots copy, once warned about."""


def _link(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source``, or a copy where the file system has none
    (warned once: each snapshot then holds a whole copy of the store)."""
    try:
        os.link(source, target)
    except OSError:
        if not _copied:
            _copied.append(target.parent)
            warnings.warn(f"the file system of {target.parent} makes no hard links: each "
                          f"snapshot of the clients' states is a whole copy, and the store "
                          f"takes up to three times its size on disk", stacklevel=3)
        shutil.copyfile(source, target)


def _sync_directory(path: Path) -> None:
    """Flush a directory's entries (its new names) to disk, where the system allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["SNAPSHOT_KEY", "DiskClientStates", "bytes_under"]
