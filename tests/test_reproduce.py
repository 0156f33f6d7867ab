"""The experiment grid on tiny data: a two-cell grid runs, a rerun skips it, the table renders."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from helpers.counting import count_the_runs_work

from dcco.cli import main
from dcco.config import ConfigError
from dcco.reproduce import load_grid, plan_cells, run_machines, run_versions
from dcco.run.rundir import RunDir
from dcco.run.setup import projector

GRID = """
[grid]
methods = ["cco_fedavg", "dcco", "supervised"]
evaluations = ["linear@20"]
seeds = [0]

[[setting]]
name = "non-IID 1"
alpha = 0.0
samples_per_client = 1
clients_per_round = 4

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
rounds = 3
knn_every = 0
log_every = 1

[base.eval]
probe_steps = 10
scratch_epochs = 1
scratch_batch = 16
knn_bank = 50
knn_queries = 20

[scale.tiny]
set = ["train.rounds=2"]
"""


@pytest.fixture
def grid_file(tmp_path: Path, tiny_fmnist: Path) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(data_dir=tiny_fmnist))
    return path


def test_plan_cells__marks_one_sample_fedavg_na_and_shares_supervised(grid_file, tmp_path):
    grid = load_grid(grid_file, "tiny")
    cells = plan_cells(grid, tmp_path / "out")
    names = sorted(c.path.name for c in cells)
    assert names == ["iid-2-cco_fedavg-s0", "iid-2-dcco-s0", "non-iid-1-cco_fedavg-s0",
                     "non-iid-1-dcco-s0", "supervised-s0"]
    na = {c.path.name: c.na for c in cells if c.na}
    assert list(na) == ["non-iid-1-cco_fedavg-s0"] and "2 samples per client" in na[
        "non-iid-1-cco_fedavg-s0"]
    iid = next(c for c in cells if c.path.name == "iid-2-dcco-s0")
    assert (iid.cfg.data.alpha, iid.cfg.data.samples_per_client, iid.cfg.train.rounds) == (
        1000.0, 2, 2)


def test_plan_cells__a_method_with_a_server_aggregation_is_a_method_of_its_own(grid_file,
                                                                              tmp_path):
    """"cco_fedavg+ldawa": CCO + FedAvg under L-DAWA's server, with cells of its own beside
    CCO + FedAvg's; a name that is not a federated method and an aggregation is refused,
    named."""
    text = grid_file.read_text().replace('["cco_fedavg", "dcco", "supervised"]',
                                         '["cco_fedavg", "cco_fedavg+ldawa"]')
    good = tmp_path / "ldawa.toml"
    good.write_text(text)
    cells = {c.path.name: c for c in plan_cells(load_grid(good, "tiny"), tmp_path / "out")}
    ldawa, plain = cells["iid-2-cco_fedavg+ldawa-s0"], cells["iid-2-cco_fedavg-s0"]
    assert (ldawa.cfg.train.method, ldawa.cfg.train.aggregation) == ("cco_fedavg", "ldawa")
    assert (plain.cfg.train.method, plain.cfg.train.aggregation) == ("cco_fedavg", "fedavg")
    assert ldawa.method == "cco_fedavg+ldawa" and ldawa.cfg.data == plain.cfg.data
    assert "2 samples per client" in cells["non-iid-1-cco_fedavg+ldawa-s0"].na
    for name, why in (("cco_fedavg+krum", "server aggregation other than fedavg"),
                      ("centralized_cco+ldawa", "must be a federated method"),
                      ("cco_fedavg+fedavg", "other than fedavg"),
                      ("byol+ldawa", r"unknown method 'byol\+ldawa'")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text.replace('"cco_fedavg+ldawa"', f'"{name}"'))
        with pytest.raises(ConfigError, match=why):
            load_grid(bad, "tiny")


def test_reproduce__runs_grid_then_rerun_skips_finished_cells(grid_file, tmp_path, capsys):
    out, results = tmp_path / "out", tmp_path / "results.md"
    results.write_text("# Results\n\nhand-written text stays\n")
    args = ["reproduce", str(grid_file), "--scale", "tiny", "--out", str(out), "--results",
            str(results), "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "pretraining" in first and "supervised from scratch" in first
    stamp = (out / "iid-2-dcco-s0" / "checkpoint.safetensors").stat().st_mtime_ns
    assert main(args) == 0
    second = capsys.readouterr().out
    assert "pretraining" not in second and "evaluation" not in second
    assert (out / "iid-2-dcco-s0" / "checkpoint.safetensors").stat().st_mtime_ns == stamp
    text = results.read_text()
    assert text.startswith("# Results") and "hand-written text stays" in text
    assert text.count("reproduce:grid:tiny:begin") == 1
    dcco_row = next(line for line in text.splitlines() if line.startswith("| dcco |"))
    assert "—" not in dcco_row and "n/a" not in dcco_row
    fedavg_row = next(line for line in text.splitlines() if line.startswith("| cco_fedavg |"))
    assert fedavg_row.split("|")[2].strip() == "n/a"
    assert "5 runs complete" not in text and "4 of 4 runs complete" in text
    assert (f"Command: `dcco reproduce {grid_file} --scale tiny --out {out} --results "
            f"{results}`") in text  # the regenerating command, without --no-progress
    assert "Code: commit " in text and "(from the runs' `version.json`)" in text
    assert "Machine: 4 runs on " in text  # where the runs ran, read from them
    assert (tmp_path / "grid-tiny-trend.png").is_file()
    assert "The paper's claims, measured" in text and "| dcco − supervised |" in text
    assert "- DCCO against supervised training from scratch (dcco − supervised), linear@20: " \
        "the paper's sign in" not in text  # linear@20 has no counterpart in the paper
    assert "| dcco: IID − non-IID |" not in text  # the tiny grid has no non-IID 2 to pair with
    assert "Paper, CIFAR-100" in text and "| dcco | 51.7 | 49.6 |" in text

    # an evaluation recorded under an older protocol revision is run again
    summary_path = out / "supervised-s0" / "summary.json"
    summary = json.loads(summary_path.read_text())
    del summary["evaluations"]["supervised@20"]["revision"]  # as written before revisions
    summary_path.write_text(json.dumps(summary))
    assert main(args) == 0
    third = capsys.readouterr().out
    assert "supervised from scratch, 20 labels (again" in third and "pretraining" not in third
    again = json.loads(summary_path.read_text())["evaluations"]["supervised@20"]
    assert again["revision"] == 2

    # a pretrained cell whose checkpoint is gone cannot run a missing evaluation: it says so
    cell = out / "iid-2-dcco-s0"
    (cell / "checkpoint.safetensors").unlink()
    summary = json.loads((cell / "summary.json").read_text())
    del summary["evaluations"]["linear@20"]
    (cell / "summary.json").write_text(json.dumps(summary))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "[iid-2-dcco-s0] its pretraining finished, but its checkpoint" in err
    assert f"delete the folder {cell}" in err


def test_load_grid__errors_name_the_key(grid_file, tmp_path):
    with pytest.raises(ConfigError, match="no scale 'huge'"):
        load_grid(grid_file, "huge")
    bad = tmp_path / "bad.toml"
    bad.write_text(grid_file.read_text().replace('"dcco", "supervised"', '"dcco", "byol"'))
    with pytest.raises(ConfigError, match="grid.methods"):
        load_grid(bad, "tiny")
    bad.write_text(grid_file.read_text().replace("rounds = 3", "roundz = 3"))
    with pytest.raises(ConfigError, match="train.roundz"):
        load_grid(bad, "tiny")


@pytest.mark.parametrize("scale", ["small", "full"])
def test_table1_grid__shipped_file_loads_at_both_scales(scale, tmp_path):
    grid = load_grid(Path(__file__).parents[1] / "experiments" / "table1_fmnist.toml", scale)
    cells = plan_cells(grid, tmp_path)
    batch = 512 if scale == "full" else 128
    assert [s.samples_per_client * s.clients_per_round for s in grid.settings] == [batch] * 7
    # every pretraining cell, centralized included, steps on the same global batch
    pretraining = [c for c in cells if c.method != "supervised" and c.na is None]
    assert {c.cfg.train.clients_per_round * c.cfg.data.samples_per_client
            for c in pretraining} == {batch}
    assert any(c.method == "centralized_cco" for c in pretraining)
    assert sum(c.na is not None for c in cells) == 2 * len(grid.seeds)  # FedAvg at 1 sample
    if scale == "full":
        assert grid.base.model.stage_widths == (64, 128, 256) and grid.base.train.rounds == 100_000
    else:
        assert len(grid.seeds) >= 3


def test_cifar100_paper_preset__runs_on_tiny_cifar_files(tmp_path):
    """configs/cifar100_paper.toml (appendix B) on generated cifar-100-python files."""
    import pickle

    import numpy as np

    from dcco.config import load_config

    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for split, n in (("train", 400), ("test", 100)):
        with open(folder / split, "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"fine_labels": list(np.arange(n) % 100)}, fh)
    preset = Path(__file__).parents[1] / "configs" / "cifar100_paper.toml"
    cfg = load_config(preset)
    assert (cfg.data.dataset, cfg.data.alpha, cfg.data.samples_per_client) == ("cifar100", 0.0, 4)
    assert (cfg.train.rounds, cfg.train.clients_per_round, cfg.train.local_lr) == (100_000, 128,
                                                                                   1.0)
    assert (cfg.optim.optimizer, cfg.optim.lr, cfg.loss.lambd) == ("adam", 5e-3, 20.0)
    assert projector(cfg) == (1024, 1024, 1024) and cfg.augment.blur_p == (0.0, 0.0)
    run = tmp_path / "run"
    assert main(["pretrain", str(preset), "--run-dir", str(run), "--no-progress",
                 "--set", f'data.data_dir="{tmp_path}"', "--set", "train.rounds=1",
                 "--set", "train.clients_per_round=8", "--set", "model.widths=[4,8,8]",
                 "--set", "model.projector=[32,32,32]", "--set", "eval.knn_bank=50",
                 "--set", "eval.knn_queries=20"]) == 0
    assert (run / "checkpoint.safetensors").is_file()


def test_claims_table__differences_with_standard_errors_beside_the_paper(tmp_path):
    """The claims are computed from the table: our mean differences ± standard error, the
    paper's value from Table 1 in brackets."""
    from dcco.reproduce import Estimate, claims_table, measured

    grid = load_grid(Path(__file__).parents[1] / "experiments" / "table1_fmnist.toml", "small")
    cells = plan_cells(grid, tmp_path)
    table = measured(grid, cells)
    assert all(v is None for rows in table.values() for row in rows.values()
               for v in row.values())  # nothing has run
    assert Estimate.of([0.70, 0.72, 0.74]).minus(Estimate.of([0.60, 0.60, 0.60])).value == (
        pytest.approx(12.0))
    diff = Estimate.of([0.70, 0.72, 0.74]).minus(Estimate.of([0.60, 0.62, 0.64]))
    assert diff.se == pytest.approx((2 * 2.0 ** 2 / 3) ** 0.5) and str(diff) == "+10.0 ± 1.6"
    text = claims_table(grid, cells)
    # with no runs, only the paper's values show: DCCO − best FedAvg at non-IID 4 on
    # CIFAR-100 is 49.6 − 31.1 (CCO + FedAvg failed there)
    row = next(line for line in text.splitlines() if line.startswith("| dcco − best FedAvg"))
    assert row.split("|")[3].strip() == "— (+18.5)"
    assert "| centralized_cco − dcco | — (+0.9) |" in text


