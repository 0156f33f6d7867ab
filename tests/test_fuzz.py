"""Every message the server and a client decode, fuzzed with hypothesis.

The server's side: statistics replies and update replies (with or without the statistics of
stale mode), built valid and then broken in generated ways (missing records and keys, wrong
dtypes and shapes, truncated and oversized arrays, NaN, Inf and huge values, bad counts and
losses, foreign records, a garbled packing layout or a packed array cut short). Each one goes through the checks the federation applies
(``accept_valid`` with the codec and ``dcco.core.server``): the server never crashes, a valid
reply is accepted, and a broken one is rejected and counted under a known kind. The client's
side: instructions broken the same ways are either read or refused with ``InstructionError``,
never another exception. 600 examples per test (2,400 in all; each of the 17 ways to break
a reply is drawn about 35 times a test), or ``DCCO_FUZZ_EXAMPLES`` per test for a longer
search (e.g. ``DCCO_FUZZ_EXAMPLES=10000 pytest tests/test_fuzz.py``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcco.core.client import ClientUpdate
from dcco.core.server import REJECTION_KINDS, ReplyTally, accept_valid, validate_statistics
from dcco.core.stats import CCO_STATS, VICREG_STATS, encoding_stats
from dcco.flower import codec
from dcco.flower.app.wire import validate_update_reply

D = 4
SHAPES = {"w": (3, 2), "b": (3,)}
EXAMPLES = settings(max_examples=int(os.environ.get("DCCO_FUZZ_EXAMPLES", "600")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
BAD_VALUES = [float("nan"), float("inf"), -float("inf"), 1e300, -1e15]


def _stats(spec, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return encoding_stats(torch.randn(3, D, generator=gen), torch.randn(3, D, generator=gen),
                          spec)


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """A reply's arrays by name (they travel packed: ``codec.array_record``)."""
    return {k: np.array(v.numpy(), copy=True) for k, v in codec.tensors_of(record).items()}


