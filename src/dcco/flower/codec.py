"""Message layouts of the dcco Flower app: what goes in which record.

Plain messages (Message API records):

=============  ==========================================================================
instruction    ConfigRecord ``dcco``: ``phase`` ("stats" | "update"), ``round``, ``clients``,
               ``with_stats`` (stale statistics: send them with the update), S_A's
               ``shared_count``, and ``states_key`` (the run's key for the clients' states
               on a node's disk, ``dcco.flower.node_states``); ArrayRecord ``model`` (the global ``state_dict``) in phase
               "stats" and in a round's only exchange; ArrayRecord ``shared`` (S_A as
               ``mean_<name>`` of the method's ``StatsSpec``) in phase "update"
stats reply    ArrayRecord ``stats`` (``sum_<name>`` of the spec, float64); MetricRecord
               ``stats.meta``: ``count`` (samples)
each client's  under ``train.absent_statistics = "cached"``, phase "stats" only: the same
stats reply    records, each sum stacked over the node's clients in the instruction's order
               (a leading axis), and ``stats.meta``'s ``counts`` (samples per client)
update reply   ArrayRecord ``delta`` (Δ per parameter name); MetricRecord ``update``:
               ``count``, ``loss``; with ``with_stats``, also the stats reply's records
node query     ConfigRecord ``dcco``: ``phase`` = "node" → MetricRecord ``node``:
               ``partition_id``, ``num_partitions``, ``num_clients``
=============  ==========================================================================

Both phases are plain ``train`` messages told apart by ``phase``: Flower's SecAgg+ intercepts
only the ``train`` message type. Under SecAgg+ the payloads travel in Flower's legacy
``FitIns``/``FitRes`` layout that ``secaggplus_mod`` reads (see ``dcco.flower.secagg``).

Every ArrayRecord holds one flat array per dtype and its layout (``array_record``): Flower
moves each array as an object with its own round trips, so a model's tensors travel as one.

Decoding never trusts a reply: a missing record raises ``KeyError``, an array that is not a
numeric NumPy array ``TypeError``/``ValueError``; ``dcco.core.server.accept_valid`` counts both as
malformed replies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from dcco.core.client import ClientUpdate
from dcco.core.server import ReplyError
from dcco.core.stats import EncodingStats, Moments
from dcco.flower.placement import NodeIdentity

Phase = Literal["stats", "update"]
CONFIG = "dcco"
MODEL, SHARED, STATS, DELTA, UPDATE, NODE = "model", "shared", "stats", "delta", "update", "node"
LAYOUT, PACKED = "layout", "packed."
LAYOUT_MAX_BYTES = 1 << 22
"""The largest packed layout read (4 MiB: a model of 10,000 tensors needs about 1 MiB)."""


def tensor_of(array: Array) -> Tensor:
    """A received ``Array`` as a tensor (a writable copy of its NumPy form)."""
    return torch.from_numpy(np.array(array.numpy(), copy=True))


def array_record(tensors: dict[str, Tensor]) -> ArrayRecord:
    """Named tensors → ``ArrayRecord`` of one flat array per dtype (``packed.<dtype>``) and
    their ``layout`` (name, dtype, shape of each, in order, as UTF-8 JSON bytes).

    Flower moves every ``Array`` of a message as an object of its own, with a round trip
    each from SuperNode to SuperLink and again from SuperLink to ServerApp (flwr 1.41/1.42):
    a model's 55 tensors as 55 arrays added seconds to every exchange on loopback."""
    layout, groups = [], {}
    for name, tensor in tensors.items():
        a = tensor.detach().cpu().numpy()
        layout.append([name, a.dtype.str, list(a.shape)])
        groups.setdefault(a.dtype.str, []).append(a.reshape(-1))
    record = {LAYOUT: Array(np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8))}
    for dtype, parts in groups.items():
        record[PACKED + dtype] = Array(np.concatenate(parts))
    return ArrayRecord(record)