def test_reproduce__checks_each_cell_once_and_trains_what_it_checked(grid_file, tmp_path,
                                                                    monkeypatch):
    """``dcco reproduce`` checks every cell before any folder exists and hands each cell's
    check (its scan of the data, its partition, its model) to its pretraining: in one
    process, one of each a cell, not two (the other two models are the trained encoders that
    the cells' linear@20 evaluations load)."""
    counts = count_the_runs_work(monkeypatch)
    assert main(["reproduce", str(grid_file), "--scale", "tiny", "--out", str(tmp_path / "o"),
                 "--no-progress", "--no-table", "--jobs", "1", "--cells", "iid-2-*"]) == 0
    assert counts == {"scans": 2, "partitions": 2, "models": 2 + 2, "privacy": 0}
    for cell in ("iid-2-dcco-s0", "iid-2-cco_fedavg-s0"):
        assert RunDir.open(tmp_path / "o" / cell).summary()["rounds"] == 2


def test_reproduce__cells_filter_and_busy_cells_skipped(grid_file, tmp_path, capsys):
    """--cells runs a subset; a cell another process holds (its lock) is skipped, not shared."""
    from dcco.reproduce import select_cells
    from dcco.run.rundir import RunDir, RunDirBusy

    out = tmp_path / "out"
    grid = load_grid(grid_file, "tiny")
    cells = plan_cells(grid, out)
    assert [c.path.name for c in select_cells(cells, ["iid-*"])] == ["iid-2-cco_fedavg-s0",
                                                                      "iid-2-dcco-s0"]
    with pytest.raises(ConfigError, match="no cell matches nothing-\\*"):
        select_cells(cells, ["nothing-*"])
    # patterns order the cells: the first pattern's cells first, each in the grid's order
    ordered = [c.path.name for c in select_cells(cells, ["iid-2-dcco-*", "*"])]
    assert ordered[0] == "iid-2-dcco-s0" and sorted(ordered) == sorted(c.path.name
                                                                       for c in cells)

    args = ["reproduce", str(grid_file), "--scale", "tiny", "--out", str(out), "--no-progress"]
    busy = RunDir(out / "iid-2-dcco-s0")
    busy.path.mkdir(parents=True)
    with busy.lock():
        with pytest.raises(RunDirBusy, match="in use by another process"), \
                RunDir(busy.path).lock():
            pass
        assert main(args + ["--cells", "iid-*"]) == 0
    text = capsys.readouterr().out
    assert "running 2 of them" in text and "non-iid" not in text.split("\n| method")[0]
    assert "[iid-2-dcco-s0] skipped: another process is working on it" in text
    assert (out / "iid-2-cco_fedavg-s0" / "summary.json").is_file()
    assert not (out / "iid-2-dcco-s0" / "config.toml").exists()  # untouched while busy
    assert main(args + ["--cells", "iid-2-dcco-*"]) == 0  # the lock went with the holder
    assert "pretraining" in capsys.readouterr().out


