"""FedU and FedEMA (``dcco.methods.divergence``): BYOL clients that keep their own model.

Oracles written here: the papers' formulas for FedEMA's μ and λ on hand-built weights, FedU's
threshold at its exact value, one client with one local step against a centralized BYOL step
on its batch, and a resume from a checkpoint against the uninterrupted run, to the bit."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers.grids import tiny_grid

from dcco.config import ConfigError, LossConfig, load_config
from dcco.core.algorithm import Algorithm
from dcco.core.client_state import ClientStates, Layout, RoundStates, state_bytes
from dcco.core.simulator import run_round
from dcco.methods.base import Segments
from dcco.methods.divergence import SCALE, TRAVELLED, FedEMA, FedU, divergence, fedema_mu
from dcco.methods.predictive import CentralizedBYOL
from dcco.run.loop import run_pretraining
from dcco.run.planning import plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import RunDir
from dcco.run.sampling import clients_seen, sample_clients
from dcco.run.setup import build_model, validate
from dcco.run.splits import load_splits

LAYOUT = Layout(online=("backbone.w",), predictor=("predictor.w",),
                target=(("target.0.w", "backbone.w"),))


def _weights(online, predictor, target=None):
    out = {"backbone.w": torch.tensor(online, dtype=torch.float64),
           "predictor.w": torch.tensor(predictor, dtype=torch.float64)}
    if target is not None:
        out["target.0.w"] = torch.tensor(target, dtype=torch.float64)
    return out


def test_fedema_mu__follows_the_papers_formulas_on_hand_built_weights():
    method = FedEMA(LossConfig(fedema_tau=0.7))
    g = _weights([3.0, 0.0], [1.0, 2.0])
    kept = _weights([0.0, 4.0], [5.0, -1.0], target=[7.0, 7.0])  # ‖W_g − W_k‖ = 5
    assert divergence(g, kept, LAYOUT.online) == 5.0
    first = method.client_start(g, kept, LAYOUT, 1)  # λ = τ / 5, so μ = τ = 0.7
    lam = float(first.keep[SCALE])
    assert lam == pytest.approx(0.7 / 5, rel=1e-15)
    torch.testing.assert_close(first.weights["backbone.w"],
                               torch.tensor([0.3 * 3.0, 0.7 * 4.0], dtype=torch.float64))
    torch.testing.assert_close(first.weights["predictor.w"],
                               torch.tensor([0.7 * 5 + 0.3 * 1, 0.7 * -1 + 0.3 * 2],
                                            dtype=torch.float64))
    assert torch.equal(first.weights["target.0.w"], kept["target.0.w"])  # the client's own
    # later rounds keep λ: μ = min(λ ‖W_g − W_k‖, 1)
    later = kept | first.keep | {"backbone.w": torch.tensor([3.0, 2.5], dtype=torch.float64)}
    mu = lam * 2.5
    mixed = method.client_start(g, later, LAYOUT, 2)
    torch.testing.assert_close(mixed.weights["backbone.w"],
                               torch.tensor([3.0, mu * 2.5], dtype=torch.float64))
    assert float(mixed.keep[SCALE]) == lam
    far = kept | first.keep | {"backbone.w": torch.tensor([3.0, 100.0], dtype=torch.float64)}
    assert torch.equal(method.client_start(g, far, LAYOUT, 3).weights["backbone.w"],
                       far["backbone.w"])  # μ = 1: the client keeps its own
    assert fedema_mu(0.0, None, 0.7) == (0.0, None)  # no divergence yet: λ stays unset
    assert fedema_mu(2.0, None, 0.7) == (0.7, 0.35)
    assert fedema_mu(10.0, 0.35, 0.7) == (1.0, 0.35)
    fresh = method.client_start(g, None, LAYOUT, 0)  # never seen: the global model
    assert torch.equal(fresh.weights["target.0.w"], g["backbone.w"]) and fresh.keep == {}


def test_fedu_threshold__switches_exactly_at_its_value():
    g = _weights([3.0, 4.0], [1.0, 1.0])
    kept = _weights([0.0, 0.0], [9.0, 9.0], target=[2.0, 2.0])  # ‖W_g − W_k‖ = 5 exactly
    at = FedU(LossConfig(fedu_threshold=5.0)).client_start(g, kept, LAYOUT, 1)
    above = FedU(LossConfig(fedu_threshold=math.nextafter(5.0, 6.0))).client_start(
        g, kept, LAYOUT, 1)
    assert torch.equal(at.weights["predictor.w"], kept["predictor.w"])  # not below: its own
    assert torch.equal(above.weights["predictor.w"], g["predictor.w"])  # below: the global
    for start in (at, above):  # the online network is always the global one
        assert torch.equal(start.weights["backbone.w"], g["backbone.w"])
        assert torch.equal(start.weights["target.0.w"], kept["target.0.w"])


def _byol_model(tiny_config, method):
    cfg = load_config(tiny_config(method=method))
    return build_model(cfg, 1).to(torch.float64)


@pytest.mark.parametrize("method", [FedU, FedEMA])
def test_one_client_one_step__is_a_centralized_byol_step_on_its_batch(tiny_config, method):
    torch.manual_seed(0)
    model = _byol_model(tiny_config, method.name)
    x1, x2 = (torch.randn(4, 1, 28, 28, dtype=torch.float64) for _ in range(2))
    store, lr, tau = ClientStates(), 0.5, 0.9
    result = run_round(model, Algorithm(method(LossConfig()), local_lr=lr), x1, x2,
                       Segments.from_counts([4]), "reference",
                       states=RoundStates([7], store, tau, 0))
    # the oracle: BYOL's loss on the batch, one SGD step, then the target's moving average
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = CentralizedBYOL(LossConfig()).client_loss(*model(x1, x2), None)
    grads = torch.autograd.grad(loss, [p for _, p in named])
    central = copy.deepcopy(model)
    with torch.no_grad():
        for (name, p), g in zip(named, grads, strict=True):
            torch.testing.assert_close(result.pseudo_gradient[name], lr * g, rtol=1e-12,
                                       atol=1e-15)
            dict(central.named_parameters())[name].sub_(lr * g)
    central.update_target(tau)
    assert result.loss == pytest.approx(float(loss.detach()), rel=1e-12)
    kept = store.get(7, dtype=torch.float64)
    saved = store.state()  # one group: its ids, and each tensor stacked over its clients
    assert list(saved) == ["client_state.0.clients"] + [f"client_state.0.{n}"
                                                         for n in sorted(kept)]
    assert saved["client_state.0.clients"].tolist() == [7]
    for name, value in central.named_parameters():
        torch.testing.assert_close(kept[name], value.detach(), rtol=1e-12, atol=1e-14)
    # the global model is untouched by the client (the server applies the update)
    assert torch.equal(dict(model.named_parameters())["predictor.0.weight"],
                       dict(_byol_model(tiny_config, method.name).to(torch.float64)
                            .named_parameters())["predictor.0.weight"])


def test_stateful_round__needs_the_clients_ids(tiny_config):
    model = _byol_model(tiny_config, "fedema")
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    with pytest.raises(ValueError, match="keep their model between rounds"):
        run_round(model, FedEMA(LossConfig()), x, x, Segments.from_counts([2, 2]))


def test_client_states__hold_participants_only_in_their_dtype():
    store = ClientStates(torch.float16)
    entry = {"w": torch.full((3,), 1 / 3), SCALE: torch.tensor(0.1, dtype=torch.float64)}
    store.put(5, entry)
    assert 5 in store and 6 not in store and store.get(6) is None and len(store) == 1
    got = store.get(5)
    assert got["w"].dtype == torch.float32 and got[SCALE].dtype == torch.float64
    assert torch.equal(got["w"], entry["w"].half().float())  # rounded once, when stored
    assert float(got[SCALE]) == 0.1
    assert store.nbytes == 3 * 2 + 8
    again = ClientStates.from_state(store.state(), torch.float16)
    assert torch.equal(again.get(5)["w"], got["w"])
    assert state_bytes({"a": torch.Size([2, 3]), "b": torch.Size([4])}, torch.float16) == 20
    # the clients a run's rounds sample, exactly: 7,102 of 15,000 in 300 rounds of 32
    assert clients_seen(0, 300, 15000, 32) == len({c for r in range(300) for c in
                                                   sample_clients(0, r, 15000, 32).tolist()})
    assert clients_seen(0, 300, 15000, 32, limit=100) == min(
        15000, len({c for r in range(100) for c in sample_clients(0, r, 15000, 32).tolist()})
        + 200 * 32)  # past the limit: one new client a draw at most
    assert clients_seen(0, 50, 6, 4) == 6  # every client, early
    # docs/results/stateful-peers.md: a returning client's model is 92 rounds old
    last, gaps = {}, []
    for r in range(300):
        for c in sample_clients(0, r, 15000, 32).tolist():
            if c in last:
                gaps.append(r - last[c])
            last[c] = r
    assert (len(gaps), round(sum(gaps) / len(gaps)), sorted(gaps)[len(gaps) // 2]) == (
        9600 - 7102, 92, 76)
    # docs/guide.md's share of first visits in 300 rounds (74 %, 74 %, 74 %, 93 %)
    for clients, k, distinct in ((15000, 32, 7102), (3750, 8, 1765), (60000, 128, 28268),
                                 (60000, 32, 8889)):
        assert clients_seen(0, 300, clients, k) == distinct
        assert round(100 * distinct / (300 * k)) == (93 if k == 32 and clients == 60000
                                                     else 74)
    with pytest.raises(ValueError, match="client_state.<group>.<name>"):
        ClientStates.from_state({"client_state.x.w": torch.zeros(1)})
    with pytest.raises(ValueError, match="one row of each tensor a client"):
        ClientStates.from_state({"client_state.0.clients": torch.tensor([1, 2]),
                                 "client_state.0.w": torch.zeros(3, 4)})


def test_client_states__thousands_of_clients_save_as_a_few_stacked_tensors(tmp_path):
    """A checkpoint's header holds a line a tensor: the store saves clients whose entries
    look alike as one group, each tensor stacked (a tensor a client's name overflowed
    safetensors' header at 7,000 clients), and loads back every entry to the bit: from
    safetensors' own reader of the file, and from dcco's, which reads a tensor at a time."""
    from safetensors.torch import load_file

    from dcco.tensorfile import Stacked, TensorFile, write_tensors

    gen = torch.Generator().manual_seed(0)
    store = ClientStates(torch.float16)
    for client in range(3000):
        entry = {"a.w": torch.randn(3, 2, generator=gen), "b": torch.randn(5, generator=gen)}
        if client % 3:
            entry[SCALE] = torch.tensor(client / 7, dtype=torch.float64)
        if client % 5 == 0:
            entry = {"queue": torch.randn(client % 4 + 1, 2, generator=gen)}
        store.put(client, entry)
    store.put(3000, {})  # a MoCo client without a queue
    saved = store.state()
    assert len(saved) <= 20
    # the stacks are the entries themselves, not a copy of the store
    stacked = [v for v in saved.values() if isinstance(v, Stacked)]
    held = {id(t) for c in range(3001) for t in store.held(c).values()}
    assert stacked and all(id(row) in held for s in stacked for row in s.rows)
    write_tensors(tmp_path / "s.safetensors", saved)
    for read in (load_file(tmp_path / "s.safetensors"), TensorFile(tmp_path / "s.safetensors")):
        again = ClientStates.from_state(read, torch.float16)
        assert len(again) == len(store) == 3001
        for client in range(3001):
            a, b = store.held(client), again.held(client)
            assert set(a) == set(b) and all(torch.equal(a[k], b[k]) and
                                            a[k].dtype == b[k].dtype for k in a), client


def test_disk_store__puts_back_its_checkpoints_snapshot_and_names_what_is_missing(tmp_path):
    """The store on disk: entries as the memory store holds them; a snapshot taken for a
    checkpoint survives the rounds after it and is what ``load`` gives back; the snapshot
    before it is kept, older ones and those of checkpoints never written deleted."""
    from dcco.core.disk_states import SNAPSHOT_KEY, DiskClientStates

    store = DiskClientStates(tmp_path / "states", torch.float16)
    memory = ClientStates(torch.float16)
    entry = {"w": torch.full((3,), 1 / 3), SCALE: torch.tensor(0.1, dtype=torch.float64)}
    for s in (store, memory):
        s.put(5, entry)
    assert 5 in store and 6 not in store and store.get(6) is None and len(store) == 1
    got = store.get(5)
    assert got.keys() == memory.get(5).keys() and all(
        torch.equal(got[k], memory.get(5)[k]) and got[k].dtype == memory.get(5)[k].dtype
        for k in got)
    assert store.nbytes > 3 * 2 + 8  # the file: its header and its bytes
    first = store.state()
    store.put(5, {"w": torch.zeros(3)})  # a round after the checkpoint
    store.put(7, {"w": torch.ones(3)})
    second = store.state()
    third = store.state()
    assert [int(x[SNAPSHOT_KEY]) for x in (first, second, third)] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "states").iterdir()) == [
        "live", "snapshot-2", "snapshot-3"]
    store.load(second)  # a crash before the third checkpoint was written
    assert sorted(p.name for p in (tmp_path / "states").iterdir()) == ["live", "snapshot-2"]
    assert len(store) == 2 and torch.equal(store.get(7)["w"], torch.ones(3))
    again = DiskClientStates(tmp_path / "states", torch.float16)  # a new process
    assert len(again) == 0
    again.load(second)
    assert torch.equal(again.get(5)["w"], torch.zeros(3)) and 7 in again
    with pytest.raises(ValueError, match="snapshot-1, are missing"):
        again.load(first)
    with pytest.raises(ValueError, match="client_state_store = 'memory'"):
        again.load(memory.state())


def test_disk_store__refused_where_it_would_not_fit_or_over_ranks(tiny_config, monkeypatch,
                                                                  tmp_path):
    import os
    import shutil
    from collections import namedtuple

    from dcco.core.disk_states import bytes_under

    cfg = load_config(tiny_config(method="fedema"), ["train.client_state_store=\"disk\""])
    train, _ = load_splits(cfg)
    pt = Pretraining.of(cfg, train, state_dir=tmp_path / "states")
    assert type(pt.client_states).__name__ == "DiskClientStates"
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100, 90, 10))
    with pytest.raises(ConfigError, match="GiB free on the disk of"):
        Pretraining.of(cfg, train, state_dir=tmp_path / "states")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(ConfigError, match="GiB free on the disk of"):
        Pretraining.of(cfg, train)  # refused before its temporary folder is made
    assert not any((tmp_path / "tmp").iterdir())
    # a resumed run's own files will be replaced: they count as free (a link once)
    old = tmp_path / "states" / "snapshot-1"
    old.mkdir()
    with open(old / "1.safetensors", "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB by its size, none on disk
    os.link(old / "1.safetensors", tmp_path / "states" / "live" / "1.safetensors")
    assert bytes_under(tmp_path / "states") == 1 << 30
    Pretraining.of(cfg, train, state_dir=tmp_path / "states")
    monkeypatch.setattr("dcco.run.setup.rank_and_size", lambda: (0, 2))
    with pytest.raises(ConfigError, match="runs in one process"):
        Pretraining.of(cfg, train, state_dir=tmp_path / "states")


def _run(cfg, train, rounds):
    pt = Pretraining.of(cfg, train)
    for _ in range(rounds):
        pt.step()
    return pt


@pytest.mark.parametrize("method,store", [("fedu", "memory"), ("fedema", "memory"),
                                          ("moco_fedavg", "memory"), ("fedema", "disk"),
                                          ("moco_fedavg", "disk")])
def test_stateful_run__keeps_every_participant_and_resumes_bit_identically(
        tiny_config, tmp_path, method, store):
    """In memory and on disk (``dcco.core.disk_states``), where the resumed run's store is
    put back from the checkpoint's snapshot after the uninterrupted rounds moved on."""
    from safetensors.torch import load_file

    from dcco.run.checkpoint import save_checkpoint

    cfg = load_config(tiny_config(method=method, rounds=4, checkpoint_every=2),
                      ["data.num_clients=6", "train.local_steps=2", "optim.optimizer=\"sgd\"",
                       "optim.lr=1.0", "train.local_lr=0.05", "loss.moco_queue=5",
                       f"train.client_state_store=\"{store}\""])
    train, _ = load_splits(cfg)
    pt = _run(cfg, train, 4)
    seen = set()
    for r in range(4):
        seen |= set(plan_round(cfg, pt.partition, r).clients.tolist())
    assert len(pt.client_states) == len(seen) > 4  # some came back
    if method == "fedema":  # a returning client's λ was set at its first mix
        assert any(SCALE in pt.client_states.held(c) for c in seen)
    if method == "moco_fedavg":  # each client's queue: 4 keys a round, the newest 5 kept
        queues = [pt.client_states.held(c)["moco.queue"] for c in seen]
        assert {q.shape for q in queues} == {torch.Size([4, 16]), torch.Size([5, 16])}
    whole = RunDir.create(tmp_path / "whole", cfg)
    run_pretraining(cfg, whole, train)
    stopped = RunDir.create(tmp_path / "stopped", cfg)
    half = Pretraining.of(cfg, train, state_dir=stopped.client_states_path)
    for _ in range(2):
        half.step()
    save_checkpoint(stopped.checkpoint_path, half.model, half.optimizer, 2,
                    state=half.round_state())
    for _ in range(2):  # rounds past the checkpoint, lost with the process
        half.step()
    del half
    run_pretraining(cfg, stopped, train, resume=True)
    a, b = load_file(whole.checkpoint_path), load_file(stopped.checkpoint_path)
    assert a.keys() == b.keys() and any(k.startswith("state.client_state") for k in a)
    for key in a:
        if key != "state.client_state_disk.snapshot":
            assert torch.equal(a[key], b[key]), key
    if store == "disk":  # each client's file, to the bit
        last = [RunDir(tmp_path / name).client_states_path for name in ("whole", "stopped")]
        files = [sorted(p.name for p in (d / "live").iterdir()) for d in last]
        assert files[0] == files[1] and len(files[0]) == len(seen)
        for name in files[0]:
            x, y = (load_file(d / "live" / name) for d in last)
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name


@pytest.mark.parametrize("method,threshold,measure", [
    ("fedu", 1e9, "receipt"), ("fedu", 0.0, "receipt"), ("fedema", 0.4, "receipt"),
    ("fedu", 1e9, "travelled"), ("fedema", 0.4, "travelled"), ("fedema", 0.4, "selective")])
def test_stateful_run__logs_its_returning_clients_and_what_their_divergence_made(
        tiny_config, tmp_path, method, threshold, measure):
    """metrics.jsonl says, round by round, how many clients came back with a model of their
    own (counted here from the plan) and what their divergence made: FedU's share that took
    the global predictor (all of them under an infinite threshold, none under 0), FedEMA's
    mean μ in (0, 1], and 0 in a selective round whose returning clients skipped a round."""
    rounds_run = 6 if measure == "selective" else 4
    cfg = load_config(tiny_config(method=method, rounds=rounds_run),
                      [f"data.num_clients={10 if measure == 'selective' else 6}", "train.log_every=1", "train.local_steps=2",
                       "train.local_lr=0.05", f"loss.fedu_threshold={threshold}",
                       "loss.divergence=\"{}\"".format("receipt" if measure == "receipt"
                                                        else "travelled"),
                       "loss.fedema_mix=\"{}\"".format("selective" if measure == "selective"
                                                       else "always")])
    train, _ = load_splits(cfg)
    run = RunDir.create(tmp_path / "run", cfg)
    run_pretraining(cfg, run, train)
    records = [r for r in run.metrics() if "loss" in r]
    partition, seen, returning, rounds = Pretraining.of(cfg, train).partition, set(), [], []
    for r in range(rounds_run):
        clients = plan_round(cfg, partition, r).clients.tolist()
        rounds.append(clients)
        returning.append(sum(c in seen for c in clients))
        seen |= set(clients)
    assert [r["returning_clients"] for r in records] == returning and sum(returning) > 0
    came = [r for r in records if r["returning_clients"]]
    assert all(r["divergence"] > 0 for r in came)
    if method == "fedu":
        assert {r["fedu_global_predictor"] for r in came} == {1.0 if threshold else 0.0}
    else:
        assert all(0 <= r["fedema_mu"] <= 1 for r in came)
        assert "fedu_global_predictor" not in came[0]
        # a round's mean μ is 0 exactly where none of its clients mixed: under "selective",
        # where none trained in the round just before
        mixed = [bool(returning[r]) if measure != "selective" else
                 bool(set(rounds[r]) & set(rounds[r - 1])) for r in range(rounds_run)]
        assert [r["fedema_mu"] > 0 for r in came] == [m for m, n in zip(mixed, returning,
                                                                          strict=True) if n]
        if measure == "selective":  # the plan has a round whose returning clients skipped
            assert any(n and not m for m, n in zip(mixed, returning, strict=True))


def test_stateful_methods__refused_where_not_implemented(tiny_config, monkeypatch, tmp_path):
    from dcco.flower import DCCOStrategy as Strategy
    from dcco.flower import SecAgg
    from dcco.flower.appconfig import parse_run_config

    path = tiny_config(method="fedema")
    with pytest.raises(ConfigError, match="differential privacy"):
        validate(load_config(path, ["privacy.noise_multiplier=1.0",
                                    "privacy.target_epsilon=\"none\""]))
    for setting in ("train.local_optimizer=\"layerwise\"",
                    "train.pseudo_gradient=\"mean_gradient\""):  # W_k − W_g is no gradient
        with pytest.raises(ConfigError, match="start from their own model"):
            validate(load_config(path, ["train.local_steps=2", setting]))
    assert parse_run_config({"train.method": "fedu"})[0].train.method == "fedu"  # dcco's app
    with pytest.raises(ValueError, match="under SecAgg"):  # a node's state, masked sums
        Strategy(method="fedema", secagg=SecAgg(torch.nn.Linear(4, 4), torch.zeros(2, 4), 8))
    cfg = load_config(path)
    train, _ = load_splits(cfg)
    monkeypatch.setattr("dcco.run.stores.MAX_STATE_BYTES", 1 << 10)
    with pytest.raises(ConfigError, match="client_state_store = 'disk'.*client_state_dtype "
                                          "= 'float16'"):
        Pretraining.of(cfg, train)


def test_stateful_store_too_large__refused_before_any_run_directory(
        tiny_config, tiny_fmnist, monkeypatch, tmp_path, capsys):
    """The clients' store is sized before anything is written: ``dcco pretrain``,
    ``dcco reproduce`` and ``dcco.fit`` refuse it, naming the size, and leave no folder."""
    from dcco.cli import main
    from dcco.fitting import fit

    monkeypatch.setattr("dcco.run.stores.MAX_STATE_BYTES", 1 << 10)
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(method="fedu")), "--run-dir", str(run),
                 "--no-progress"]) == 2
    assert "fedu's clients keep state between their rounds" in capsys.readouterr().err
    assert not run.exists()
    grid = tiny_grid(tmp_path, tiny_fmnist, 2, ["fedu"])
    out = tmp_path / "cells"
    assert main(["reproduce", str(grid), "--scale", "tiny", "--out", str(out),
                 "--no-progress"]) == 2
    assert "cell iid-2-fedu-s0: fedu's clients keep state" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())
    gen = torch.Generator().manual_seed(0)
    clients = {f"phone-{k}": torch.randint(0, 256, (3, 1, 8, 8), generator=gen,
                                           dtype=torch.uint8) for k in range(8)}
    encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16))
    with pytest.raises(ConfigError, match="fedu's clients keep state"):
        fit(encoder, clients, method="fedu", rounds=2, clients_per_round=4,
            projector=(12, 16), augment=lambda x: x.float() / 255, run_dir=tmp_path / "fit",
            progress=False)
    assert not (tmp_path / "fit").exists()


