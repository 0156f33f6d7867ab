"""The validation split (``data.validation``) and tuning grids (``[tuning]``): the held-out
samples, a tuning cell that never opens the test split, the same budget for every method,
and the pick's written rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import make_fashion_mnist

from dcco.cli import main
from dcco.config import ConfigError, load_config
from dcco.data.validation import hold_out, validation_ids
from dcco.reproduce import load_grid, plan_cells
from dcco.reproduce.tuning import Candidate, Recipe, choose
from dcco.run.splits import load_splits

ROOT = Path(__file__).resolve().parents[1]

TUNING_GRID = """
[grid]
methods = ["dcco", "cco_fedavg"]
evaluations = ["linear@20"]
seeds = [0]

[[setting]]
name = "IID 2"
alpha = 1000.0
samples_per_client = 2
clients_per_round = 4

[base.data]
dataset = "fashion_mnist"
data_dir = "{data_dir}"

[base.model]
widths = [4, 8, 8]
projector = [16, 16, 16]

[base.train]
rounds = 4
knn_every = {knn_every}
log_every = 2
checkpoint_every = 1000

[base.eval]
probe_steps = 10
knn_bank = 40
knn_queries = 20

[scale.tune]
set = ["data.validation={validation}"]

[tuning]
select = "linear@20"
tie = 0.005

[tuning.dcco]
"optim.lr" = [0.005, 0.01]
"model.norm" = ["gn"]