def test_claim_checks__paired_by_seed_held_not_held_or_undecided(tmp_path):
    """The mechanical verdict reads the per-seed differences: held where the paper's sign is
    sure (Student's t interval excludes 0), not held where the opposite sign is, undecided
    otherwise (one seed included)."""
    from dcco.evaluate import PROTOCOL_REVISION
    from dcco.reproduce import claim_checks, claims_table
    from dcco.reproduce.claims import Paired, paired_difference
    from dcco.run.evaluations import eval_key

    grid = load_grid(Path(__file__).parents[1] / "experiments" / "table1_fmnist.toml", "small")
    cells = plan_cells(grid, tmp_path)
    assert claim_checks(grid, cells) == ""  # nothing has run: nothing to check
    # linear@5000 only. Per seed, dcco − FedAvg is 5, 5, 8 at non-IID 4 (held), 5, 4, 6 at
    # non-IID 8 (held), -10, -11, -12 at non-IID 16 (not held), and one seed at IID 4.
    accuracy = {("dcco", "non-IID 4"): [0.70, 0.71, 0.72], ("dcco", "non-IID 8"): [0.70] * 3,
                ("dcco", "non-IID 16"): [0.55, 0.55, 0.52], ("dcco", "IID 4"): [0.75],
                ("cco_fedavg", "IID 4"): [0.70]}
    for method in ("cco_fedavg", "contrastive_fedavg"):
        for name in ("non-IID 4", "non-IID 8", "non-IID 16"):
            accuracy[method, name] = [0.65, 0.66, 0.64]
    for cell in cells:
        values = accuracy.get((cell.method, cell.setting and cell.setting.name))
        if values is None or cell.seed >= len(values):
            continue
        cell.path.mkdir(parents=True)
        entry = {"protocol": "linear", "accuracy": values[cell.seed],
                 "revision": PROTOCOL_REVISION.get("linear", 1)}
        (cell.path / "summary.json").write_text(
            json.dumps({"evaluations": {eval_key("linear", 5000): entry}}))
    text = claim_checks(grid, cells)
    line = next(x for x in text.splitlines() if "(dcco − best FedAvg), linear@5000" in x)
    assert ("held in 2 of 4 settings, not held in 1, undecided in 1 (1 of those settings have "
            "one seed so far)") in line
    mean = float(line.split("Mean over those settings: ")[1].split(" points")[0])
    assert mean == pytest.approx(statistics.fmean([6.0, 5.0, -11.0, 5.0]), abs=0.051)
    assert "linear@500:" not in text  # no linear@500 results were written
    table = claims_table(grid, cells)
    row = next(x for x in table.splitlines() if x.startswith("| dcco − best FedAvg"))
    assert "+6.0 ± 1.0 held (+18.5)" in row and "-11.0 ± 0.6 not held (+14.1)" in row
    assert "+5.0 undecided (+10.3)" in row
    # the pairing: a seed missing on one side is left out, and differences are per seed
    pair = paired_difference({0: 70.0, 1: 72.0, 2: 71.0}, {0: 60.0, 1: 61.0})
    assert pair == Paired(10.5, 0.5, 2) and pair.sure()  # 10.5 > t(1) × 0.5 = 6.4
    assert Paired(3.0, 1.0, 5).verdict(+2.0) == "held"  # t(4) = 2.78
    assert Paired(-3.0, 1.0, 5).verdict(+2.0) == "not held"
    assert Paired(2.0, 1.0, 5).verdict(+2.0) == "undecided"