def _infonce_written_out(q1, q2, k1, k2, queue, tau):
    """MoCo's symmetrised InfoNCE, one query at a time, from its definition."""
    total, n = 0.0, q1.shape[0]
    for i in range(n):
        for q, keys in ((q1[i], k2), (q2[i], k1)):
            q = q / q.norm()
            cands = [k / k.norm() for k in keys] + list(queue)
            logits = torch.stack([q @ c / tau for c in cands])
            total = total - (logits[i] - torch.logsumexp(logits, 0))
    return total / (2 * n)


def test_moco_loss__is_infonce_written_out():
    from dcco.core.losses import moco_loss_per_sample

    gen = torch.Generator().manual_seed(3)
    q1, q2, k1, k2 = (torch.randn(5, 6, generator=gen, dtype=torch.float64) for _ in range(4))
    queue = torch.nn.functional.normalize(torch.randn(7, 6, generator=gen,
                                                      dtype=torch.float64), dim=1)
    for u in (queue, queue[:0]):
        got = moco_loss_per_sample(q1, q2, k1, k2, u, 0.2).mean()
        torch.testing.assert_close(got, _infonce_written_out(q1, q2, k1, k2, u, 0.2),
                                   rtol=1e-12, atol=1e-12)


def test_moco_one_client_one_step__is_a_centralized_moco_step_and_queues_its_keys(
        tiny_config):
    from dcco.core.losses import split_prediction
    from dcco.methods.moco import QUEUE, MoCoFedAvg

    torch.manual_seed(1)
    model = _byol_model(tiny_config, "moco_fedavg")
    assert model.predictor is None and model.target is not None
    x1, x2 = (torch.randn(4, 1, 28, 28, dtype=torch.float64) for _ in range(2))
    store, lr, tau = ClientStates(), 0.5, 0.9
    method = MoCoFedAvg(LossConfig(moco_queue=10))
    result = run_round(model, Algorithm(method, local_lr=lr), x1, x2, Segments.from_counts([4]),
                       "reference", states=RoundStates([3], store, tau, 0))
    # the oracle: InfoNCE with the keys of a key encoder equal to the query encoder
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    f, g = model(x1, x2)
    (q1, k1), (q2, k2) = split_prediction(f), split_prediction(g)
    loss = _infonce_written_out(q1, q2, k1.detach(), k2.detach(), [], 0.2)
    grads = torch.autograd.grad(loss, [p for _, p in named])
    for (name, _), gr in zip(named, grads, strict=True):
        torch.testing.assert_close(result.pseudo_gradient[name], lr * gr, rtol=1e-10,
                                   atol=1e-13)
    # the queue: both views' keys from the key encoder one average step after the round's start
    key = copy.deepcopy(model)
    with torch.no_grad():
        for (name, p), gr in zip(named, grads, strict=True):
            dict(key.named_parameters())[name].sub_(lr * gr)
    target = copy.deepcopy(model.target)
    with torch.no_grad():
        online = [*key.backbone.parameters(), *key.projector.parameters()]
        for xi, theta in zip(target.parameters(), online, strict=True):
            xi.lerp_(theta, 1 - tau)
        keys = torch.nn.functional.normalize(torch.cat([target(x1), target(x2)]), dim=1)
    queue = store.get(3, dtype=torch.float64)[QUEUE]
    assert queue.shape == (8, 16)  # 4 samples, 2 views: 8 keys of the 10 the queue holds
    torch.testing.assert_close(queue, keys, rtol=1e-10, atol=1e-12)
    # the next round's loss contrasts with that queue as well
    again = run_round(model, Algorithm(method, local_lr=lr), x1, x2, Segments.from_counts([4]),
                      "reference", states=RoundStates([3], store, tau, 0))
    f, g = model(x1, x2)
    (q1, k1), (q2, k2) = split_prediction(f), split_prediction(g)
    with torch.no_grad():
        expected = _infonce_written_out(q1, q2, k1, k2, list(queue), 0.2)
    assert again.loss == pytest.approx(float(expected), rel=1e-10)
    pushed = store.get(3, dtype=torch.float64)[QUEUE]  # 8 new keys, then the 2 newest old
    assert pushed.shape == (10, 16) and torch.equal(pushed[8:], queue[:2])


