"""Natural clients of 1–6 images (a generated HAM10000): every method's rounds, the round
equivalence where it holds, and the whole pipeline through the CLI: pretraining over lesions,
then the case-pooled probe and finetuning."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from helpers.client_tables import ham_histogram, make_ham10000, make_tff

from dcco.cli import main
from dcco.config import load_config
from dcco.core.simulator import run_round
from dcco.methods import Segments, build_method
from dcco.methods.registry import METHODS
from dcco.run.planning import build_partition, plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.splits import load_splits

CONFIG = """
[data]
dataset = "ham10000"
data_dir = "{data_dir}"
partition = "natural"
samples_per_client = 2

[table]
image_size = [12, 12]

[model]
widths = [4, 8, 8]
projector = [16, 16, 16]

[augment]
blur_p = [0.0, 0.0]

[train]
method = "{method}"
rounds = {rounds}
clients_per_round = 8
log_every = 2
checkpoint_every = 100
knn_every = 0
precision = "{precision}"

[optim]
lr = 0.005

[eval]
labels = 30
probe_steps = 20
probe_batch = 32
finetune_steps = 3
finetune_batch = 16
knn_k = 5
knn_bank = 100
knn_queries = 40
"""


@pytest.fixture(scope="module")
def ham(tmp_path_factory) -> Path:
    return make_ham10000(tmp_path_factory.mktemp("natural") / "HAM10000", lesions=160)


def _config(tmp_path: Path, ham: Path, method: str = "dcco", rounds: int = 4,
            precision: str = "float32") -> Path:
    path = tmp_path / f"{method}-{precision}.toml"
    path.write_text(CONFIG.format(data_dir=ham, method=method, rounds=rounds,
                                  precision=precision))
    return path


def _flat(result) -> torch.Tensor:
    return torch.cat([v.flatten() for v in result.pseudo_gradient.values()])


def test_natural_round__batched_equals_reference_equals_centralized_step(tmp_path, ham):
    """A DCCO round over 8 sampled lesions of 1–6 images is the centralized step on their
    pooled images (float64), in both backends."""
    cfg = load_config(_config(tmp_path, ham, precision="float64"))
    train, _ = load_splits(cfg)
    pt = Pretraining.of(cfg, train)
    assert pt.partition.num_clients == len(train.clients.unique())
    sizes = pt.partition.sizes
    assert int(sizes.min()) == 1 and int(sizes.max()) >= 4
    found = False
    for r in range(20):  # a round whose clients differ in size
        plan = plan_round(cfg, pt.partition, r)
        if len(set(plan.segments.counts.tolist())) > 2:
            found = True
            break
    assert found
    x1, x2 = pt.views(plan, r)
    results = {backend: run_round(pt.model, build_method("dcco"), x1, x2, plan.segments,
                                  backend) for backend in ("batched", "reference")}
    central = run_round(pt.model, build_method("centralized_cco"), x1, x2,
                        Segments.from_counts([x1.shape[0]]), "batched")
    for result in results.values():
        rel = float((_flat(result) - _flat(central)).norm() / _flat(central).norm())
        assert rel <= 1e-9


@pytest.mark.parametrize("method", sorted(m for m in METHODS if m not in (
    "byol_fedavg", "simsiam_fedavg", "centralized_byol", "centralized_simsiam", "clip_fedavg",
    "fedu", "fedema", "moco_fedavg")))
def test_natural_clients__every_method_trains_rounds(tmp_path, ham, method):
    """Each method runs rounds over the lesions; FedAvg baselines sample only lesions of at
    least 2 images, since their losses live within a client."""
    cfg = load_config(_config(tmp_path, ham, method=method, rounds=2))
    train, _ = load_splits(cfg)
    partition = build_partition(cfg, train)
    minimum = METHODS[method].min_client_samples
    assert int(partition.sizes.min()) == minimum if minimum > 1 else 1
    pt = Pretraining.of(cfg, train)
    for _ in range(2):
        m = pt.step()
        assert torch.isfinite(torch.as_tensor(m.loss))
    for backend in ("batched", "reference"):
        plan = plan_round(cfg, partition, 0)
        x1, x2 = pt.views(plan, 0)
        run_round(pt.model, pt.algorithm, x1, x2, plan.segments, backend)


def test_cli__pretrain_over_lesions_then_case_pooled_probe_and_finetuning(tmp_path, ham,
                                                                         capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(_config(tmp_path, ham, rounds=6)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    split = json.loads((run / "split.json").read_text())
    assert split["rule"] == "seeded by client" and split["client_column"] == "lesion_id"
    assert split["train"]["clients"] + split["test"]["clients"] == sum(
        ham_histogram(160).values())
    assert len(split["test"]["client_ids"]) == split["test"]["clients"]
    capsys.readouterr()
    for protocol in ("case_linear", "case_finetune"):
        assert main(["evaluate", str(run), "--protocol", protocol, "--labels", "30",
                     "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    for protocol in ("case_linear", "case_finetune"):
        result = summary["evaluations"][f"{protocol}@30"]
        assert result["num_labels"] == 30 and result["num_test"] == split["test"]["clients"]
        assert 0 <= result["accuracy"] <= 1
    # images without cases cannot be pooled
    assert main(["evaluate", str(run), "--protocol", "linear", "--labels", "30",
                 "--no-progress"]) == 0


def test_cli__a_table_of_one_class_pretrains_and_its_probe_is_refused_in_one_line(tmp_path,
                                                                                   capsys):
    """Pretraining needs no labels, so one diagnosis is enough for it; a probe needs two
    classes, and says so in one line naming the data set, before it trains anything."""
    folder = make_ham10000(tmp_path / "HAM10000", lesions=30)
    table = folder / "HAM10000_metadata.csv"
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(table, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "dx": "nv"} for r in rows)
    run = tmp_path / "run"
    assert main(["pretrain", str(_config(tmp_path, folder, rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    for protocol in ("case_linear", "linear"):
        assert main(["evaluate", str(run), "--protocol", protocol, "--labels", "10",
                     "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "has 1 class" in err[0] and "at least 2 classes" in err[0]
    assert "evaluations" not in json.loads((run / "summary.json").read_text())


def test_cli__case_probe_on_clients_of_several_labels_is_refused_naming_the_client(tmp_path,
                                                                                   capsys):
    """Clients that are users (a writer of many digits) are not cases: the case protocols
    say which client breaks the rule, in one line with exit 2, before any training."""
    folder = make_ham10000(tmp_path / "HAM10000", lesions=60)
    table = folder / "HAM10000_metadata.csv"
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    counts = {}
    for r in rows:
        counts[r["lesion_id"]] = counts.get(r["lesion_id"], 0) + 1
    lesion = next(k for k, n in counts.items() if n >= 2)
    mine = [r for r in rows if r["lesion_id"] == lesion]
    mine[-1]["dx"] = "mel" if mine[0]["dx"] != "mel" else "nv"
    with open(table, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    run = tmp_path / "run"
    cfg = _config(tmp_path, folder, rounds=2)
    assert main(["pretrain", str(cfg), "--run-dir", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--protocol", "case_linear", "--labels", "10",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(lesion) in err[0] and "2 labels" in err[0], err
    assert "evaluations" not in json.loads((run / "summary.json").read_text())


def test_cli__more_clients_a_round_than_the_data_has_is_refused_before_a_run_folder(
        tmp_path, capsys):
    folder = make_ham10000(tmp_path / "HAM10000", lesions=30)
    run = tmp_path / "run"
    assert main(["pretrain", str(_config(tmp_path, folder)), "--run-dir", str(run),
                 "--no-progress", "--set", "train.clients_per_round=500"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.clients_per_round = 500" in err[0], err
    assert not run.exists()


@pytest.mark.parametrize("name", ["fed_emnist", "fed_cifar100"])
def test_tff_presets__pretrain_in_natural_clients_then_probe_and_no_case_protocol(
        tmp_path, capsys, name):
    """The presets' own commands, on generated files of TFF's layout: their clients are users
    of several labels, so the image probe runs and the case probe is refused in one line."""
    for split, clients in (("train", 6), ("test", 3)):
        make_tff(tmp_path / "tff", name, split, clients=clients, per_client=10)
    preset = Path(__file__).parents[1] / "configs" / f"{name}_small.toml"
    run = tmp_path / "run"
    assert main(["pretrain", str(preset), "--data-dir", str(tmp_path / "tff"), "--run-dir",
                 str(run), "--no-progress", "--set", "train.rounds=2", "--set",
                 "train.clients_per_round=2", "--set", "train.knn_every=0", "--set",
                 "model.widths=[4, 8, 8]", "--set", "model.projector=[16, 16, 16]"]) == 0
    assert main(["evaluate", str(run), "--protocol", "linear", "--labels", "10",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--protocol", "case_linear", "--labels", "10",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use linear or finetune" in err[0], err