def test_run_machines__one_entry_per_machine_with_counts_and_legacy_records(grid_file, tmp_path):
    cells = [c for c in plan_cells(load_grid(grid_file, "tiny"), tmp_path) if c.na is None]
    gpu = {"cpu": "Xeon (16 cores)", "gpu": "NVIDIA H100", "torch": "2.11.0", "python": "3.12"}
    cpu = gpu | {"gpu": "none"}
    legacy = {"machine": "x86_64 Linux", "host": "vm", "torch": "2.13.0", "python": "3.11"}
    for cell, info in zip(cells, [gpu, cpu, gpu, legacy], strict=True):
        cell.path.mkdir(parents=True)
        (cell.path / "version.json").write_text(json.dumps(info))
    assert run_machines(run_versions(cells)) == [
        "2 runs on Xeon (16 cores), NVIDIA H100; torch 2.11.0, Python 3.12",
        "1 run on Xeon (16 cores), no GPU; torch 2.11.0, Python 3.12",
        "1 run on x86_64 Linux (host vm); torch 2.13.0, Python 3.11",
    ]
    assert run_machines([]) == []


def test_table1_grid__gpu_scale_runs_with_paper_label_counts_per_class(tiny_fmnist, tmp_path):
    """The `gpu` scale (the paper's network and batch, R rounds) on tiny data with a tiny
    override of R and the network: its evaluations at 500 and 50 labels (the paper's 50 and 5
    per class) and supervised on each label set run, and the results block renders."""
    from dataclasses import replace

    from dcco.reproduce import results_markdown, run_cell
    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

    shipped = Path(__file__).parents[1] / "experiments" / "table1_fmnist.toml"
    grid = load_grid(shipped, "gpu")
    assert grid.base.train.rounds == 5000 and grid.base.model.stage_widths == (64, 128, 256)
    assert grid.evaluations == ("linear@5000", "linear@500", "linear@50", "finetune@5000")
    assert grid.base.optim.optimizer == "adam" and grid.base.optim.schedule == "cosine"
    assert {s.samples_per_client * s.clients_per_round for s in grid.settings} == {512}
    tiny = load_grid(shipped, "gpu", [
        f'data.data_dir="{tiny_fmnist}"', "train.rounds=2", "train.knn_every=0",
        "model.widths=[4, 8, 8]", "model.projector=[16, 16, 16]", "eval.probe_steps=5",
        "eval.finetune_steps=2", "eval.scratch_epochs=1", "eval.knn_k=5"])
    tiny = replace(tiny, evaluations=("linear@50", "linear@20"),
                   settings=tuple(replace(s, clients_per_round=4) for s in tiny.settings))
    cells = [c for c in plan_cells(tiny, tmp_path)
             if c.path.name in ("non-iid-4-dcco-s0", "supervised-s0")]
    splits = load_splits(tiny.base)
    for cell in cells:
        run_cell(cell, tiny.evaluations, splits, lambda cfg, run, tr, te, resume, stop:
                 run_pretraining(cfg, run, tr, te, resume, stop=stop), lambda s: None)
    dcco_run, supervised = (RunDir(c.path).summary()["evaluations"] for c in cells)
    assert {"linear@50", "linear@20"} <= dcco_run.keys()
    assert {"supervised@50", "supervised@20"} <= supervised.keys()
    text = results_markdown(tiny, cells, "dcco reproduce ...", None)
    assert "linear@50" in text and "Paper, CIFAR-100" in text