@pytest.mark.parametrize("grid_file,scale,cells", [
    ("fedssl_fmnist.toml", "one-step-bn", 30), ("fedssl_fmnist.toml", "paper-local-bn", 30),
    ("fedssl_cross_silo_fmnist.toml", "small", 21),
    ("fedssl_cross_silo_dcco_fmnist.toml", "small", 12),
    ("fedssl_cross_silo_fedsc_fmnist.toml", "small", 3),
    ("fedssl_cross_silo_one_step_fmnist.toml", "small", 15)])
def test_fedssl_grid__every_cell_is_valid_and_its_store_fits(grid_file, scale, cells,
                                                             tmp_path):
    """The comparison's grids: every cell's config validates, and the clients' store of a
    stateful cell (the clients its rounds sample, exactly) stays under the limit."""
    from pathlib import Path

    from dcco.core.client_state import DTYPES, MAX_STATE_BYTES
    from dcco.methods.registry import build_method
    from dcco.reproduce.grid import load_grid
    from dcco.reproduce.plan import plan_cells

    grid = load_grid(Path(__file__).parents[1] / "experiments" / grid_file, scale)
    planned = plan_cells(grid, tmp_path)
    assert len(planned) == cells and all(c.na is None for c in planned)
    for cell in planned:
        cfg = validate(cell.cfg)
        method = build_method(cfg.train.method, cfg.loss)
        if getattr(method, "stateful", False):
            t = cfg.train
            entry = state_bytes(method.state_shapes(build_model(cfg, 1)),
                                DTYPES[t.client_state_dtype])
            clients = cfg.data.num_clients or 60_000 // cfg.data.samples_per_client
            seen = clients_seen(t.seed, t.rounds, clients, t.clients_per_round)
            assert seen * entry <= MAX_STATE_BYTES, cell.path.name