[tuning.cco_fedavg]
"optim.lr" = [0.005, 0.01]
{extra}
"""


def _grid(tmp_path: Path, data_dir: Path, validation: int = 50, extra: str = "",
          knn_every: int = 0) -> Path:
    path = tmp_path / "tune.toml"
    path.write_text(TUNING_GRID.format(data_dir=data_dir, validation=validation, extra=extra,
                                       knn_every=knn_every))
    return path


def test_validation_ids__class_balanced_seeded_and_disjoint_from_what_is_left() -> None:
    labels = torch.arange(103) % 10
    ids = validation_ids(labels, 30, 10, seed=0)
    assert torch.equal(torch.bincount(labels[ids], minlength=10), torch.full((10,), 3))
    assert torch.equal(ids, validation_ids(labels, 30, 10, seed=0))
    assert not torch.equal(ids, validation_ids(labels, 30, 10, seed=1))
    # the probe's label stream is another: seed 0's validation is not seed 0's labels
    from dcco.evaluate import labelled_subset

    assert not torch.equal(ids, labelled_subset(labels, 30, 10, 0))


def test_hold_out__splits_the_training_set_in_two_without_overlap(tiny_fmnist) -> None:
    from dcco.data.sources import load_split

    train = load_split("fashion_mnist", "train", tiny_fmnist)
    rest, held = hold_out(train, 50, seed=0)
    assert len(rest) + len(held) == len(train) and len(held) == 50
    rows = {bytes(x.numpy().tobytes()) + bytes([int(y)]) for x, y in
            zip(train.images, train.labels, strict=True)}
    assert len(rows) == len(train)  # every tiny image differs, so rows identify samples
    got_rest = {bytes(x.numpy().tobytes()) + bytes([int(y)]) for x, y in
                zip(rest.images, rest.labels, strict=True)}
    got_held = {bytes(x.numpy().tobytes()) + bytes([int(y)]) for x, y in
                zip(held.images, held.labels, strict=True)}
    assert not got_rest & got_held and got_rest | got_held == rows


def test_validation__too_many_held_out_is_refused_by_name(tiny_fmnist) -> None:
    from dcco.data.datasets import DataError

    cfg = load_config(None, [f"data.data_dir={tiny_fmnist}", "data.validation=300"])
    with pytest.raises(DataError, match="fewer than the training split's 300"):
        load_splits(cfg)
    few = torch.tensor([0, 0] + [1] * 20)
    with pytest.raises(DataError, match="holds out 5 samples of class 0, but the training "
                                        "split has 2"):
        validation_ids(few, 10, 2, seed=0)


def test_validation__refused_for_natural_clients() -> None:
    with pytest.raises(ConfigError, match="hold out whole clients yourself"):
        load_config(None, ["data.dataset=\"fed_emnist\"", "data.partition=\"natural\"",
                           "data.validation=10"])


def test_tuning_cell__never_opens_the_test_split(tmp_path) -> None:
    """The test split's files are deleted: a tuning grid (the k-NN monitor on too) still
    pretrains and evaluates every recipe of every method, scoring the held-out samples, and
    writes the pick."""
    data = make_fashion_mnist(tmp_path / "data", n_train=300, n_test=100)
    for f in data.glob("t10k-*"):
        f.unlink()
    grid_file = _grid(tmp_path, data, validation=50, knn_every=2)
    out = tmp_path / "out"
    assert main(["reproduce", str(grid_file), "--scale", "tune", "--out", str(out),
                 "--no-progress", "--jobs", "1"]) == 0
    import json

    names = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert names == ["iid-2-cco_fedavg-r1-s0", "iid-2-cco_fedavg-r2-s0", "iid-2-dcco-r1-s0",
                     "iid-2-dcco-r2-s0"]
    for name in names:
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["evaluations"]["linear@20"]["num_test"] == 50
        split = json.loads((out / name / "split.json").read_text())
        assert split["validation"]["samples"] == 50 and split["train"]["samples"] == 250
        assert "the test split is not read" in split["rule"]
    assert len({json.loads((out / n / "split.json").read_text())["validation"]["sha256"]
                for n in names}) == 1  # every recipe is read on the same held-out samples
    picks = json.loads((out / "picks.json").read_text())
    assert set(picks["methods"]) == {"dcco", "cco_fedavg"}
    for record in picks["methods"].values():
        accuracies = [c["accuracy"] for c in record["candidates"]]
        assert all(a is not None for a in accuracies) and record["pick"] in ("r1", "r2")
        best = max(accuracies)
        first = next(c["recipe"] for c in record["candidates"]
                     if c["accuracy"] >= best - 0.005 - 1e-12)
        assert record["pick"] == first
    assert "Tuning rule" in (out / "results.md").read_text()
    # the final grid: each method at its pick, read on the test split, now put back
    make_fashion_mnist(tmp_path / "data", n_train=300, n_test=100)
    final = tmp_path / "final.toml"
    final.write_text(_final_grid(grid_file, "out/picks.json"))
    done = tmp_path / "final-out"
    assert main(["reproduce", str(final), "--scale", "final", "--out", str(done),
                 "--no-progress", "--jobs", "1"]) == 0
    for method, record in picks["methods"].items():
        cell = done / f"iid-2-{method}-{record['pick']}-s0"
        summary = json.loads((cell / "summary.json").read_text())
        assert summary["evaluations"]["linear@20"]["num_test"] == 100  # the test split
        lr = float(record["overrides"][0].split("=")[1])
        assert load_config(cell / "config.toml").optim.lr == lr
    assert "| dcco |" in (done / "results.md").read_text()


def _final_grid(tuning_grid: Path, picks: str) -> str:
    """The tuning grid as a final grid: its [tuning] replaced by ``grid.picks``, its scale
    without the validation split."""
    text = tuning_grid.read_text()
    text = text[:text.index("[tuning]")].replace("[scale.tune]", "[scale.final]")
    text = text.replace('set = ["data.validation=50"]', "set = []")
    return text.replace("seeds = [0]\n", f"seeds = [0]\npicks = \"{picks}\"\n", 1)


def test_final_grid__runs_each_methods_pick_and_refuses_what_breaks_the_rule(tmp_path):
    """grid.picks: each method's cells at its picked recipe, named by it; refused where a
    method has no pick, where the scale still holds out a validation split, or beside a
    [tuning]."""
    import json

    tune = _grid(tmp_path, tmp_path / "unused")
    record = {"methods": {
        "dcco": {"pick": "r2", "overrides": ["optim.lr=0.01", "model.norm=\"gn\""],
                 "why": "r2, the highest"},
        "cco_fedavg": {"pick": "r1", "overrides": ["optim.lr=0.005"], "why": "r1"}}}
    (tmp_path / "picks.json").write_text(json.dumps(record))
    final = tmp_path / "final.toml"
    final.write_text(_final_grid(tune, "picks.json"))
    grid = load_grid(final, "final")
    cells = plan_cells(grid, tmp_path / "out")
    assert [c.path.name for c in cells] == ["iid-2-dcco-r2-s0", "iid-2-cco_fedavg-r1-s0"]
    assert [c.cfg.optim.lr for c in cells] == [0.01, 0.005]
    assert cells[0].cfg.model.norm == "gn" and cells[0].cfg.data.validation == 0
    record["methods"]["cco_fedavg"] = {"pick": None, "overrides": None,
                                       "why": "not yet recorded: r2"}
    (tmp_path / "picks.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="no pick for cco_fedavg yet \\(not yet recorded"):
        load_grid(final, "final")
    del record["methods"]["cco_fedavg"]
    (tmp_path / "picks.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="has no pick for cco_fedavg; its tuning grid"):
        load_grid(final, "final")
    (tmp_path / "picks.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a picks.json"):
        load_grid(final, "final")
    final.write_text(_final_grid(tune, "absent.json"))
    with pytest.raises(ConfigError, match="absent.json, which does not exist"):
        load_grid(final, "final")
    record["methods"]["cco_fedavg"] = {"pick": "r1", "overrides": ["optim.lr=0.005"]}
    (tmp_path / "picks.json").write_text(json.dumps(record))
    kept = _final_grid(tune, "picks.json").replace("set = []", 'set = ["data.validation=50"]')
    final.write_text(kept)
    with pytest.raises(ConfigError, match="read on the test split.*leave data.validation"):
        load_grid(final, "final")
    both = tune.read_text().replace("seeds = [0]\n", "seeds = [0]\npicks = \"picks.json\"\n", 1)
    final.write_text(both)
    with pytest.raises(ConfigError, match="either tunes"):
        load_grid(final, "tune")


def test_tuning_grid__refuses_unequal_budgets_missing_methods_and_no_validation(tmp_path):
    data = tmp_path / "unused"
    with pytest.raises(ConfigError, match="same tuning budget.*dcco 2, cco_fedavg 4"):
        load_grid(_grid(tmp_path, data, extra='"model.norm" = ["gn", "bn"]'), "tune")
    with pytest.raises(ConfigError, match="never reads the test split; set data.validation"):
        load_grid(_grid(tmp_path, data, validation=0), "tune")
    with pytest.raises(ConfigError, match="changes \\[data\\] or \\[eval\\]"):
        load_grid(_grid(tmp_path, data, extra='"eval.labels" = [10]'), "tune")
    text = _grid(tmp_path, data).read_text().replace('[tuning.cco_fedavg]\n"optim.lr" = '
                                                     '[0.005, 0.01]', "")
    (tmp_path / "missing.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"\[tuning.cco_fedavg\] is missing"):
        load_grid(tmp_path / "missing.toml", "tune")


def _candidates(*accuracies, excluded=()):
    return tuple(Candidate(Recipe(f"r{i}", ()), a, "collapse warning" if i in excluded
                           else None) for i, a in enumerate(accuracies, 1))


def test_choose__highest_without_a_warning_ties_to_the_first_listed() -> None:
    assert choose("m", _candidates(0.70, 0.72, 0.71), 0.005).recipe.name == "r2"
    tie = choose("m", _candidates(0.716, 0.72, 0.70), 0.005)
    assert tie.recipe.name == "r1" and "listed first within 0.5 points" in tie.why
    warned = choose("m", _candidates(0.70, 0.75, 0.71, excluded=(2,)), 0.005)
    assert warned.recipe.name == "r3"
    waiting = choose("m", _candidates(0.70, None), 0.005)
    assert waiting.recipe is None and "not yet recorded: r2" in waiting.why
    assert choose("m", _candidates(None, excluded=(1,)), 0.005).recipe is None


def test_fair_grid__every_method_six_recipes_on_the_validation_split_defaults_first() -> None:
    grid = load_grid(ROOT / "experiments" / "fair_fmnist.toml", "tune")
    assert grid.base.data.validation == 5000 and grid.tuning.tie == 0.005
    assert {len(r) for r in grid.tuning.recipes.values()} == {6}
    cells = plan_cells(grid, Path("out"))
    assert len(cells) == 6 * len(grid.methods)
    assert all(c.cfg.data.validation == 5000 for c in cells)
    first = {c.method: c.cfg for c in cells if c.recipe == "r1"}
    assert (first["dcco"].optim.lr, first["dcco"].optim.weight_decay) == (1.5, 1e-6)
    assert first["dcco"].model.norm == "gn"
    for m in ("byol_fedavg", "simsiam_fedavg", "moco_fedavg"):
        assert (first[m].optim.lr, first[m].model.norm) == (1.0, "bn")
    assert first["moco_fedavg"].loss.moco_directions == "mean"
    authors = {c.method: c.cfg for c in cells if c.recipe == "r2"}  # the authors' forms
    assert (first["fedu"].loss.divergence, authors["fedu"].loss.divergence) == (
        "receipt", "travelled")
    assert (first["fedema"].loss.fedema_mix, authors["fedema"].loss.fedema_mix) == (
        "always", "selective") and authors["fedema"].loss.divergence == "travelled"
    assert {first[m].model.norm for m in ("fedu", "fedema")} == {"bn"}
    rates = sorted({c.cfg.optim.lr for c in cells if c.method == "byol_fedavg"})
    assert rates == [0.5, 1.0, 2.0]  # x0.5, x1, x2 of the default


def test_peers_grid__l_dawa_tuned_under_the_fair_rule_as_its_ssl_methods_peers() -> None:
    """experiments/peers_fmnist.toml tunes L-DAWA (on SimCLR's loss, contrastive FedAvg)
    under fair_fmnist.toml's rule: the same scale, split, setting and tie, and contrastive
    FedAvg's six recipes exactly, but under L-DAWA's aggregation."""
    peers = load_grid(ROOT / "experiments" / "peers_fmnist.toml", "tune")
    fair = load_grid(ROOT / "experiments" / "fair_fmnist.toml", "tune")
    assert peers.base == fair.base and peers.settings == fair.settings
    assert (peers.seeds, peers.evaluations, peers.global_batch) == (
        fair.seeds, fair.evaluations, fair.global_batch)
    assert (peers.tuning.select, peers.tuning.tie) == (fair.tuning.select, fair.tuning.tie)
    ours = {c.path.name.replace("contrastive_fedavg+ldawa", "contrastive_fedavg"): c.cfg
            for c in plan_cells(peers, Path("out"))}
    theirs = {c.path.name: c.cfg for c in plan_cells(fair, Path("out"))
              if c.method == "contrastive_fedavg"}
    assert len(ours) == 6 and ours.keys() == theirs.keys()
    for name, cfg in ours.items():
        assert cfg.train.aggregation == "ldawa"
        assert replace(cfg, train=replace(cfg.train, aggregation="fedavg")) == theirs[name]


def test_fair_final_grid__every_method_at_its_committed_pick_on_the_test_split() -> None:
    """experiments/fair_fmnist_final.toml runs each method at the recipe that its tuning
    records picked (the committed picks.json), with the tuning scale's settings less the
    validation split: the same config as the tuning cell but for [data]'s held-out samples."""
    import json
    from dataclasses import replace

    final = load_grid(ROOT / "experiments" / "fair_fmnist_final.toml", "final")
    tune = load_grid(ROOT / "experiments" / "fair_fmnist.toml", "tune")
    record = json.loads((ROOT / "experiments" / "results" / "fair_fmnist-tune" / "picks.json")
                        .read_text())
    assert final.methods == tune.methods and final.base.data.validation == 0
    cells = plan_cells(final, Path("out"))
    assert len(cells) == 3 * (2 * (len(final.methods) - 1) + 1)  # centralized: no setting
    for method in final.methods:
        pick = record["methods"][method]["pick"]
        assert pick is not None, method
        picked = [c for c in cells if c.method == method]
        assert {c.recipe for c in picked} == {pick}
        tuned = tune.recipe_bases[method, pick]
        assert replace(final.recipe_bases[method, pick], data=tuned.data) == tuned, method


def test_fair_cross_silo_grid__the_same_picks_at_the_third_setting() -> None:
    """experiments/fair_fmnist_cross_silo.toml runs every method of the final grid at the same
    pick (the same overrides on the same scale), with only the setting's data, rounds, warm-up
    and checkpoint interval changed: 10 clients of 64 photos, all every round, 150 rounds."""
    from dataclasses import replace

    final = load_grid(ROOT / "experiments" / "fair_fmnist_final.toml", "final")
    silo = load_grid(ROOT / "experiments" / "fair_fmnist_cross_silo.toml", "final")
    assert silo.methods == final.methods and silo.picked == final.picked
    assert [s.name for s in silo.settings] == ["cross-silo Dir 0.1"]
    cells = plan_cells(silo, Path("out"))
    assert len(cells) == 3 * len(silo.methods) and all(c.na is None for c in cells)
    for method in silo.methods:
        (pick,) = {c.recipe for c in cells if c.method == method}
        ours, theirs = silo.recipe_bases[method, pick], final.recipe_bases[method, pick]
        assert ours.data.num_clients == 10 and ours.data.samples_per_client == 64
        assert (ours.train.rounds, ours.optim.warmup_rounds) == (150, 5)
        same = replace(ours, data=theirs.data,
                       train=replace(ours.train, rounds=theirs.train.rounds,
                                     checkpoint_every=theirs.train.checkpoint_every),
                       optim=replace(ours.optim, warmup_rounds=theirs.optim.warmup_rounds))
        assert same == theirs, method
    central = next(c for c in cells if c.method == "centralized_cco")
    assert central.cfg.train.clients_per_round * 64 == 640
