"""A node's clients' kept states on the node's own disk, so that they outlive the Flower run.

FedU's, FedEMA's and MoCo's clients keep their model (or queue) between the rounds they take
part in. By default a node holds them in its ``context.state``, which Flower keeps for one
run: a run resumed with ``flower.resume = true`` is a new Flower run, and its clients would
start afresh. A SuperNode started with ``--node-config '... client-state-dir="PATH"'`` (or
with ``DCCO_CLIENT_STATE_DIR`` in its environment, where its node config cannot carry the
key) keeps them as files under PATH instead, as a phone keeps its own
model on its own storage: nothing leaves the node, and the server's checkpoint holds none of
them.

Layout: ``PATH/<run key>/<client>.r<round>.safetensors``, the state client ``client`` left
at the end of round ``round`` (0-based), written atomically. The run key comes from the
server with every instruction: a new run gets a new one, and a resumed run keeps its own
(``summary.json``'s ``flower_states_key``), so the states of one run never reach another.

Versions. A resumed run starts again after its last checkpoint, so a client may have states
from rounds that the checkpoint does not hold. A client's round r therefore starts from its
newest state of a round before r, and the round's new state replaces any of round r or
later (left by the run that stopped). The server writes a checkpoint after every
``train.checkpoint_every``-th round (and where a run stops) before it sends the next round,
so when round r reaches a node, the checkpoint of c = ⌊r / checkpoint_every⌋ ×
checkpoint_every rounds is on disk, and a resume starts from it or from a later one: a
client keeps its versions from round c on and the newest before c, and deletes the others.
That is at most ``checkpoint_every`` + 1 files for a client that takes part in every round,
about one for a client seen rarely. The resumed run then gives each client the state it had
at the checkpoint, to the bit, as long as its rounds reach the same nodes (every other
choice of a round is a function of the seed and the round); a node that answered a round
before the stop and misses it after keeps the state it trained, as a device would.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from dcco.core.client_state import restored, stored
from dcco.tensorfile import write_tensors

NODE_CONFIG_KEY = "client-state-dir"
"""The SuperNode's ``--node-config`` key of the folder of its clients' states."""
ENVIRONMENT = "DCCO_CLIENT_STATE_DIR"
"""The same folder from the node's environment, where the node config has no such key."""
SUFFIX = ".safetensors"
_VERSION = re.compile(r"(\d+)\.r(\d+)" + re.escape(SUFFIX))
_KEY = re.compile(r"[0-9a-zA-Z_-]{1,64}")


def new_states_key() -> str:
    """A new run's key for its clients' states (random: two runs never share one)."""
    return uuid.uuid4().hex


class StateFolderError(ValueError):
    """A node's state folder that cannot be used; the message names the fix."""


def state_folder(node_config: Mapping[str, object]) -> Path | None:
    """The node's folder of its clients' states, or None (they live in ``context.state``).

    Raises:
        StateFolderError: the configured value is not a non-empty path.
    """
    where = f"the node's {NODE_CONFIG_KEY}"
    value = node_config.get(NODE_CONFIG_KEY)
    if value is None:
        where, value = ENVIRONMENT, os.environ.get(ENVIRONMENT)
        if value is None:
            return None
    if not isinstance(value, str) or not value.strip():
        raise StateFolderError(f"{where} must be a folder path, got {value!r}")
    return Path(value).expanduser().absolute()


class FolderStates:
    """The states of a node's clients in one run, as versioned files (the module's layout).

    Args:
        root: the node's ``client-state-dir``.
        run_key: the server's key of the run (letters, digits, ``-`` and ``_``).
        round_index: the round the node is answering (0-based).
        checkpoint_every: the run's ``train.checkpoint_every``.
        dtype: how float32 tensors are held (``train.client_state_dtype``).
    """

    def __init__(self, root: Path, run_key: str, round_index: int, checkpoint_every: int,
                 dtype: torch.dtype = torch.float32) -> None:
        if not _KEY.fullmatch(run_key):
            raise StateFolderError(
                f"the server sent no usable run key for the clients' states ({run_key!r}) "
                f"while this node keeps them in {root}; is the server an older dcco?")
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.folder = Path(root) / run_key
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateFolderError(f"the node's {NODE_CONFIG_KEY} {root} cannot hold the "
                                   f"clients' states: {e}") from None
        self.round, self.dtype = round_index, dtype
        self.checkpointed = round_index // checkpoint_every * checkpoint_every
        """Rounds done at the newest checkpoint that is surely on disk."""

    def versions(self, client: int) -> list[int]:
        """The rounds of client ``client``'s files, oldest first."""
        found = []
        for path in self.folder.glob(f"{int(client)}.r*{SUFFIX}"):
            match = _VERSION.fullmatch(path.name)
            if match and int(match.group(1)) == int(client):
                found.append(int(match.group(2)))
        return sorted(found)

    def _path(self, client: int, round_index: int) -> Path:
        return self.folder / f"{int(client)}.r{int(round_index)}{SUFFIX}"

    def get(self, client: int, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict[str, Tensor] | None:
        """Client ``client``'s newest state from a round before this one, or None."""
        earlier = [r for r in self.versions(client) if r < self.round]
        if not earlier:
            return None
        return restored(load_file(self._path(client, earlier[-1])), self.dtype, device,
                        dtype)

    def put(self, client: int, state: Mapping[str, Tensor]) -> None:
        """Keep ``state`` as client ``client``'s at the end of this round; its versions of
        later rounds (a stopped run's), and those before the newest checkpoint's but the
        newest of them, deleted."""
        held = stored(state, self.dtype)
        try:
            write_tensors(self._path(client, self.round),
                          {k: v.contiguous() for k, v in held.items()})
        except OSError as e:
            raise StateFolderError(f"client {client}'s state cannot be written to "
                                   f"{self.folder}: {e}") from None
        versions = self.versions(client)
        later = [r for r in versions if r > self.round]
        before = [r for r in versions if r < self.checkpointed]
        for r in later + before[:-1]:
            self._path(client, r).unlink(missing_ok=True)


__all__ = ["ENVIRONMENT", "NODE_CONFIG_KEY", "FolderStates", "StateFolderError",
           "new_states_key", "state_folder"]
