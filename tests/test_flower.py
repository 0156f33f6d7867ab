"""The Flower app, in process: the real ClientApp (mods included) behind an in-process grid.

Messages are built and decoded by the app's codec and deep-copied both ways, as the network
would; the ``tamper`` hook of ``InProcessGrid`` makes nodes fail, vanish or send malformed
replies. The deployment through a real SuperLink is in ``test_flower_loopback.py``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import numpy as np
import pytest
import torch
from flwr.app import Array, Error, Message
from flwr.common.constant import ErrorCode
from helpers.client_tables import make_ham10000

from dcco.cli import main
from dcco.config import ConfigError, load_config
from dcco.core.client import client_statistics, client_update, trainable_parameters
from dcco.core.optim import apply_pseudo_gradient, set_lr
from dcco.core.server import aggregate_updates
from dcco.core.simulator import run_round
from dcco.core.stats import merge
from dcco.flower import secagg
from dcco.flower.app.client_app import app as client_app
from dcco.flower.app.federation import Federation
from dcco.flower.app.nodes import client_views, node_data, node_update
from dcco.flower.app.run import run_federated
from dcco.flower.appconfig import FlowerConfig, parse_run_config, run_config_entries
from dcco.flower.codec import CONFIG, DELTA, STATS, UPDATE, array_record, tensors_of
from dcco.flower.placement import node_partition
from dcco.flower.testing.inprocess import InProcessGrid, Tamper
from dcco.models import build_dual_encoder
from dcco.run.checkpoint import load_checkpoint
from dcco.run.planning import plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.setup import projector
from dcco.run.splits import load_splits

ROOT = Path(__file__).resolve().parents[1]
NODES = 3


@pytest.fixture
def make_federation(tiny_config):
    """make_federation(method, fcfg, tamper, overrides) → (cfg, pt, fed): a float64 run on
    the tiny data, its training state, and a federation of ``NODES`` in-process nodes."""

    def make(method: str = "dcco", fcfg: FlowerConfig | None = None,
             tamper: Tamper | None = None, overrides: tuple[str, ...] = ()):
        cfg = load_config(tiny_config(method=method, rounds=3), [
            'train.precision="float64"', 'train.compile="off"', 'train.backend="reference"',
            "train.clients_per_round=12",
            'optim.optimizer="lars"', "optim.lr=0.5", *overrides])
        fcfg = fcfg or FlowerConfig(min_nodes=NODES)
        train, _ = load_splits(cfg)
        grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": NODES}
                                          for i in range(NODES)],
                             run_config_entries(cfg, fcfg), tamper=tamper)
        pt = Pretraining.of(cfg, train)
        fed = Federation(grid, pt, fcfg)
        fed.wait_for_nodes()
        return cfg, pt, fed

    yield make
    node_data.cache_clear()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def dict_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max |a − b| over all tensors, relative to max |b| over all tensors (a parameter whose
    exact value is 0, such as the last bias's CCO gradient, holds only rounding noise)."""
    assert set(a) == set(b)
    scale = max(float(v.abs().max()) for v in b.values())
    return max(float((a[k] - b[k]).abs().max()) for k in b) / scale


def params_err(a: Pretraining, b: Pretraining, gradient: dict | None = None) -> float:
    """``dict_err`` of the two models' parameters; with the round's ``gradient``, over the
    parameters whose gradient is not zero up to rounding: LARS steps by η‖w‖/‖g‖·g, which
    turns a zero gradient's rounding noise (a residual branch behind a zero-initialised norm
    gain) into a step of full size, different in every summation order."""
    keep = [k for k, _ in a.params]
    if gradient is not None:
        top = max(float(g.abs().max()) for g in gradient.values())
        keep = [k for k in keep if float(gradient[k].abs().max()) > 1e-12 * top]
    pa, pb = dict(a.params), dict(b.params)
    return dict_err({k: pa[k].detach() for k in keep}, {k: pb[k].detach() for k in keep})


def phase_of(instruction: Message) -> str:
    return instruction.content.config_records[CONFIG]["phase"]


def expected_round(pt: Pretraining, fed: Federation, r: int, stats_nodes: set[int],
                   update_nodes: set[int]):
    """S_A over the clients of ``stats_nodes`` and the pseudo-gradient over the clients of
    ``update_nodes``, computed client by client with the library's client functions."""
    targets, _ = fed.targets(r)
    data = node_data(pt.cfg)
    views = {k: client_views(pt.cfg, data, k, r) for c in targets.values() for k in c}
    shared = None
    if pt.method.needs_statistics:
        shared = merge([client_statistics(pt.model, *views[k])
                        for n in stats_nodes for k in targets[n]]).moments()
    updates = [client_update(pt.model, pt.method, *views[k], shared, pt.cfg.train.local_lr)
               for n in update_nodes for k in targets[n]]
    return shared, aggregate_updates(updates, dict(trainable_parameters(pt.model)))


# ---------------------------------------------------------------------- equivalence


TWO_TOWERS = ('data.dataset="fashion_mnist_halves"', "model.shared=false",
              "model.y_widths=[4, 4, 8]")
"""Two-view data (the tiny images' left and right halves), each half with its own tower."""


@pytest.mark.parametrize("method,overrides", [
    ("dcco", ()), ("cco_fedavg", ()), ("contrastive_fedavg", ()), ("byol_fedavg", ()),
    ("dcco", TWO_TOWERS), ("clip_fedavg", TWO_TOWERS), ("fedsc", ())],
    ids=["dcco", "cco_fedavg", "contrastive_fedavg", "byol_fedavg", "dcco-two-towers",
         "clip_fedavg-two-towers", "fedsc"])
def test_flower_rounds_equal_the_reference_backend(make_federation, method, overrides):
    """Same clients, same seed: the Flower handlers give the simulator's aggregated statistics,
    pseudo-gradient and new model (server optimiser LARS), round after round. BYOL's second
    round needs the server's moved target network at the clients. With paired data both
    towers travel as the model and the nodes hold pairs."""
    cfg, pt, fed = make_federation(method, overrides=overrides)
    assert pt.model.shared == (not overrides)
    _assert_rounds_equal(cfg, pt, fed, method)


def test_flower_rounds_over_natural_clients_equal_the_reference_backend(make_federation,
                                                                         tmp_path):
    """Lesions of 1–6 images (a generated HAM10000) as the run's clients: each node hosts
    the lesions of its partition id, and the rounds are the simulator's."""
    ham = make_ham10000(tmp_path / "ham", lesions=60)
    cfg, pt, fed = make_federation("dcco", overrides=(
        'data.dataset="ham10000"', f'data.data_dir="{ham}"', 'data.partition="natural"',
        "table.image_size=[12, 12]"))
    sizes = pt.partition.sizes
    assert int(sizes.min()) == 1 and int(sizes.max()) >= 4
    _assert_rounds_equal(cfg, pt, fed, "dcco")