@pytest.mark.parametrize("method", [FedU, FedEMA])
def test_travelled_divergence__is_the_authors_mean_conv_distance_and_drives_the_mix(
        tiny_config, method):
    """``loss.divergence = "travelled"``: what a client keeps is the mean over the online
    network's convolution weights of each one's L2 distance from its round's start (the
    authors' ``_calculate_divergence``), computed here by hand; on its return that number,
    not ‖W_g − W_k‖, decides FedU's predictor and FedEMA's μ."""
    torch.manual_seed(0)
    model = _byol_model(tiny_config, method.name)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    convs = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)
             and not n.startswith("target")]
    assert convs
    x1, x2 = (torch.randn(4, 1, 28, 28, dtype=torch.float64) for _ in range(2))
    store = ClientStates()
    algorithm = Algorithm(method(LossConfig(divergence="travelled")), local_lr=0.5)
    run_round(model, algorithm, x1, x2, Segments.from_counts([4]), "reference",
              states=RoundStates([7], store, 0.9, 0))
    kept = store.get(7, dtype=torch.float64)
    by_hand = sum(float(torch.linalg.vector_norm(kept[n] - start[n])) for n in convs) / len(convs)
    assert float(kept[TRAVELLED]) == pytest.approx(by_hand, rel=1e-12) and by_hand > 0
    layout = Layout.of(model)
    g = {n: p.detach() for n, p in model.named_parameters()}
    assert divergence(g, kept, layout.online) != pytest.approx(by_hand)  # another measure
    if method is FedU:
        for threshold, takes_global in ((math.nextafter(by_hand, 0.0), False),
                                        (math.nextafter(by_hand, 1.0), True)):
            fedu = FedU(LossConfig(divergence="travelled", fedu_threshold=threshold))
            mixed = fedu.client_start(g, kept, layout, 1)
            name = layout.predictor[0]
            assert torch.equal(mixed.weights[name], (g if takes_global else kept)[name])
    else:
        fedema = FedEMA(LossConfig(divergence="travelled", fedema_tau=0.7))
        assert fedema.returned(g, kept, layout, 1) == {"divergence": float(kept[TRAVELLED]),
                                                    "fedema_mu": pytest.approx(0.7)}
        later = kept | {SCALE: torch.tensor(0.7 / (2 * by_hand), dtype=torch.float64)}
        assert fedema.returned(g, later, layout, 1)["fedema_mu"] == pytest.approx(0.35)