def test_reproduce__a_diverged_cell_is_marked_left_out_and_the_grid_goes_on(
        grid_file, tmp_path, capsys, monkeypatch):
    """A cell whose training diverges is recorded as diverged in its metrics, said in one line,
    and the next cells run; the next command does not train it again (training is
    deterministic), and the table says how many of a group diverged."""
    from dcco.run.pretraining import Diverged, Pretraining

    real = Pretraining.check_finite

    def dcco_diverges(self):
        if self.cfg.train.method == "dcco" and self.rounds_done >= 1:
            raise Diverged(1, "round 1: the loss is nan; training diverged")
        return real(self)

    monkeypatch.setattr(Pretraining, "check_finite", dcco_diverges)
    out = tmp_path / "out"
    args = ["reproduce", str(grid_file), "--scale", "tiny", "--out", str(out), "--no-progress",
            "--cells", "iid-2-*"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "[iid-2-dcco-s0] diverged: round 1: the loss is nan" in text
    assert "1 cells diverged (iid-2-dcco-s0)" in text
    assert (out / "iid-2-cco_fedavg-s0" / "summary.json").is_file()
    last = json.loads((out / "iid-2-dcco-s0" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["round"] == 1 and "the loss is nan" in last["diverged"]

    monkeypatch.setattr(Pretraining, "check_finite", real)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "[iid-2-dcco-s0] diverged before, at round 1; not run again" in text
    assert "(1 diverged)" in text.split("\n| method", 1)[1]


def test_pretrain__a_diverged_run_ends_with_one_line_and_status_3(tiny_config, tmp_path,
                                                                   capsys, monkeypatch):
    from dcco.run.pretraining import Diverged, Pretraining

    def diverges(self):
        raise Diverged(self.rounds_done, f"round {self.rounds_done}: the loss is nan; training "
                       f"diverged")

    monkeypatch.setattr(Pretraining, "check_finite", diverges)
    assert main(["pretrain", str(tiny_config()), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("dcco pretrain: training diverged: round ")


def test_reproduce__a_refused_cell_is_named_before_any_folder_exists(grid_file, tmp_path,
                                                                     capsys):
    out = tmp_path / "out"
    text = grid_file.read_text().replace('set = ["train.rounds=2"]',
                                         'set = ["train.rounds=2", "data.num_clients=3"]')
    grid_file.write_text(text)
    assert main(["reproduce", str(grid_file), "--scale", "tiny", "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cell iid-2-cco_fedavg-s0: train.clients_per_round = 4 but the partition has only 3" \
        in err
    assert not out.exists()