def _assert_rounds_equal(cfg, pt: Pretraining, fed: Federation, method: str) -> None:
    train, _ = load_splits(cfg)
    ref = Pretraining.of(cfg, train)
    for r in range(2):
        plan = plan_round(cfg, ref.partition, r)
        x1, x2 = ref.views(plan, r)
        sizes = plan.segments.counts.tolist()
        expected = run_round(ref.model, ref.method, x1, x2, plan.segments, "reference", 1.0)
        views = zip(torch.split(x1, sizes), torch.split(x2, sizes))
        spec = ref.method.stats
        pooled = (merge([client_statistics(ref.model, a, b, spec) for a, b in views]).moments()
                  if spec is not None else None)
        agg = fed.step()
        ref.step()
        assert agg.skipped is None
        assert (agg.clients, agg.samples) == (expected.num_clients, expected.num_samples)
        assert agg.loss == pytest.approx(expected.loss, rel=1e-9)
        if pooled is not None:
            assert set(agg.shared) == set(pooled)
            for name in pooled:
                assert rel_err(getattr(agg.shared, name), getattr(pooled, name)) < 1e-12, name
        else:
            assert agg.shared is None
        assert dict_err(agg.pseudo_gradient, expected.pseudo_gradient) < 1e-9
        assert params_err(pt, ref, expected.pseudo_gradient) < 1e-9
        if method == "byol_fedavg":
            assert dict_err(dict(pt.model.target.named_parameters()),
                            dict(ref.model.target.named_parameters())) < 1e-9


@pytest.mark.parametrize("method", ["fedu", "fedema", "moco_fedavg"])
def test_flower_stateful_rounds__equal_the_simulators_and_nodes_keep_the_clients_state(
        make_federation, method):
    """FedU, FedEMA and MoCo over dcco's Flower app: each node keeps its clients' states in
    its context.state, and three rounds of 4 of 6 clients (most of them come back) give the
    simulator's model, and on the nodes the simulator's store, client by client."""
    from dcco.flower.app.nodes import CLIENT_STATE
    from dcco.flower.codec import tensors_of

    cfg, pt, fed = make_federation(method, overrides=(
        "data.num_clients=6", "train.clients_per_round=4", "train.local_steps=2",
        "train.local_lr=0.05", 'optim.optimizer="sgd"', "optim.lr=1.0", "loss.moco_queue=5"))
    train, _ = load_splits(cfg)
    ref = Pretraining.of(cfg, train)
    whole = sum(v.numel() * v.element_size() for v in pt.model.state_dict().values())
    target = sum(p.numel() * p.element_size() for n, p in pt.model.named_parameters()
                 if n.startswith("target."))
    for _ in range(3):
        agg = fed.step()
        metrics = ref.step()
        assert agg.skipped is None
        assert agg.loss == pytest.approx(float(metrics.loss), rel=1e-9)
        assert params_err(pt, ref) < 1e-9
        # the server's target network is not sent: the clients keep or restart their own
        assert target > 0 and whole - target < agg.traffic["per_node_down"] < whole
    held = {}
    for context in fed.grid.contexts.values():
        for key, record in context.state.array_records.items():
            if key.startswith(CLIENT_STATE):
                held[int(key[len(CLIENT_STATE):])] = tensors_of(record)
    assert len(held) == len(ref.client_states) > 4
    for client, state in held.items():
        expected = ref.client_states.get(client, dtype=torch.float64)
        assert set(state) == set(expected)
        assert dict_err(state, expected) < 1e-9


CACHED = ('train.absent_statistics="cached"',)
"""FedSC's cache of absent clients: 12 of the tiny data's 150 clients a round."""


def test_fedsc_cache_of_absent_clients__flower_rounds_equal_the_simulators(make_federation):
    """FedSC's partial participation over Flower: each node sends its clients' statistics one
    by one, the server keeps every client's last ones, and two rounds give the simulator's
    model and cache (float64; ``params_err`` says why the parameters without a gradient are
    left out). Negative control: without the cache the second round differs (its aggregate
    then holds clients absent from the round)."""
    cfg, pt, fed = make_federation("fedsc", overrides=CACHED)
    train, _ = load_splits(cfg)
    ref = Pretraining.of(cfg, train)
    drop = Pretraining.of(replace(cfg, train=replace(cfg.train, absent_statistics="drop")), train)
    for r in range(2):
        agg = fed.step()
        ref.step()
        drop.step()
        assert agg.skipped is None and agg.clients == cfg.train.clients_per_round
        assert params_err(pt, ref, agg.pseudo_gradient) < 1e-9, r
        assert (params_err(pt, drop, agg.pseudo_gradient) > 1e-6) == (r > 0), r
        assert sorted(pt.cache.last) == sorted(ref.cache.last), r
        assert dict_err(dict(pt.cache.total.items()), dict(ref.cache.total.items())) < 1e-12
    assert len(pt.cache.last) > cfg.train.clients_per_round


def test_fedsc_cache__a_reply_for_the_wrong_number_of_clients_is_rejected_and_counted(
        make_federation):
    """A node's reply of each client's statistics must hold one row per client it was asked
    for: one with a row missing is rejected (kind ``shape``), its clients stay out of the
    cache and the round goes on with the others."""
    bad = 3

    def tamper(n: int, instruction: Message, reply: Message) -> Message:
        if n == bad and phase_of(instruction) == "stats" and not reply.has_error():
            sums = tensors_of(reply.content.array_records[STATS])
            reply.content.array_records[STATS] = array_record({k: v[1:]
                                                               for k, v in sums.items()})
        return reply

    _, pt, fed = make_federation("fedsc", tamper=tamper, overrides=CACHED)
    targets, _ = fed.targets(0)
    assert bad in targets
    agg = fed.step()
    assert agg.skipped is None
    assert agg.replies["stats"].rejected == {"shape": 1}
    assert agg.replies["stats"].accepted == len(targets) - 1
    assert sorted(pt.cache.last) == sorted(k for n, c in targets.items() if n != bad
                                           for k in c)
    assert agg.clients == sum(len(c) for n, c in targets.items() if n != bad)


def test_flower_statistics_equal_the_pooled_statistics(make_federation):
    """DCCO's phase 1: S_A is the merged statistics of every sampled client (float64)."""
    cfg, pt, fed = make_federation("dcco")
    plan = plan_round(cfg, pt.partition, 0)
    x1, x2 = pt.views(plan, 0)
    views = zip(torch.split(x1, plan.segments.counts.tolist()),
                torch.split(x2, plan.segments.counts.tolist()))
    pooled = merge([client_statistics(pt.model, a, b) for a, b in views]).moments()
    agg = fed.collect()
    for name in ("mean_f", "mean_g", "mean_ff", "mean_gg", "mean_fg"):
        assert rel_err(getattr(agg.shared, name), getattr(pooled, name)) < 1e-12, name


# ---------------------------------------------------------------------- faults


