"""What a client keeps between the rounds it takes part in (FedU, FedEMA: its own online
network, predictor and target network), held for it by the simulator.

A real client keeps its model on its device; the simulator keeps it for the clients that
have taken part, in one store, on the CPU. A client never seen has no entry and starts from
the global model. The store is saved whole in every checkpoint, so a resumed run gives
every client back the state it had at the checkpoint, to the bit.

Memory: one entry holds the client's tensors (``state_bytes``), for each client a run's
rounds sample (``dcco.run.sampling.clients_seen``: the plan is a function of the seed, so the
count is exact); a run whose store would pass ``MAX_STATE_BYTES`` is refused before it
starts (``dcco.run.pretraining``), and float16 entries (``train.client_state_dtype``) halve
it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dcco.tensorfile import Stacked

MAX_STATE_BYTES = 8 << 30
"""The largest store a run may plan for: beyond it the run is refused."""

PREFIX = "client_state."
"""The store's keys in a checkpoint: ``client_state.<group>.<name>`` (``ClientStates.state``)."""
CLIENTS = "clients"
"""A group's client ids in a checkpoint: ``client_state.<group>.clients``."""

DTYPES = {"float32": torch.float32, "float16": torch.float16}
"""``train.client_state_dtype``: how the store holds each client's floating tensors."""


@dataclass(frozen=True)
class Layout:
    """Which of a BYOL dual encoder's parameters are which, by name: what a stateful client
    mixes, keeps and follows.

    Attributes:
        online: the online network's trainable parameters (backbone and projector).
        predictor: the predictor's (none for MoCo).
        target: (target name, online name) of each target-network parameter, which follows
            its online parameter by BYOL's moving average.
    """

    online: tuple[str, ...]
    predictor: tuple[str, ...]
    target: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, model: nn.Module) -> Layout:
        """The layout of a dual encoder with a predictor and a target network
        (``dcco.models.DualEncoder.target_pairs``)."""
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        predictor = tuple(n for n in names if n.startswith("predictor."))
        if getattr(model, "target", None) is None:
            raise ValueError("a stateful client needs a dual encoder with a target network "
                             "(BYOL's, MoCo's key encoder)")
        trained = set(names)  # a frozen online parameter's target never moves from it
        return cls(tuple(n for n in names if not n.startswith("predictor.")), predictor,
                   tuple((t, o) for t, o in model.target_pairs() if o in trained))


@dataclass(frozen=True)
class ClientStart:
    """Where a stateful client starts its round (a method's ``client_start``).

    Attributes:
        weights: by parameter name, the client's trainable parameters and target network at
            the round's start.
        keep: what the method carries in the client's state besides (FedEMA's λ, MoCo's
            queue), for its ``client_end``.
        method: the method the client's local steps optimise, when it is not the run's
            own (MoCo's, holding the client's queue); None: the run's.
    """

    weights: dict[str, Tensor]
    keep: dict[str, Tensor]
    method: object | None = None


@dataclass(frozen=True)
class RoundStates:
    """What a round's stateful clients need from the simulator.

    Attributes:
        clients: the round's client ids, in the order of its segments.
        store: every client's kept state; the round's clients' entries are replaced.
        target_decay: τ of the target network's average after each local step this round.
        round_index: the round (from 0), for a method whose start depends on when the
            client last trained (FedEMA's ``loss.fedema_mix = "selective"``).
    """

    clients: list[int]
    store: ClientStates
    target_decay: float
    round_index: int


def kept_by_clients(model: nn.Module, method: object) -> set[str]:
    """The arrays that the server's messages leave out: for FedU, FedEMA and MoCo, whose
    clients keep their own target network or restart it from the global online one
    (``dcco.core.client.stateful_update``), the target of each trained parameter; none for
    the other methods."""
    if not getattr(method, "stateful", False):
        return set()
    return {t for t, _ in Layout.of(model).target}


def with_kept(model: nn.Module, weights: Mapping[str, Tensor], kept: set[str]
              ) -> dict[str, Tensor]:
    """The server's ``weights`` with the node model's own values of the ``kept`` arrays
    they leave out (``kept_by_clients``; the clients' rounds overwrite them)."""
    own = model.state_dict()
    return {k: own[k] for k in kept if k not in weights} | dict(weights)