def _packed(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return codec.array_record({k: torch.from_numpy(np.ascontiguousarray(v))
                               for k, v in arrays.items()})


@st.composite
def mutation(draw, keys: list[str]):
    """One way to break a reply: (what, key, parameter)."""
    what = draw(st.sampled_from([
        "none", "drop_key", "drop_record", "int_dtype", "bool_dtype", "truncate", "extend",
        "reshape", "bad_value", "bad_count", "bad_loss", "foreign_record", "empty",
        "object_count", "scalar_array", "garbled_layout", "short_packed"]))
    key = draw(st.sampled_from(keys))
    value = draw(st.sampled_from(BAD_VALUES))
    # (Flower's MetricRecord itself refuses booleans and integers beyond 64 bits)
    count = draw(st.sampled_from([0, -3, 2.5, 1 << 40, float("nan"), -(1 << 62)]))
    return what, key, value, count


def _mutate(content: RecordDict, array_record: str, meta_record: str, m) -> RecordDict:
    what, key, value, count = m
    arrays = _arrays(content.array_records[array_record])
    meta = dict(content.metric_records[meta_record])
    out = RecordDict({k: v for k, v in content.items()
                      if k not in (array_record, meta_record)})
    if what == "drop_record":
        out[meta_record] = MetricRecord(meta)
        return out
    if what == "empty":
        return RecordDict({})
    if what == "drop_key":
        arrays.pop(key, None)
    elif what == "int_dtype":
        arrays[key] = arrays[key].astype(np.int64)
    elif what == "bool_dtype":
        arrays[key] = arrays[key] > 0
    elif what == "truncate":
        arrays[key] = arrays[key].ravel()[:-1]
    elif what == "extend":
        arrays[key] = np.concatenate([arrays[key].ravel(), np.zeros(100_000)])
    elif what == "reshape":
        arrays[key] = arrays[key].reshape(-1, 1)
    elif what == "scalar_array":
        arrays[key] = np.array(1.0)
    elif what == "bad_value":
        arrays[key] = arrays[key].astype(np.float64)
        arrays[key].ravel()[0] = value
    elif what == "bad_count":
        meta["count"] = count if not isinstance(count, float) or np.isfinite(count) else 1.5
    elif what == "bad_loss" and "loss" in meta:
        meta["loss"] = value if np.isfinite(value) else 1e300
    elif what == "foreign_record":
        out["intruder"] = ConfigRecord({"x": 1})
        arrays["unexpected"] = np.zeros(3)
    elif what == "object_count":
        meta["count"] = "three"
    packed = _packed(arrays)
    if what == "garbled_layout":  # the packing itself broken: its layout, or its arrays
        packed[codec.LAYOUT] = Array(np.frombuffer(b"\xff[not json", dtype=np.uint8))
    elif what == "short_packed":
        name = next(k for k in packed if k.startswith(codec.PACKED))
        packed[name] = Array(packed[name].numpy()[:-1].copy())
    out[array_record] = packed
    out[meta_record] = MetricRecord(meta) if what != "object_count" else ConfigRecord(meta)
    return out


def _check(outcome: list, tally: ReplyTally, broken: bool) -> None:
    assert tally.accepted + sum(tally.rejected.values()) == 1
    assert set(tally.rejected) <= set(REJECTION_KINDS)
    if not broken:
        assert tally.accepted == 1 and len(outcome) == 1


@pytest.mark.parametrize("spec", [CCO_STATS, VICREG_STATS], ids=["cco", "vicreg"])
@EXAMPLES
@given(data=st.data(), seed=st.integers(0, 3))
def test_fuzz__statistics_replies(spec, data, seed):
    m = data.draw(mutation(list(spec.sum_names)))
    content = _mutate(codec.encode_stats_reply(_stats(spec, seed)), codec.STATS,
                      codec.STATS + ".meta", m)
    tally = ReplyTally()
    out = accept_valid([content], lambda c: validate_statistics(
        codec.decode_stats_reply(c), D, D, spec=spec), tally)
    _check(out, tally, broken=m[0] not in ("none", "bad_loss", "foreign_record"))


@EXAMPLES
@given(m=mutation(["w", "b"]), with_stats=st.booleans(), seed=st.integers(0, 3))
def test_fuzz__update_replies(m, with_stats, seed):
    gen = torch.Generator().manual_seed(seed)
    update = ClientUpdate({k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}, 3, 1.5)
    stats = _stats(CCO_STATS, seed) if with_stats else None
    content = _mutate(codec.encode_update_reply(update, stats), codec.DELTA, codec.UPDATE, m)
    tally = ReplyTally()
    out = accept_valid([content], lambda c: validate_update_reply(c, SHAPES, D,
                                                    CCO_STATS if with_stats else None), tally)
    _check(out, tally, broken=m[0] not in ("none", "foreign_record"))


@st.composite
def instruction(draw):
    """A server instruction, valid or broken in one generated way."""
    config = {"phase": draw(st.sampled_from(["stats", "update", "node", "", 3])),
              "round": draw(st.sampled_from([0, 7, -1, 2.5, "1", True])),
              "clients": draw(st.sampled_from([[1, 2], [], [-1], [1.5], "1,2", [True]])),
              "with_stats": draw(st.sampled_from([False, True, 1, "yes"]))}
    if draw(st.booleans()):
        config["shared_count"] = draw(st.sampled_from([12.0, 0.0, -1.0, float("nan"), "x"]))
    drop = draw(st.sampled_from([None, "phase", "round", "clients"]))
    if drop:
        config.pop(drop)
    content = RecordDict({codec.CONFIG: ConfigRecord(config)} if draw(st.booleans()) else {})
    if draw(st.booleans()):
        values = draw(st.sampled_from([np.zeros(D), np.full(D, np.nan), np.arange(D),
                                       np.zeros((D, 2))]))
        content[codec.SHARED] = ArrayRecord({"mean_f": Array(np.asarray(values))})
    if draw(st.booleans()):
        content[codec.MODEL] = ArrayRecord({"w": Array(np.zeros((3, 2)))})
    return content


@EXAMPLES
@given(content=instruction())
def test_fuzz__instructions_are_read_or_refused_clearly(content):
    try:
        ins = codec.decode_instruction(content)
    except codec.InstructionError as e:
        assert str(e).startswith("malformed instruction from the server")
    else:
        assert ins.phase in ("stats", "update") and ins.round >= 0
        assert all(isinstance(k, int) and k >= 0 for k in ins.clients)
        assert ins.shared is None or float(ins.shared.count) > 0