def error_reply(instruction: Message) -> Message:
    return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "simulated crash"),
                   reply_to=instruction)


def fault(node: int, phase: str, kind: str) -> Tamper:
    """Node ``node`` fails in ``phase``: its reply is lost ("lost") or an error ("error")."""

    def tamper(n: int, instruction: Message, reply: Message) -> Message | None:
        if n != node or phase_of(instruction) != phase:
            return reply
        return None if kind == "lost" else error_reply(instruction)

    return tamper


@pytest.mark.parametrize("phase,kind", [("stats", "error"), ("stats", "lost"),
                                        ("update", "error"), ("update", "lost")])
def test_dropouts_follow_the_documented_rule(make_federation, phase, kind):
    """S_A comes from the phase-1 survivors; the update is the sample-weighted average of the
    phase-2 survivors; a node that failed phase 1 is not asked for phase 2."""
    dropped = 2
    _cfg, pt, fed = make_federation("dcco", FlowerConfig(min_nodes=NODES, timeout=5.0),
                                   tamper=fault(dropped, phase, kind))
    for r in range(2):
        targets, _ = fed.targets(r)
        assert dropped in targets and len(targets) == NODES  # the round exercises the fault
        all_nodes, survivors = set(targets), set(targets) - {dropped}
        shared, pseudo = expected_round(pt, fed, r, survivors if phase == "stats" else all_nodes,
                                        survivors)
        before = [p.detach().clone() for _, p in pt.params]
        agg = fed.step()
        assert agg.skipped is None and math.isfinite(agg.loss)
        tally = agg.replies[phase]
        assert (tally.failed, tally.missing) == ((1, 0) if kind == "error" else (0, 1))
        assert agg.replies["update"].sent == (2 if phase == "stats" else 3)
        assert agg.replies["update"].accepted == 2
        for name in ("mean_f", "mean_ff", "mean_fg"):
            assert rel_err(getattr(agg.shared, name), getattr(shared, name)) < 1e-9
        assert dict_err(agg.pseudo_gradient, pseudo) < 1e-7  # node-level pooling reorders sums
        assert any(not torch.equal(b, p) for b, (_, p) in zip(before, pt.params))
        assert all(torch.isfinite(p).all() for _, p in pt.params)


def test_too_few_survivors_skip_the_round_and_it_is_logged(make_federation, tmp_path, caplog):
    """Every update lost but one: each round is skipped (model unchanged), logged and recorded
    in metrics.jsonl; the run still finishes."""

    def lose_updates(n: int, instruction: Message, reply: Message) -> Message | None:
        return None if n != 1 and phase_of(instruction) == "update" else reply

    fcfg = FlowerConfig(min_nodes=NODES, timeout=5.0, run_dir=str(tmp_path / "run"))
    cfg, pt, fed = make_federation("dcco", fcfg, tamper=lose_updates)
    train, _ = load_splits(cfg)
    initial = {k: v.clone() for k, v in pt.model.state_dict().items()}
    with caplog.at_level("WARNING", logger="flwr.dcco"):
        summary = run_federated(fed.grid, cfg, fcfg, train)
    assert summary["skipped_rounds"] == cfg.train.rounds
    assert sum("skipped" in m.getMessage() for m in caplog.records) == cfg.train.rounds
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["round"] for r in records if isinstance(r.get("skipped"), str)] == [1, 2, 3]
    windows = [r for r in records if "replies" in r]
    assert sum(r["rounds_skipped"] for r in windows) == 3
    assert all(r["replies"]["update"]["missing"] >= 1 for r in windows)
    load_checkpoint(tmp_path / "run" / "checkpoint.safetensors", pt.model, pt.optimizer)
    for k, v in pt.model.state_dict().items():
        assert torch.equal(v, initial[k]), k


# ---------------------------------------------------------------------- packed arrays