def state_bytes(shapes: Mapping[str, torch.Size], dtype: torch.dtype) -> int:
    """Bytes of one entry of tensors of ``shapes`` held in ``dtype``."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(int(torch.Size(s).numel()) for s in shapes.values()) * size


def stored(state: Mapping[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """A client's state as it is held: on the CPU, float32 tensors in ``dtype``, float64
    ones (a method's scalars) and the others as they are, each a copy."""
    return {k: (v.detach().to("cpu", dtype) if v.dtype == torch.float32
                else v.detach().to("cpu")).clone()
            for k, v in state.items()}


def restored(entry: Mapping[str, Tensor], held: torch.dtype, device: torch.device | str,
             dtype: torch.dtype) -> dict[str, Tensor]:
    """A held state (``stored`` in ``held``) for a client's round: on ``device``, the
    tensors held in ``held`` in ``dtype``."""
    return {k: v.to(device, dtype) if v.dtype == held else v.to(device)
            for k, v in entry.items()}


class ClientStates:
    """Each client's own tensors, by client id, for the clients that have taken part.

    Args:
        dtype: how floating tensors are held (float32: exactly as the client left them;
            float16: half the memory, each value rounded once when stored).
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self._entries: dict[int, dict[str, Tensor]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, client: int) -> bool:
        return int(client) in self._entries

    def get(self, client: int, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict[str, Tensor] | None:
        """Client ``client``'s tensors on ``device`` (those held in the store's dtype in
        ``dtype``), or None for a client never seen."""
        entry = self._entries.get(int(client))
        return None if entry is None else restored(entry, self.dtype, device, dtype)

    def put(self, client: int, state: Mapping[str, Tensor]) -> None:
        """Keep ``state`` as client ``client``'s (a copy on the CPU, float32 tensors in the
        store's dtype; float64 ones, a method's scalars, as they are), replacing what it
        had."""
        self._entries[int(client)] = stored(state, self.dtype)

    def held(self, client: int) -> dict[str, Tensor] | None:
        """Client ``client``'s entry as it is held (no copy), or None."""
        return self._entries.get(int(client))

    def hold(self, client: int, entry: Mapping[str, Tensor]) -> None:
        """Hold ``entry``, as another store's ``held`` gave it, as client ``client``'s."""
        self._entries[int(client)] = dict(entry)

    @property
    def nbytes(self) -> int:
        """Bytes the store holds now."""
        return sum(v.numel() * v.element_size() for e in self._entries.values()
                   for v in e.values())

    def state(self) -> dict[str, Tensor | Stacked]:
        """The store as named tensors for a checkpoint: the clients whose entries hold the
        same names, dtypes and shapes (in any order) in one group, each tensor stacked over
        the group's clients (``client_state.<group>.<name>``, the ids in
        ``client_state.<group>.clients``): a few dozen tensors for thousands of clients,
        where a tensor a client's name would outgrow the checkpoint's header. The stacks are
        ``Stacked``: the entries themselves, written row by row (``dcco.tensorfile``), not
        a copy of the store."""
        groups: dict[tuple, list[int]] = {}
        for client, entry in sorted(self._entries.items()):
            shape = tuple(sorted((k, str(v.dtype), tuple(v.shape)) for k, v in entry.items()))
            groups.setdefault(shape, []).append(client)
        out = {}
        for g, (shape, clients) in enumerate(groups.items()):
            out[f"{PREFIX}{g}.{CLIENTS}"] = torch.tensor(clients, dtype=torch.int64)
            for name, _, _ in shape:
                out[f"{PREFIX}{g}.{name}"] = Stacked(tuple(self._entries[c][name]
                                                            for c in clients))
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Tensor | Stacked],
                   dtype: torch.dtype = torch.float32) -> ClientStates:
        """The store saved in ``state`` (empty when it holds none), read a stacked tensor at
        a time: from a checkpoint's lazy mapping (``dcco.run.checkpoint.checkpoint_state``)
        it holds the store and one tensor of it at most."""
        store = cls(dtype)
        groups: dict[int, list[str]] = {}
        for key in state:
            if not key.startswith(PREFIX):
                continue
            group, _, name = key[len(PREFIX):].partition(".")
            if not group.isdigit() or not name:
                raise ValueError(f"checkpoint key {key!r} is not {PREFIX}<group>.<name>")
            groups.setdefault(int(group), []).append(name)
        for g, names in sorted(groups.items()):
            if CLIENTS not in names:
                raise ValueError(f"checkpoint group {PREFIX}{g} needs its {CLIENTS} and one "
                                 f"row of each tensor a client")
            clients = state[f"{PREFIX}{g}.{CLIENTS}"]
            clients = (clients.tensor() if isinstance(clients, Stacked) else clients).tolist()
            entries = [store._entries.setdefault(int(c), {}) for c in clients]
            for name in names:
                if name == CLIENTS:
                    continue
                stacked = state[f"{PREFIX}{g}.{name}"]
                if stacked.shape[:1] != (len(clients),):
                    raise ValueError(f"checkpoint group {PREFIX}{g} needs its {CLIENTS} and "
                                     f"one row of each tensor a client")
                rows = stacked.rows if isinstance(stacked, Stacked) else stacked
                for entry, row in zip(entries, rows, strict=True):
                    entry[name] = row.to("cpu").clone()
                del stacked, rows  # one stacked tensor at a time
        return store


__all__ = ["DTYPES", "MAX_STATE_BYTES", "ClientStart", "ClientStates", "Layout", "RoundStates",
           "kept_by_clients", "restored", "state_bytes", "stored", "with_kept"]