def tensors_of(record: ArrayRecord) -> dict[str, Tensor]:
    """The named tensors of ``array_record`` (or of a record of one array per tensor).

    Nothing in the record is trusted: the layout must be UTF-8 JSON in a 1-D uint8 array of
    at most ``LAYOUT_MAX_BYTES``, a list of [name, dtype string, shape of non-negative
    ints], and the packed arrays 1-D and exactly as long as it says.

    Raises:
        ValueError: a malformed layout, or packed arrays that do not match it; TypeError: a
            dtype that is not numeric."""
    if LAYOUT not in record:
        return {k: tensor_of(v) for k, v in record.items()}
    entries = _layout(record[LAYOUT])
    flat = {k[len(PACKED):]: tensor_of(v) for k, v in record.items() if k.startswith(PACKED)}
    if any(t.dim() != 1 for t in flat.values()):
        raise ValueError("malformed packed arrays: each must be 1-D")
    offsets = dict.fromkeys(flat, 0)
    out = {}
    for name, dtype, shape in entries:
        if dtype.kind not in "biuf":
            raise TypeError(f"array {name!r}: dtype {dtype} is not numeric")
        key, size = dtype.str, math.prod(shape)
        if key not in flat or offsets[key] + size > flat[key].numel():
            raise ValueError(f"array {name!r} {shape} of {dtype} is not in the packed arrays")
        out[name] = flat[key][offsets[key]:offsets[key] + size].reshape(shape)
        offsets[key] += size
    if any(offsets[k] != flat[k].numel() for k in flat) or len(out) != len(entries):
        raise ValueError("the packed arrays do not match their layout (sizes or names)")
    return out


def _layout(array: Array) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """The (name, dtype, shape) entries of a packed record's layout (``tensors_of``)."""
    raw = array.numpy()
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size > LAYOUT_MAX_BYTES:
        raise ValueError(f"malformed array layout: a {raw.dtype} array of shape {raw.shape}, "
                         f"not 1-D uint8 of at most {LAYOUT_MAX_BYTES} bytes")
    try:
        layout = json.loads(raw.tobytes().decode())
        entries = []
        for name, dtype, shape in layout:
            if not (isinstance(name, str) and isinstance(dtype, str) and isinstance(shape, list)
                    and all(type(x) is int and x >= 0 for x in shape)):
                raise ValueError(f"entry {[name, dtype, shape]!r} is not [name, dtype, shape]")
            entries.append((name, np.dtype(dtype), tuple(shape)))
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError, RecursionError) as e:
        raise ValueError(f"malformed array layout: {e}") from None
    return entries


@dataclass(frozen=True)
class Instruction:
    """What the server asks of a node in one exchange.

    Attributes:
        phase: "stats" (DCCO's phase 1) or "update" (the local step).
        round: the 0-based round index (keys the augmentation and the stored model).
        clients: the sampled clients the node answers for.
        model: the global ``state_dict``, or None when the node already holds it (DCCO's
            phase 2 uses the model stored in phase 1).
        shared: S_A for the update phase of a method that shares statistics, else None.
        with_stats: the node also returns its fresh statistics with its update (stale
            statistics: they become the next round's S_A).
        states_key: the run's key for the clients' states on a node's disk
            (``dcco.flower.node_states``); "" where the server sends none.
    """

    phase: Phase
    round: int
    clients: tuple[int, ...]
    model: dict[str, Tensor] | None = None
    shared: Moments | None = None
    with_stats: bool = False
    states_key: str = ""


def encode_instruction(ins: Instruction) -> RecordDict:
    config = {"phase": ins.phase, "round": ins.round, "clients": list(ins.clients),
              "with_stats": ins.with_stats}
    if ins.shared is not None:
        config["shared_count"] = float(ins.shared.count)
    if ins.states_key:
        config["states_key"] = ins.states_key
    content = RecordDict({CONFIG: ConfigRecord(config)})
    if ins.model is not None:
        content[MODEL] = array_record(ins.model)
    if ins.shared is not None:
        content[SHARED] = array_record(dict(ins.shared.items()))
    return content


class InstructionError(ValueError):
    """A server instruction this node cannot read; the message says what is wrong."""


def decode_instruction(content: RecordDict) -> Instruction:
    """The server's instruction, checked: anything malformed raises ``InstructionError``
    naming the problem (the ClientApp then answers with an error reply)."""
    try:
        return _decode_instruction(content)
    except InstructionError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise InstructionError(f"malformed instruction from the server: {type(e).__name__}: "
                               f"{e}") from None