def test_array_record__packs_into_few_flower_objects_and_names_bad_layouts():
    """``codec.array_record`` packs named tensors into one flat array per dtype plus their
    layout: a model's 55 tensors become 6 Flower objects (records, arrays, chunks), not over 100;
    the round trip keeps every name, dtype, shape and bit; malformed packings raise."""
    from flwr.app import ArrayRecord, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    model = build_dual_encoder(replace(load_config(None).model, widths=(16, 32, 64)),
                               (1, 28, 28), (128, 128, 128), seed=0)
    weights = dict(model.state_dict()) | {"count": torch.tensor(7.0, dtype=torch.float64),
                                          "empty": torch.zeros(0, 3), "ints": torch.arange(4)}
    record = array_record(weights)
    back = tensors_of(record)
    assert list(back) == list(weights)
    for k, v in weights.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)
    per_tensor = ArrayRecord({k: Array(v.numpy()) for k, v in model.state_dict().items()})
    assert len(get_all_nested_objects(RecordDict({"m": per_tensor}))) > 50
    assert len(get_all_nested_objects(RecordDict({"m": array_record(model.state_dict())}))) <= 8
    assert list(tensors_of(per_tensor)) == list(model.state_dict())  # the unpacked form too

    def broken(layout: object, packed: np.ndarray) -> ArrayRecord:
        return ArrayRecord({"layout": Array(np.frombuffer(json.dumps(layout).encode(), np.uint8)),
                            "packed.<f4": Array(packed)})

    with pytest.raises(ValueError, match="malformed array layout"):
        tensors_of(broken([["a", "<f4"]], np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match="'a' .* not in the packed arrays"):
        tensors_of(broken([["a", "<f4", [3]]], np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match="do not match their layout"):
        tensors_of(broken([["a", "<f4", [1]]], np.zeros(2, np.float32)))
    with pytest.raises(TypeError, match="not numeric"):
        tensors_of(broken([["a", "|O", [1]]], np.zeros(2, np.float32)))
    # what a hostile client could send: each is a ValueError the server counts as malformed
    hostile = [
        broken([["a", "<f4", [float("inf")]]], np.zeros(2, np.float32)),  # int(inf)
        broken([["a", {"names": ["x"], "formats": ["<f4"], "itemsize": 2 ** 62}, [1]]],
               np.zeros(2, np.float32)),  # a dtype that is not a string
        broken([["a", "<f4", [True]]], np.zeros(1, np.float32)),
        broken([["a", "<f4", [3]], ["b", "<f4", [3]]], np.zeros((2, 3), np.float32)),  # 2-D
        broken([["a", "<f4", [1]]], np.array(1.0, np.float32)),  # 0-d
        ArrayRecord({"layout": Array(np.frombuffer(b"[" * 100_000, np.uint8)),  # recursion
                     "packed.<f4": Array(np.zeros(2, np.float32))}),
        ArrayRecord({"layout": Array(np.array(2 ** 33)),  # not bytes: no 8 GB of zeros
                     "packed.<f4": Array(np.zeros(2, np.float32))}),
    ]
    for record in hostile:
        with pytest.raises(ValueError, match="malformed"):
            tensors_of(record)


# ---------------------------------------------------------------------- malformed replies


def _edit(reply: Message, record: str, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Change a reply's arrays by name (they travel packed: ``codec.array_record``)."""
    arrays = {k: v.numpy() for k, v in tensors_of(reply.content.array_records[record]).items()}
    edit(arrays)
    reply.content.array_records[record] = array_record(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})


def _corrupt_stats(kind: str) -> Callable[[Message], None]:
    def edit(stats: dict[str, np.ndarray]) -> None:
        sum_f = stats["sum_f"]
        if kind == "missing_key":
            del stats["sum_fg"]
        elif kind == "shape":
            stats["sum_f"] = np.zeros(sum_f.shape[0] + 1)
        elif kind == "dtype":
            stats["sum_f"] = sum_f.astype(np.int64)
        elif kind == "nonfinite":
            stats["sum_ff"] = np.full_like(sum_f, np.nan)
        elif kind == "magnitude":
            stats["sum_f"] = sum_f * 1e20

    def corrupt(reply: Message) -> None:
        if kind == "count":
            reply.content.metric_records[STATS + ".meta"]["count"] = 0
        elif kind == "count-fraction":
            reply.content.metric_records[STATS + ".meta"]["count"] = 2.5
        else:
            _edit(reply, STATS, edit)
    return corrupt


def _corrupt_update(kind: str) -> Callable[[Message], None]:
    def edit(delta: dict[str, np.ndarray]) -> None:
        name = next(iter(delta))
        value = delta[name]
        if kind == "missing_key":
            del delta[name]
        elif kind == "shape":
            delta[name] = value.reshape(-1)[:-1].copy()
        elif kind == "dtype":
            delta[name] = value.astype(np.int32)
        elif kind == "nonfinite":
            delta[name] = np.full_like(value, np.inf)
        elif kind == "magnitude":
            delta[name] = np.full_like(value, 1e30)

    def corrupt(reply: Message) -> None:
        if kind == "count":
            reply.content.metric_records[UPDATE]["count"] = -3
        elif kind == "count-fraction":
            reply.content.metric_records[UPDATE]["count"] = 1.5
        else:
            _edit(reply, DELTA, edit)
    return corrupt


KINDS = ["missing_key", "shape", "dtype", "nonfinite", "magnitude", "count", "count-fraction"]


@pytest.mark.parametrize("phase", ["stats", "update"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_malformed_reply_is_rejected_counted_and_the_round_goes_on(make_federation, phase,
                                                                    kind, tmp_path):
    bad = 3
    corrupt = (_corrupt_stats if phase == "stats" else _corrupt_update)(kind)

    def tamper(n: int, instruction: Message, reply: Message) -> Message:
        if n == bad and phase_of(instruction) == phase and not reply.has_error():
            corrupt(reply)
        return reply

    fcfg = FlowerConfig(min_nodes=NODES, run_dir=str(tmp_path / "run"))
    cfg, pt, fed = make_federation("dcco", fcfg, tamper=tamper,
                                   overrides=("train.rounds=1", "train.log_every=1"))
    targets, _ = fed.targets(0)
    assert bad in targets
    survivors = set(targets) - {bad}
    _, pseudo = expected_round(pt, fed, 0, survivors if phase == "stats" else set(targets),
                               survivors)
    train, _ = load_splits(cfg)
    run_federated(fed.grid, cfg, fcfg, train)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    (window,) = [r for r in records if "replies" in r]
    counted = kind.removesuffix("-fraction")
    assert window["replies"][phase]["rejected"] == {counted: 1}
    assert window["replies"][phase]["accepted"] == len(targets) - 1
    assert window["rounds_skipped"] == 0 and math.isfinite(window["loss"])
    # the model moved by exactly the survivors' update
    set_lr(pt.optimizer, pt.lr(0))
    apply_pseudo_gradient(pt.optimizer, [p for _, p in pt.params],
                          [pseudo[name] for name, _ in pt.params])
    saved = Pretraining.of(cfg, train)
    load_checkpoint(tmp_path / "run" / "checkpoint.safetensors", saved.model, saved.optimizer)
    assert params_err(saved, pt) < 1e-7


# ---------------------------------------------------------------------- secure aggregation


@pytest.mark.parametrize("method,workers", [("dcco", False), ("cco_fedavg", False),
                                            ("fedsc", False), ("dcco", True)])
def test_secagg_matches_the_plain_aggregate_within_the_quantisation_bound(
        make_federation, method, workers, tmp_path, monkeypatch):
    """Both phases through Flower's SecAgg+ (real masking, secret sharing and unmasking in the
    ClientApp's secaggplus_mod): within ``secagg.error_bound`` of the plain aggregate; also
    with node workers (the mod masks in the ClientApp, the worker computes the reply)."""
    from dcco.flower.app import worker

    monkeypatch.setenv("DCCO_WORKER_DIR", str(tmp_path / "workers"))
    fcfg = FlowerConfig(min_nodes=NODES, secagg=True, worker=workers)
    cfg, pt, fed = make_federation(method, fcfg)
    _, _, plain = make_federation(method, FlowerConfig(min_nodes=NODES, worker=False))
    targets, _ = fed.targets(0)
    scales = fed.calibration(0)
    counts = [int(pt.partition.sizes[c].sum()) for c in targets.values()]
    max_weight = fed._max_weight(targets)
    try:
        secure, reference = fed.collect(), plain.collect()
    finally:
        if workers:
            assert all(worker.stop(c.run_id, c.node_id) for c in fed.grid.contexts.values())
    shares = method in ("dcco", "fedsc")
    assert secure.skipped is None and secure.clipped == (
        {"stats": 0.0, "update": 0.0} if shares else {"update": 0.0})
    stats_bound = secagg.error_bound(max_weight, counts, fcfg.secagg_stats_clip,
                                     fcfg.secagg_quantization, fcfg.secagg_stats_clip)
    update_bound = secagg.error_bound(max_weight, counts, fcfg.secagg_update_clip,
                                      fcfg.secagg_quantization, fcfg.secagg_update_clip)
    assert stats_bound < 1e-3 and update_bound < 1e-3  # the defaults' resolution
    if shares:
        spec = pt.method.stats
        s, p = (secagg.standardise(m, scales, spec) for m in (secure.shared, reference.shared))
        for a, b in zip(s.tensors(), p.tensors(), strict=True):
            err = float((a - b).abs().max())
            assert 0 < err <= stats_bound  # quantised (not exact), within the bound
    # the update exchange on its own: the plain update given the secure S_A
    data = node_data(cfg)
    plain_update = aggregate_updates(
        [node_update(cfg, pt.method, data, pt.model, c, 0, secure.shared)
         for c in targets.values()], dict(pt.params))
    worst = max(float((secure.pseudo_gradient[k] - v).abs().max()) / scales.update
                for k, v in plain_update.items())
    assert 0 < worst <= update_bound
    assert secure.loss == pytest.approx(reference.loss, rel=1e-3)


# ---------------------------------------------------------------------- run directory


def test_a_flower_run_directory_works_with_evaluate_and_compare(make_federation, tmp_path):
    fcfg = FlowerConfig(min_nodes=NODES, run_dir=str(tmp_path / "run"))
    cfg, _pt, fed = make_federation("dcco", fcfg)
    train, test = load_splits(cfg)
    summary = run_federated(fed.grid, cfg, fcfg, train, test)
    assert summary["backend"] == "flower" and summary["rounds"] == cfg.train.rounds
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses and all(math.isfinite(v) for v in losses)
    # the collapse figures of each record's S_A, in the records and the summary
    logged = [r for r in records if "loss" in r]
    assert all(0 <= r["dead_dims"] <= 1 and r["eff_rank"] >= 0 for r in logged)
    assert summary["collapse"]["round"] == cfg.train.rounds
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    assert main(["compare", str(tmp_path / "run"), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp.md").read_text()
    assert "dcco" in table and "linear" in table


# ---------------------------------------------------------------------- configuration


def _flat(table: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out


def test_pyproject_declares_every_run_config_key_and_it_parses():
    declared = _flat(tomllib.loads((ROOT / "pyproject.toml").read_text())
                     ["tool"]["flwr"]["app"]["config"])
    cfg, fcfg = parse_run_config(declared)
    assert set(declared) == set(run_config_entries(cfg, fcfg))
    assert parse_run_config(run_config_entries(cfg, fcfg)) == (cfg, fcfg)


def test_bad_run_config_names_the_key():
    with pytest.raises(ConfigError, match="train.rounds"):
        parse_run_config({"train.rounds": "many"})
    with pytest.raises(ConfigError, match="trian.rounds"):
        parse_run_config({"trian.rounds": 3})
    with pytest.raises((ConfigError, ValueError), match="min_survivors"):
        parse_run_config({"flower.min_survivors": 0})


def test_node_config_errors_name_the_fix():
    assert node_partition({"partition-id": 1, "num-partitions": 3}) == (1, 3)
    with pytest.raises(ValueError, match="partition-id"):
        node_partition({"num-partitions": 3})
    with pytest.raises(ValueError, match="integers"):
        node_partition({"partition-id": "a", "num-partitions": 3})


# ---------------------------------------------------------------------- new round settings
# DVICReg's statistics, stale statistics in one exchange per round, and several local steps,
# each against the simulator's reference backend; the new statistics under SecAgg+.


def _reference(cfg):
    train, _ = load_splits(cfg)
    return Pretraining.of(cfg, train)


# a client's later local steps start from its earlier ones: with the paper's local lr of 1.0
# (made for one step) they diverge on this tiny model, so the local-step cases use a small one
@pytest.mark.parametrize("overrides", [
    ('train.method="dvicreg"', "model.projector=[16, 16, 16]"),
    ("train.staleness=1",),
    ("train.staleness=1", "train.stale_after=2"),
    ("train.staleness=1", 'train.stale_statistics="own"', "train.aggregate_decay=0.5"),
    ("train.local_steps=2", "train.local_batch=1", "train.local_lr=1e-4"),
    ('train.method="cco_fedavg"', "train.local_steps=2", "train.local_lr=1e-4"),
    ("train.local_steps=2", "train.local_batch=2", "train.local_lr=1e-4",
     'train.local_statistics="own"', 'train.pseudo_gradient="mean_gradient"'),
    ('train.method="fedsc"', "model.projector=[16, 16, 16]", "train.local_steps=2",
     "train.local_lr=1e-3", 'train.local_statistics="own"', 'train.own_weight="fedsc"'),
    # L-DAWA at a client rate of 0.05: at 1.0 a step is many times this tiny model's
    # weights, and its second and third rounds blow the nodes' other summation order up
    ('train.aggregation="ldawa"', "train.local_lr=0.05"),
    ('train.method="cco_fedavg"', 'train.aggregation="ldawa"', "train.local_lr=0.05"),
], ids=["dvicreg", "stale", "stale-after-warm-up", "stale-own-ema", "local-steps-dcco", "local-steps-fedavg",
        "local-steps-own", "fedsc-alpha-schedule", "ldawa-dcco", "ldawa-fedavg"])
def test_flower_round_settings_equal_the_reference_backend(make_federation, overrides):
    method = next((o.split('"')[1] for o in overrides if o.startswith("train.method")), "dcco")
    cfg, pt, fed = make_federation(method, overrides=overrides)
    ref = _reference(cfg)
    # the nodes pool their clients' float32 deltas before the server does, a summation order
    # other than the simulator's: a few ulps, which the local steps' own-statistics loss
    # (its 1/w factor) and three server steps carry to just above 1e-9
    tol = 1e-8 if any("local_statistics" in o for o in overrides) else 1e-9
    for _ in range(3):
        agg = fed.step()
        m = ref.step()
        assert agg.skipped is None
        assert agg.loss == pytest.approx(m.loss, rel=1e-9)
        assert agg.result.exchanges == m.exchanges
        assert params_err(pt, ref) < tol
    if cfg.train.staleness:
        for k, v in ref.aggregate.items():
            assert float((pt.aggregate[k] - v).abs().max()) <= 1e-9 * float(v.abs().max())


def test_flower_stale_statistics_take_one_exchange_per_round(make_federation):
    _, pt, fed = make_federation("dcco", overrides=("train.staleness=1",))
    exchanges = [fed.step().result.exchanges for _ in range(3)]
    assert exchanges == [2, 1, 1]
    assert pt.aggregate is not None


@pytest.mark.parametrize("overrides", [
    ('train.method="dvicreg"', "model.projector=[16, 16, 16]"),
    ("train.staleness=1",),
], ids=["dvicreg", "stale"])
def test_secagg_carries_the_new_statistics_within_the_bound(make_federation, overrides):
    """DVICReg's Σ F Fᵀ, Σ G Gᵀ, Σ F∘G, and statistics sent with the updates, through SecAgg+:
    the unmasked aggregate is the plain one up to quantisation."""
    method = next((o.split('"')[1] for o in overrides if o.startswith("train.method")), "dcco")
    _, pt, fed = make_federation(method, FlowerConfig(min_nodes=NODES, secagg=True),
                                 overrides=overrides)
    _, plain_pt, plain = make_federation(method, overrides=overrides)
    # one round: its statistics exchange, and (stale) the statistics sent with the updates;
    # later rounds would compare two runs whose models already differ by the quantisation
    secure, reference = fed.step(), plain.step()
    assert secure.skipped is None and max(secure.clipped.values()) == 0.0
    for k, v in reference.shared.items():
        scale = float(v.abs().max())
        assert float((secure.shared[k] - v).abs().max()) <= 1e-3 * max(scale, 1.0), k
    assert dict_err(secure.pseudo_gradient, reference.pseudo_gradient) < 1e-3
    if pt.cfg.train.staleness:
        assert float(pt.aggregate.count) == float(plain_pt.aggregate.count)
        for k, v in plain_pt.aggregate.items():
            assert float((pt.aggregate[k] - v).abs().max()) <= 1e-3 * max(float(v.abs().max()),
                                                                            1.0), k


# ---------------------------------------------------------------------- what the server sees


def _observed_arrays(replies: list[Message]) -> list[np.ndarray]:
    """Every numeric array in the replies the server received, flattened, as float64."""
    out = []
    for reply in replies:
        if reply.has_error():
            continue
        for record in reply.content.array_records.values():
            for array in record.values():
                values = np.asarray(array.numpy())
                if values.dtype.kind in "fiu" and values.size:
                    out.append(values.astype(np.float64).ravel())
    return out


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secagg"])
def test_server_view__one_nodes_encodings_leak_in_plain_statistics_not_under_secagg(
        make_federation, secure):
    """An honest-but-curious server reads every reply. In plain DCCO a node's statistics
    reply is Σ F and its count, so the server recovers the sum (and mean) of the node's
    encodings exactly: one client's encoding when a node is one device with one sample
    (docs/privacy.md). Under SecAgg+ it sees only masked vectors and the average over nodes:
    no reply holds any node's Σ F."""
    seen: list[Message] = []

    def observe(node: int, instruction: Message, reply: Message) -> Message:
        seen.append(reply)
        return reply

    fcfg = FlowerConfig(min_nodes=NODES, secagg=secure)
    cfg, pt, fed = make_federation("dcco", fcfg, tamper=observe,
                                   overrides=("data.samples_per_client=1",))
    targets, _ = fed.targets(0)
    data = node_data(cfg)
    node_means = []
    with torch.no_grad():
        for clients in targets.values():
            f = torch.cat([pt.model(*client_views(cfg, data, k, 0))[0] for k in clients])
            node_means.append(f.double().sum(0).numpy())  # what its reply carries: Σ F
    agg = fed.collect()
    assert agg.skipped is None
    arrays = _observed_arrays(seen)
    d = node_means[0].shape[0]

    def recovered(target: np.ndarray) -> bool:
        """Some observed array holds ``target`` (to 1e-9) at some offset."""
        for a in arrays:
            starts = np.nonzero(np.isclose(a[:a.size - d + 1], target[0], rtol=1e-9,
                                           atol=1e-12))[0]
            if any(np.allclose(a[s:s + d], target, rtol=1e-9, atol=1e-12) for s in starts):
                return True
        return False

    leaked = [recovered(m) for m in node_means]
    if secure:
        assert not any(leaked)
    else:
        assert all(leaked)


def test_open_run__errors_name_the_apps_keys_not_the_clis_flags(tiny_config, tmp_path):
    from dcco.flower.app.run import open_run
    from dcco.run.rundir import RunDirError

    cfg = load_config(tiny_config(rounds=2))
    run = tmp_path / "run"
    open_run(cfg, FlowerConfig(run_dir=str(run)))
    (run / "metrics.jsonl").write_text('{"round": 1, "loss": 1.0}\n')  # it has started
    with pytest.raises(RunDirError, match="flower.resume=true") as err:
        open_run(cfg, FlowerConfig(run_dir=str(run)))
    assert "--resume" not in str(err.value).replace("flower.resume", "")
    with pytest.raises(RunDirError, match="flower.run_dir .* holds no dcco run"):
        open_run(cfg, FlowerConfig(run_dir=str(tmp_path / "nothing"), resume=True))
    with pytest.raises(RunDirError, match=r"flower.resume: .*train.rounds: 2 here, 3 asked"):
        open_run(load_config(tiny_config(rounds=3)), FlowerConfig(run_dir=str(run), resume=True))


# ---------------------------------------------------------------------- resume


class _Crash(Exception):
    pass


@pytest.mark.parametrize("method,secure,extra", [
    ("dcco", False, ()), ("contrastive_fedavg", False, ()), ("dcco", True, ()),
    ("fedsc", False, CACHED)], ids=["dcco", "contrastive_fedavg", "dcco-secagg",
                                    "fedsc-cached"])
def test_flower_resume__continues_from_the_checkpoint_bit_identically(
        make_federation, tmp_path, monkeypatch, method, secure, extra):
    """``flower.resume = true`` after a ServerApp died in round 3 (checkpoints every round):
    the run goes on from round 2's checkpoint to the configured rounds, and its final weights
    equal an uninterrupted run's bit for bit, because every random choice of a round is a
    function of (seed, round) and the checkpoint holds the model and optimiser exactly (and
    FedSC's cache of absent clients, which the rounds after the resume merge into).

    Under SecAgg+ it is close, not identical: Flower's SecAgg+ quantises with stochastic
    rounding drawn from NumPy's global generator (``flwr.common.secure_aggregation.
    quantization._stochastic_round``), unseeded and process-wide, so two uninterrupted
    secure runs differ alike; the difference stays at the quantisation's scale."""
    overrides = ("train.rounds=4", "train.checkpoint_every=1", *extra)
    whole = FlowerConfig(min_nodes=NODES, run_dir=str(tmp_path / "whole"), secagg=secure)
    cfg, _pt, fed = make_federation(method, whole, overrides=overrides)
    train, _ = load_splits(cfg)
    run_federated(fed.grid, cfg, whole, train)

    cut = replace(whole, run_dir=str(tmp_path / "cut"))
    real_step = Federation.step

    def dies_in_round_3(self):
        if self.pt.rounds_done == 2:
            raise _Crash
        return real_step(self)

    monkeypatch.setattr(Federation, "step", dies_in_round_3)
    with pytest.raises(_Crash):
        run_federated(fed.grid, cfg, cut, train)
    monkeypatch.setattr(Federation, "step", real_step)
    summary = run_federated(fed.grid, cfg, replace(cut, resume=True), train)
    assert summary["rounds"] == 4

    rounds = [json.loads(line)["round"] for line in (tmp_path / "cut" / "metrics.jsonl").open()
              if "loss" in json.loads(line)]
    assert rounds == [2, 4]  # logged every 2 rounds: nothing twice, nothing missing
    models = []
    for name in ("whole", "cut"):
        model = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0).double()
        assert load_checkpoint(tmp_path / name / "checkpoint.safetensors", model) == 4
        models.append(model.state_dict())
    if secure:
        assert dict_err(models[1], models[0]) < 5e-2  # 1e-2 seen; the rounding is random
        return
    for k in models[0]:
        assert torch.equal(models[0][k], models[1][k]), k
    if extra:
        from safetensors.torch import load_file

        saved = [load_file(tmp_path / name / "checkpoint.safetensors") for name in
                 ("whole", "cut")]
        cache = [k for k in saved[0] if k.startswith("state.cache.")]
        assert "state.cache.clients" in cache
        for k in cache:
            assert torch.equal(saved[0][k], saved[1][k]), k


@pytest.mark.parametrize("method", ["dcco", "contrastive_fedavg"])
def test_message_bytes__are_measured_per_round_and_match_the_payload_formula(
        make_federation, method):
    """The bytes a round's messages carry, counted from the messages as Flower serialises
    them, agree with ``Algorithm.message_bytes`` (model, update and float64 statistics)
    within the protobuf framing; SecAgg+ sends more (its masked integer vectors and keys)."""
    _cfg, pt, fed = make_federation(method)
    agg = fed.collect()
    t = agg.traffic
    assert t["nodes"] == NODES and t["up"] > 0 and t["down"] > 0
    model_bytes = sum(p.numel() * p.element_size() for _, p in pt.params)
    d = pt.model.projection_dim
    formula = pt.algorithm.message_bytes(d, d, model_bytes)
    # a node's reply pools its clients: one update (and one set of statistics) per node; on
    # top of the payload, protobuf frames each array (name, shape, dtype: ~100-200 bytes),
    # which at this tiny model's 0.05 MB is ~20 % and at the small network's 0.8 MB ~1 %
    framing = 250 * (len(pt.params) + 8)
    for way in ("up", "down"):
        assert formula[way] <= t[f"per_node_{way}"] <= formula[way] + framing, way
    # SecAgg+'s own stages (keys, shares, unmasking) go through the same grid and are counted
    _cfg, _pt, secure = make_federation(method, FlowerConfig(min_nodes=NODES, secagg=True))
    assert secure.collect().traffic["per_node_down"] > t["per_node_down"]


@pytest.mark.parametrize("method,secure", [("dcco", False), ("contrastive_fedavg", False),
                                           ("dcco", True)])
def test_differential_privacy_over_flower__equals_the_simulators_private_round(
        make_federation, method, secure):
    """``privacy.*`` in the app's run config: nodes clip each client's update and scale its
    encodings, the server adds the round's seeded noise. With plain aggregation the private
    round equals the simulator's (same noise, same clipping) to float64 rounding; under
    SecAgg+ within its quantisation (the same bound as without privacy)."""
    overrides = ("privacy.noise_multiplier=1.5", "privacy.update_clip=0.05")
    cfg, pt, fed = make_federation(method, FlowerConfig(min_nodes=NODES, secagg=secure),
                                   overrides=overrides)
    assert pt.privacy is not None and pt.model.unit_encodings
    train, _ = load_splits(cfg)
    ref = Pretraining.of(cfg, train)
    for _ in range(2):
        agg = fed.step()
        ref.step()
        assert agg.skipped is None
    assert params_err(pt, ref) < (5e-2 if secure else 1e-9)  # SecAgg+: random rounding


@pytest.mark.parametrize("still_listed", [True, False])
def test_a_restarted_supernode_takes_its_partition_over_and_is_used_again(make_federation,
                                                                          still_listed):
    """A node lost in phase 1 of a round: the round completes by the dropout rule. A new
    SuperNode for the same partition-id (the restarted one) then takes the partition over,
    whether the lost node is still listed (within Flower's 60 s heartbeat window) or gone,
    and the next round uses it with every reply accepted."""
    from flwr.app import Context, RecordDict

    _cfg, _pt, fed = make_federation("dcco")
    grid = fed.grid._grid
    grid.tamper = lambda node, ins, rep: None if node == 1 else rep  # node 1 is killed
    lost = fed.step()
    assert lost.skipped is None and lost.replies["stats"].missing == 1
    assert lost.replies["update"].sent == NODES - 1  # not asked for phase 2
    grid.tamper = None
    if not still_listed:
        grid.online.discard(1)
    old = grid.contexts[1]
    grid.contexts[4] = Context(run_id=old.run_id, node_id=4, node_config=dict(old.node_config),
                               state=RecordDict(), run_config=dict(old.run_config))
    grid.online.add(4)
    again = fed.step()
    assert fed.nodes[0] == 4 and fed.identities[1] is None
    for phase in ("stats", "update"):
        tally = again.replies[phase]
        assert tally.sent == tally.accepted == NODES and not tally.missing, phase
    # a genuine duplicate (the partition's node still answers) stays excluded
    grid.contexts[5] = Context(run_id=old.run_id, node_id=5, node_config=dict(old.node_config),
                               state=RecordDict(), run_config=dict(old.run_config))
    grid.online.add(5)
    fed.step()
    assert fed.nodes[0] == 4 and fed.identities[5] is None


class _SlowGrid:
    """A grid whose replies appear a few pulls after their push (a SuperLink's), one node
    never answering."""

    def __init__(self, ready_after: int, silent: int | None = None) -> None:
        self.ready_after, self.silent, self.pulls, self.sent = ready_after, silent, 0, {}

    def push_messages(self, messages):
        ids = []
        for i, m in enumerate(messages):
            m.metadata.__dict__["_message_id"] = f"m{i}"
            self.sent[f"m{i}"] = m
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, ids):
        self.pulls += 1
        if self.pulls < self.ready_after:
            return []
        out = []
        for i in ids:
            m = self.sent[i]
            if m.metadata.dst_node_id != self.silent:
                out.append(Message(m.content, reply_to=self.sent.pop(i)))
        return out


class _Clock:
    """A fake ``time`` for ``dcco.flower.polling``: sleeping advances it and is recorded."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_metered_grid__pulls_until_every_reply_is_in_without_flowers_3_s_sleep(monkeypatch):
    from flwr.app import RecordDict
    from flwr.common import MessageType
    from flwr.supercore.task_identity import TaskIdentity

    from dcco.flower import polling
    from dcco.flower.metering import MeteredGrid

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0  # a ServerApp's

    def messages():
        return [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN)
                for n in (1, 2, 3)]

    clock = _Clock()
    monkeypatch.setattr(polling, "time", clock)
    grid = MeteredGrid(_SlowGrid(ready_after=3))
    replies = grid.send_and_receive(messages(), timeout=60)
    assert len(replies) == 3 and grid._grid.pulls == 3
    assert clock.sleeps == [polling.POLL_S] * 2  # two short polls, not 2 × 3 s
    # a node that never answers: the timeout ends the wait, the others' replies count
    clock = _Clock()
    monkeypatch.setattr(polling, "time", clock)
    grid = MeteredGrid(_SlowGrid(ready_after=1, silent=2))
    replies = grid.send_and_receive(messages(), timeout=0.55)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 3]
    assert sum(clock.sleeps) == pytest.approx(0.55) and max(clock.sleeps) <= polling.POLL_S


def test_a_stop_file_stops_the_run_at_its_next_logged_round_and_resume_finishes_it(
        make_federation, tmp_path, monkeypatch):
    """``STOP`` in the run directory, created during round 1 (logging every 2 rounds): the run
    stops after round 2 with a checkpoint and a ``stopped`` record, consuming the file; one
    left there when the run is resumed is a request to the run that ended, and is dropped, so
    ``flower.resume = true`` goes on to the configured 4 rounds."""
    fcfg = FlowerConfig(min_nodes=NODES, run_dir=str(tmp_path / "run"))
    cfg, _pt, fed = make_federation("dcco", fcfg, overrides=("train.rounds=4",))
    train, _ = load_splits(cfg)
    stop = tmp_path / "run" / "STOP"
    real_step = Federation.step

    def asks_to_stop_in_round_1(self):
        if self.pt.rounds_done == 0:
            stop.touch()
        return real_step(self)

    monkeypatch.setattr(Federation, "step", asks_to_stop_in_round_1)
    summary = run_federated(fed.grid, cfg, fcfg, train)
    assert summary["rounds"] == 2 and "STOP" in summary["stopped"]
    assert not stop.exists()
    records = [json.loads(line) for line in stop.with_name("metrics.jsonl").open()]
    assert records[-1] == {"round": 2, "stopped": summary["stopped"]}
    model = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0).double()
    assert load_checkpoint(stop.with_name("checkpoint.safetensors"), model) == 2

    monkeypatch.setattr(Federation, "step", real_step)
    stop.touch()
    summary = run_federated(fed.grid, cfg, replace(fcfg, resume=True), train)
    assert summary["rounds"] == 4 and "stopped" not in summary
    rounds = [json.loads(line)["round"] for line in stop.with_name("metrics.jsonl").open()
              if "loss" in json.loads(line)]
    assert rounds == [2, 4]


# ---------------------------------------------------------------------- node workers


def test_node_workers__rounds_through_them_equal_the_reference_backend(make_federation,
                                                                       tmp_path, monkeypatch):
    """``flower.worker = true``: every node's messages go to a long-lived worker process (one
    per node, started by the first message), and DCCO's rounds, whose phase 2 needs the model
    kept in ``context.state`` by phase 1, still equal the reference backend's; a handler's
    error in a worker comes back as the ClientApp's, naming the problem; and the workers end
    when told to."""
    from flwr.app import RecordDict

    from dcco.flower.app import worker

    monkeypatch.setenv("DCCO_WORKER_DIR", str(tmp_path / "workers"))  # not another run's
    cfg, pt, fed = make_federation("dcco", FlowerConfig(min_nodes=NODES, worker=True))
    contexts = list(fed.grid.contexts.values())
    try:
        _assert_rounds_equal(cfg, pt, fed, "dcco")
        assert all(worker.socket_path(c.run_id, c.node_id).exists() for c in contexts)
        with pytest.raises(worker.WorkerError, match="node worker .*KeyError"):
            worker.call("train", RecordDict(), contexts[0])  # no instruction in it
    finally:
        stopped = [worker.stop(c.run_id, c.node_id) for c in contexts]
    assert stopped == [True] * NODES
    deadline = time.monotonic() + 60  # a stopped worker removes its socket as it ends
    while any(worker.socket_path(c.run_id, c.node_id).exists() for c in contexts):
        assert time.monotonic() < deadline, "a stopped worker left its socket"
        time.sleep(0.05)
    # once gone, there is nothing left to stop (asked before that, on a busy machine, a
    # worker still finishing its stop can answer a second one)
    assert not any(worker.stop(c.run_id, c.node_id) for c in contexts)


def test_node_workers__auto_is_on_under_a_supernode_only(tmp_path):
    """``flower.worker = "auto"`` (the default): a worker where the ClientApp's process was
    started for one message (by ``flower-superexec``, a SuperNode's launcher), none here (in
    process) or wherever the parent is something else; true and false are as set; other
    values are refused by name."""
    import subprocess
    import sys

    from dcco.flower.app import worker

    assert FlowerConfig().worker == "auto"
    assert not worker.enabled({}) and not worker.enabled({"flower.worker": "auto"})
    assert worker.enabled({"flower.worker": True}) and not worker.enabled({"flower.worker": False})
    paths = [tmp_path / name for name in (*worker.LAUNCHERS, "flower-superlink")]
    for path in paths:  # processes whose commands are Flower's
        path.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
        path.chmod(0o755)
    procs = [subprocess.Popen([str(path)]) for path in paths]
    try:
        deadline = time.monotonic() + 60  # until exec has replaced the command line
        while not all(Path(f"/proc/{p.pid}/cmdline").read_bytes().count(b"flower-") for p in procs):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [worker.per_message_process(p.pid) for p in procs] == [True, True, False]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert not worker.per_message_process(procs[0].pid)  # gone: /proc cannot say
    with pytest.raises(ConfigError, match="flower.worker = 'yes' is not allowed"):
        parse_run_config({"flower.worker": "yes"})


def test_node_workers__a_socket_folder_too_long_is_named(tmp_path, monkeypatch):
    from dcco.flower.app import worker

    monkeypatch.setenv("DCCO_WORKER_DIR", str(tmp_path / ("w" * 80)))
    with pytest.raises(worker.WorkerError, match="too long for a Unix socket.*DCCO_WORKER_DIR"):
        worker.socket_path(2**63 - 1, 2**63 - 1)


def test_the_floor_app_and_the_client_app_import_flower_without_torch(tmp_path):
    """Flower's floor (``dcco.flower.testing.floor``) echoes tiny messages for every round and
    exchange and records each round's seconds; it, and the dcco ClientApp module that Flower
    imports in a new process for every message, import Flower but not torch."""
    import subprocess
    import sys

    from flwr.app import Context, RecordDict

    from dcco.flower.testing import floor

    grid = InProcessGrid(floor.client_app, [{} for _ in range(NODES)], {})
    record = tmp_path / "floor.json"
    floor.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                             run_config={"rounds": 3, "exchanges": 2, "min_nodes": NODES,
                                         "timeout": 60.0, "payload": 4000,
                                         "record": str(record)}))
    written = json.loads(record.read_text())
    assert written["nodes"] == NODES and written["exchanges"] == 2
    assert written["payload_bytes"] == 4000
    assert len(written["seconds_per_round"]) == 3
    assert all(s > 0 for s in written["seconds_per_round"])
    floor.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                             run_config={"rounds": 1, "exchanges": 1, "min_nodes": NODES,
                                         "timeout": 60.0, "payload": 4000,
                                         "payload_arrays": 5, "record": str(record)}))
    assert json.loads(record.read_text())["payload_arrays"] == 5
    rng = np.random.default_rng(0)
    first, second = floor._payload(4000, 5, rng), floor._payload(4000, 5, rng)
    assert len(first) == 5 and sum(a.numpy().nbytes for a in first.values()) == 4000
    values = [a.numpy() for a in first.values()] + [a.numpy() for a in second.values()]
    assert len({v.tobytes() for v in values}) == 10  # all distinct: no shared objects
    assert floor._payload(0, 5, rng) is None
    for module in ("dcco.flower.testing.floor", "dcco.flower.app.client_app"):
        code = f"import sys, {module}; print('torch' in sys.modules, 'flwr' in sys.modules)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        assert done.stdout.split() == ["False", "True"], module