def test_divergence_measure__unknown_names_refused():
    with pytest.raises(ValueError, match="loss.divergence must be 'receipt' or 'travelled'"):
        LossConfig(divergence="per-layer")


def test_fedema_selective__mixes_only_after_the_round_just_before(tiny_config):
    """``loss.fedema_mix = "selective"`` (the authors' ``selective_ema``): a client back from
    the round just before mixes as "always" does; one back after a gap starts from the
    global model as a new client does, keeping its λ; every start records its round."""
    selective = FedEMA(LossConfig(fedema_tau=0.7, fedema_mix="selective"))
    always = FedEMA(LossConfig(fedema_tau=0.7))
    g = _weights([3.0, 0.0], [1.0, 2.0])
    kept = _weights([0.0, 4.0], [5.0, -1.0], target=[7.0, 7.0]) | {
        "fedema.round": torch.tensor(4.0, dtype=torch.float64),
        SCALE: torch.tensor(0.1, dtype=torch.float64)}
    after = selective.client_start(g, kept, LAYOUT, 5)  # trained in round 4: mixes
    same = always.client_start(g, kept, LAYOUT, 5)
    for name in ("backbone.w", "predictor.w", "target.0.w"):
        assert torch.equal(after.weights[name], same.weights[name])
    assert float(after.keep["fedema.round"]) == 5.0 and float(after.keep[SCALE]) == 0.1
    assert selective.returned(g, kept, LAYOUT, 5)["fedema_mu"] == pytest.approx(0.5)
    gap = selective.client_start(g, kept, LAYOUT, 7)  # last trained in round 4: afresh
    fresh = selective.client_start(g, None, LAYOUT, 7)
    for name in ("backbone.w", "predictor.w", "target.0.w"):
        assert torch.equal(gap.weights[name], fresh.weights[name])
    assert torch.equal(gap.weights["target.0.w"], g["backbone.w"])
    assert float(gap.keep[SCALE]) == 0.1 and float(gap.keep["fedema.round"]) == 7.0
    assert selective.returned(g, kept, LAYOUT, 7)["fedema_mu"] == 0.0
    assert "fedema.round" not in always.client_start(g, kept, LAYOUT, 5).keep
    model = _byol_model(tiny_config, "fedema")
    assert "fedema.round" in selective.state_shapes(model)
    assert "fedema.round" not in always.state_shapes(model)
    with pytest.raises(ValueError, match="loss.fedema_mix must be 'always' or 'selective'"):
        LossConfig(fedema_mix="sometimes")