def _integer(value: object, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InstructionError(f"malformed instruction from the server: {what} must be an "
                               f"integer >= {low}, got {value!r}")
    return value


def _decode_instruction(content: RecordDict) -> Instruction:
    cfg = content.config_records[CONFIG]
    phase = cfg["phase"]
    if phase not in ("stats", "update"):
        raise InstructionError(f"malformed instruction from the server: unknown phase "
                               f"{phase!r}")
    round_index = _integer(cfg["round"], "round")
    clients = cfg["clients"]
    if not isinstance(clients, list):
        raise InstructionError(f"malformed instruction from the server: clients must be a "
                               f"list, got {clients!r}")
    clients = tuple(_integer(k, "a client id") for k in clients)
    model = tensors_of(content.array_records[MODEL]) if MODEL in content.array_records else None
    shared = None
    if SHARED in content.array_records:
        count = cfg["shared_count"]
        if isinstance(count, bool) or not isinstance(count, (int, float)) or not count > 0:
            raise InstructionError(f"malformed instruction from the server: shared_count must "
                                   f"be a positive number, got {count!r}")
        values = tensors_of(content.array_records[SHARED])
        if not all(v.is_floating_point() and bool(torch.isfinite(v).all())
                   for v in values.values()):
            raise InstructionError("malformed instruction from the server: S_A must hold "
                                   "finite floating-point values")
        shared = Moments(values, count=torch.tensor(float(count), dtype=torch.float64))
    with_stats = cfg.get("with_stats", False)
    if not isinstance(with_stats, bool):
        raise InstructionError(f"malformed instruction from the server: with_stats must be "
                               f"true or false, got {with_stats!r}")
    return Instruction(phase, round_index, clients, model, shared, with_stats,
                       states_key(cfg))


def states_key(cfg: ConfigRecord) -> str:
    """An instruction's ``states_key`` ("" where it has none), checked to be a string."""
    key = cfg.get("states_key", "")
    if not isinstance(key, str):
        raise InstructionError(f"malformed instruction from the server: states_key must be "
                               f"a string, got {key!r}")
    return key


def encode_stats_reply(stats: EncodingStats) -> RecordDict:
    sums = {k: v for k, v in stats.as_dict().items() if k != "count"}
    return RecordDict({STATS: array_record(sums),
                       STATS + ".meta": MetricRecord({"count": int(stats.count.item())})})


def decode_stats_reply(content: RecordDict) -> dict[str, object]:
    """A stats reply as the dict ``dcco.core.server.validate_statistics`` checks."""
    reply: dict[str, object] = tensors_of(content.array_records[STATS])
    reply["count"] = content.metric_records[STATS + ".meta"]["count"]
    return reply


def encode_each_stats_reply(each: Sequence[EncodingStats]) -> RecordDict:
    """Each client's statistics in one reply: every sum stacked over the clients (in the
    instruction's order), and their counts."""
    sums = {k: torch.stack([s[k] for s in each]) for k in each[0] if k != "count"}
    return RecordDict({STATS: array_record(sums), STATS + ".meta": MetricRecord(
        {"counts": [int(s.count.item()) for s in each]})})


def decode_each_stats_reply(content: RecordDict, clients: int) -> list[dict[str, object]]:
    """``encode_each_stats_reply``'s reply as one dict per client that
    ``dcco.core.server.validate_statistics`` checks; it must hold exactly ``clients`` of them.

    Raises:
        ReplyError: (kind ``count``) counts that are not a list of ``clients`` entries, or
            a sum whose leading axis is not of ``clients`` (kind ``shape``)."""
    sums = tensors_of(content.array_records[STATS])
    counts = content.metric_records[STATS + ".meta"]["counts"]
    if not isinstance(counts, list) or len(counts) != clients:
        raise ReplyError("count", f"statistics of {clients} clients asked, the reply's counts "
                                  f"are {counts!r}")
    for name, value in sums.items():
        if value.dim() == 0 or value.shape[0] != clients:
            raise ReplyError("shape", f"{name} has shape {tuple(value.shape)}, not one row "
                                      f"for each of {clients} clients")
    return [{k: v[i] for k, v in sums.items()} | {"count": c} for i, c in enumerate(counts)]


def encode_update_reply(update: ClientUpdate, stats: EncodingStats | None = None) -> RecordDict:
    """An update reply; with ``stats``, the node's fresh statistics travel with it."""
    content = RecordDict({DELTA: array_record(update.delta),
                          UPDATE: MetricRecord({"count": update.num_samples,
                                                "loss": update.loss})})
    if stats is not None:
        for key, record in encode_stats_reply(stats).items():
            content[key] = record
    return content


def decode_update_reply(content: RecordDict) -> tuple[dict[str, Tensor], object, object]:
    """(Δ by parameter name, count, loss) of an update reply, unchecked."""
    meta = content.metric_records[UPDATE]
    return tensors_of(content.array_records[DELTA]), meta["count"], meta["loss"]


def node_query() -> RecordDict:
    return RecordDict({CONFIG: ConfigRecord({"phase": NODE})})


def encode_identity(identity: NodeIdentity) -> RecordDict:
    return RecordDict({NODE: MetricRecord({
        "partition_id": identity.partition_id, "num_partitions": identity.num_partitions,
        "num_clients": identity.num_clients})})


def decode_identity(content: RecordDict) -> NodeIdentity:
    meta = content.metric_records[NODE]
    values = {k: meta[k] for k in ("partition_id", "num_partitions", "num_clients")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        raise TypeError(f"node identity {values} must hold integers")
    return NodeIdentity(**values)
