"""The command line end to end on tiny data: config errors, pretrain/evaluate/compare, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.counting import count_the_runs_work
from safetensors.torch import load_file

from dcco.cli import main
from dcco.run.rundir import RunDir

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}


def dcco(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dcco.cli", *args], capture_output=True,
                          text=True, env=ENV, cwd=cwd, timeout=300, check=False)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.rounds_per_epoch=3", "train.rounds_per_epoch"),  # unknown key
        ("train.rounds=ten", "train.rounds"),  # wrong type
        ("train.method=byol", "train.method"),  # unknown method
        ("optim.lr=-1.0", "optim.lr"),  # out of range
        ("modle.widths=[4,8,8]", "modle"),  # unknown section
    ],
)
def test_cli_pretrain__bad_config_exits_nonzero_naming_the_key(tiny_config, tmp_path, override,
                                                              needle, capsys):
    code = main(["pretrain", str(tiny_config()), "--set", override,
                 "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and "error" in err
    assert not (tmp_path / "run").exists()


def test_cli_pretrain__unknown_key_in_file_is_named(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[train]\nmethod = 'dcco'\nlocal_epochs = 2\n")
    assert main(["pretrain", str(cfg), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "train.local_epochs" in err and "allowed:" in err


def test_cli__pretrain_evaluate_compare_end_to_end(tiny_config, tmp_path, capsys):
    runs = []
    for method in ("dcco", "cco_fedavg"):
        run = tmp_path / method
        assert main(["pretrain", str(tiny_config(method)), "--run-dir", str(run),
                     "--no-progress"]) == 0
        runs.append(run)
        for name in ("config.toml", "version.json", "metrics.jsonl", "checkpoint.safetensors",
                     "summary.json", "plots/loss.png", "plots/knn.png"):
            assert (run / name).is_file(), name
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses = [r for r in records if "loss" in r]
        assert [r["round"] for r in losses] == [2, 4, 6]
        assert all({"lr", "rounds_per_sec", "clients", "samples"} <= r.keys() for r in losses)
        assert losses[0]["clients"] == 4 and losses[0]["samples"] == 8
    assert main(["evaluate", str(runs[0]), "--protocol", "linear"]) == 0
    assert main(["evaluate", str(runs[0]), "--protocol", "finetune", "--labels", "20"]) == 0
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert {"linear@40", "finetune@20"} <= summary["evaluations"].keys()
    assert 0.0 <= summary["evaluations"]["linear@40"]["accuracy"] <= 1.0
    capsys.readouterr()
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "table")]) == 0
    out = capsys.readouterr().out
    assert "dcco" in out and "cco_fedavg" in out and "linear@40" in out
    md = (tmp_path / "table.md").read_text()
    assert md.count("\n") == 4 and "| dcco |" in md
    assert (tmp_path / "table.csv").read_text().startswith("run,method,")
    assert (tmp_path / "table-linear-40.png").is_file()


def test_cli_pretrain__probes_during_pretraining_record_the_probe_and_change_no_weight(
        tiny_config, tmp_path):
    from safetensors.torch import load_file

    from dcco.config import load_config

    weights, records = {}, {}
    for every in (0, 2):
        run = tmp_path / f"every-{every}"
        assert main(["pretrain", str(tiny_config("fedsc")), "--run-dir", str(run),
                     "--no-progress", "--set", f"train.probe_every={every}"]) == 0
        weights[every] = load_file(run / "checkpoint.safetensors")
        records[every] = [json.loads(x) for x in
                          (run / "metrics.jsonl").read_text().splitlines()]
    probes = [r for r in records[2] if "probe" in r]
    assert [r["round"] for r in probes] == [2, 4, 6]
    assert all(0.0 <= r["probe"] <= 1.0 and r["probe_labels"] == 40 for r in probes)
    assert not any("probe" in r for r in records[0])
    def losses(rs):  # the rates are timings
        return [{k: v for k, v in r.items() if k != "rounds_per_sec"} for r in rs if "loss" in r]

    assert losses(records[2]) == losses(records[0]) and len(losses(records[0])) == 3
    assert weights[0].keys() == weights[2].keys() and len(weights[0]) > 10
    for key in weights[0]:  # the probes drew no training randomness
        assert weights[0][key].equal(weights[2][key]), key
    with pytest.raises(ValueError, match="train.probe_every must be >= 0"):
        load_config(tiny_config(), ["train.probe_every=-1"])


def test_cli_pretrain__short_run_on_real_fashion_mnist(tmp_path):
    """The README's pretraining command on the real data (installed by .ci/run)."""
    config = Path(__file__).parents[1] / "configs" / "fmnist_small.toml"
    run = tmp_path / "real"
    done = dcco("pretrain", str(config), "--run-dir", str(run), "--set", "train.rounds=2",
                "--set", "train.clients_per_round=8", "--set", "eval.knn_bank=500",
                "--set", "eval.knn_queries=100", "--no-progress")
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["dataset"] == "fashion_mnist"
    assert 0.0 < summary["knn"] <= 1.0


def test_cli_pretrain__refuses_to_overwrite_an_existing_run(tiny_config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    before = (run / "checkpoint.safetensors").read_bytes()
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (run / "checkpoint.safetensors").read_bytes() == before


def test_cli_pretrain__sigkill_then_resume_gives_bit_identical_weights(tiny_config, tmp_path):
    cfg = tiny_config(rounds=120, checkpoint_every=10)
    reference = tmp_path / "uninterrupted"
    done = dcco("pretrain", str(cfg), "--run-dir", str(reference))
    assert done.returncode == 0, done.stderr

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "dcco.cli", "pretrain", str(cfg),
                             "--run-dir", str(killed)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until a checkpoint exists and a few rounds more ran
        if metrics.is_file() and any(json.loads(line).get("round", 0) >= 24
                                     for line in metrics.read_text().splitlines()[:-1]):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "summary.json").exists(), "the run finished before it was killed"

    resumed = dcco("pretrain", "--resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr
    a = load_file(reference / "checkpoint.safetensors")
    b = load_file(killed / "checkpoint.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].equal(b[key]), key
    rounds = [json.loads(x)["round"] for x in metrics.read_text().splitlines()
              if "loss" in json.loads(x)]
    assert rounds == list(range(2, 121, 2))  # every logged round exactly once


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_pretrain__a_signal_stops_at_a_checkpoint_even_in_the_background(tiny_config,
                                                                            tmp_path, signum):
    """A run started as ``nohup dcco pretrain ... &`` from a script (SIGINT ignored, as a
    non-interactive shell leaves it) still hears ``kill -INT`` and ``kill -TERM``: it stops at
    the end of its logging window with a checkpoint (none was due: checkpoint_every 1000),
    exits 130 naming the resume command, and the resumed run logs every round once."""
    cfg = tiny_config(rounds=100, checkpoint_every=1000)
    run = tmp_path / "run"
    ignoring = ["bash", "-c", 'trap "" INT; exec "$@"', "-"]  # SIGINT ignored, as nohup & has it
    proc = subprocess.Popen([*ignoring, sys.executable, "-m", "dcco.cli", "pretrain", str(cfg),
                             "--run-dir", str(run), "--no-progress"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # a few rounds, then the signal
        if metrics.is_file() and any(json.loads(line).get("round", 0) >= 4
                                     for line in metrics.read_text().splitlines()[:-1]):
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    stopped = records[-1]
    assert stopped.get("stopped") == "interrupted" and 4 <= stopped["round"] < 100
    assert (run / "checkpoint.safetensors").is_file() and not (run / "summary.json").exists()
    assert "stopping at the next checkpoint" in err
    assert f"stopped at round {stopped['round']} (interrupted)" in out
    assert f"dcco pretrain --resume {run}" in out
    if signum == signal.SIGTERM:
        return  # the resume below is the same for both
    resumed = dcco("pretrain", "--resume", str(run), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    rounds = [json.loads(x)["round"] for x in metrics.read_text().splitlines()
              if "loss" in json.loads(x)]
    assert rounds == list(range(2, 101, 2))


def test_interrupts__the_first_signal_asks_a_repeat_soon_after_is_the_same_a_later_one_stops(
        monkeypatch):
    from dcco.cli import signals as cli

    clock = [100.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    interrupts = cli.Interrupts()
    assert interrupts.stop() is None
    interrupts.handle(signal.SIGINT, None)
    assert interrupts.stop() == "interrupted"
    clock[0] += 1.0
    interrupts.handle(signal.SIGINT, None)  # the same Ctrl-C, passed on by a grid
    clock[0] += interrupts.same_s
    with pytest.raises(KeyboardInterrupt):
        interrupts.handle(signal.SIGTERM, None)


def test_cli_supervised__writes_a_run_with_its_accuracy(tiny_config, tmp_path, capsys):
    run = tmp_path / "sup"
    assert main(["supervised", str(tiny_config()), "--run-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "supervised"
    assert 0.0 <= summary["evaluations"]["supervised@40"]["accuracy"] <= 1.0
    assert "supervised from scratch with 40 labels" in capsys.readouterr().out


def test_cli__help_documents_every_command():
    top = dcco("--help")
    assert top.returncode == 0
    for command in ("pretrain", "evaluate", "supervised", "compare", "demo", "reproduce"):
        assert command in top.stdout
        sub = dcco(command, "--help")
        assert sub.returncode == 0 and "usage: dcco " + command in sub.stdout


# ----------------------------------------------------------------- what a new user met


def test_cli_pretrain__empty_or_folder_config_is_refused_by_name(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing set\n")
    assert main(["pretrain", str(empty), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "sets nothing" in err and "configs/" in err
    assert main(["pretrain", str(tmp_path), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "is a folder, not a TOML file" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_cli_pretrain__data_dir_option_is_used_or_refused(tiny_config, tiny_fmnist, tmp_path,
                                                         capsys):
    cfg = tiny_config(rounds=2)
    run = tmp_path / "elsewhere"
    assert main(["pretrain", str(cfg), "--data-dir", str(tmp_path / "typo"),
                 "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "typo") in err and "does not exist" in err
    assert not run.exists()  # nothing is created before the config and data are checked
    assert main(["pretrain", str(cfg), "--data-dir", str(tiny_fmnist), "--run-dir", str(run),
                 "--no-progress"]) == 0
    assert f'data_dir = "{tiny_fmnist}"' in (run / "config.toml").read_text()


def test_cli__unknown_option_shows_the_commands_usage():
    done = dcco("pretrain", "configs/fmnist_small.toml", "--data-folder", "x")
    assert done.returncode == 2
    assert "usage: dcco pretrain" in done.stderr and "--data-folder" in done.stderr


def test_cli_pretrain__a_run_that_never_started_can_be_rerun(tiny_config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--set", "train.clients_per_round=100000"]) == 2
    assert "train.clients_per_round" in capsys.readouterr().err
    assert not run.exists()  # the partition is checked before the run directory is made
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    assert "clients_per_round = 4" in (run / "config.toml").read_text()


def test_cli__internal_errors_keep_their_traceback(monkeypatch):
    import dcco.cli

    def bug(args):
        raise ValueError("an internal bug")

    monkeypatch.setitem(dcco.cli.COMMANDS, "compare", bug)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["compare", "x"])


def test_cli__interrupt_names_the_command_that_continues(tiny_config, tiny_fmnist, tmp_path,
                                                         monkeypatch, capsys):
    import dcco.run.loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dcco.run.loop, "run_pretraining", interrupted)
    run = tmp_path / "my run"
    assert main(["pretrain", str(tiny_config()), "--run-dir", str(run)]) == 130
    assert f"continue with: dcco pretrain --resume '{run}'" in capsys.readouterr().err
    demo = tmp_path / "demo"
    assert main(["demo", "--run-dir", str(demo), "--data-dir", str(tiny_fmnist),
                 "--set", "train.rounds=2"]) == 130
    err = capsys.readouterr().err
    assert (f"continue with: dcco demo --run-dir {demo} --data-dir {tiny_fmnist} "
            f"--set train.rounds=2") in err


def test_cli_compare__named_output_and_no_silent_overwrite(tiny_config, tmp_path, monkeypatch,
                                                          capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(run)]) == 0
    assert len(list(tmp_path.glob("comparison-*.md"))) == 1
    assert not (tmp_path / "comparison.md").exists()
    assert main(["compare", str(run), "--out", "table"]) == 0
    capsys.readouterr()
    assert main(["compare", str(run), "--out", "table"]) == 2
    assert "table.md" in capsys.readouterr().err
    assert main(["compare", str(run), "--out", "table", "--force"]) == 0


def test_cli_demo__refuses_a_run_directory_as_its_folder(tiny_config, tiny_fmnist, tmp_path,
                                                         capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    assert main(["demo", "--run-dir", str(run), "--data-dir", str(tiny_fmnist)]) == 2
    assert "is a pretraining run directory" in capsys.readouterr().err
    assert not (run / "dcco").exists()


def test_cli__progress_lines_in_a_log_agree_with_the_summary(tiny_config, tmp_path):
    """Off a terminal, pretraining and evaluation write plain progress lines; the loss and
    k-NN shown are the logged window mean and the k-NN in %, as in the summary."""
    run = tmp_path / "run"
    done = dcco("pretrain", str(tiny_config(rounds=6)), "--run-dir", str(run))
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("round ")]
    assert lines and lines[-1].startswith("round 6/6 (100%)")
    summary = json.loads((run / "summary.json").read_text())
    assert f"loss {summary['final_loss']:.4g}" in lines[-1]
    assert f"k-NN {100 * summary['knn']:.1f}%" in lines[-1]
    assert f"final loss {summary['final_loss']:.4g}" in done.stdout
    # the end-of-run line and the records name the monitor
    assert summary["knn_features"] == "standardized"
    assert f"{summary['knn_monitor']}: {100 * summary['knn']:.1f}%" in done.stdout
    assert summary["knn_monitor"].startswith("standardized k-NN (k 5, bank ")
    assert [r["knn_features"] for r in RunDir(run).metrics() if "knn" in r] == ["standardized"]
    done = dcco("evaluate", str(run), "--protocol", "knn", "--labels", "100")
    assert done.returncode == 0, done.stderr
    knn = json.loads((run / "summary.json").read_text())["evaluations"]["knn@100"]
    assert knn["details"]["features"] == "standardized" and knn["num_labels"] == 100
    assert f"test accuracy {100 * knn['accuracy']:.2f}%" in done.stdout
    done = dcco("evaluate", str(run))
    assert done.returncode == 0, done.stderr
    assert "probe step 30/30 (100%)" in done.stderr and "feature batch" in done.stderr


def test_count_the_runs_work__counts_a_scan_through_any_module(monkeypatch, tiny_fmnist):
    """The counters see a pass over the data wherever it is made: ``check_run``'s (through
    ``dcco.run.setup``) and one through ``dcco.data.samples`` itself."""
    import torch

    from dcco.data import samples

    counts = count_the_runs_work(monkeypatch)
    samples.refuse_non_finite(torch.zeros(2), "x")
    assert counts["scans"] == 1


def test_cli_pretrain__scans_partitions_and_builds_once_on_the_way_to_the_round(
        tiny_config, tmp_path, monkeypatch):
    """``dcco pretrain`` checks its run once (``dcco.run.setup.check_run``) and hands the
    checked run, its partition and model, to the pretraining: one pass over the data, one
    partition, one model; a resumed run is checked once too, by the loop."""
    counts = count_the_runs_work(monkeypatch)
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config("dcco")), "--run-dir", str(run),
                 "--no-progress", "--set", "train.rounds=2"]) == 0
    assert counts == {"scans": 1, "partitions": 1, "models": 1, "privacy": 0}
    from dcco.run.rundir import RunDir

    assert RunDir.open(run).summary()["rounds"] == 2


def test_cli_pretrain__a_private_run_makes_its_accounting_once(tiny_config, tmp_path,
                                                               monkeypatch):
    """Differential privacy's accounting (``Privacy.of``: the noise, the bounds, the
    sampling) is made once by ``check_run`` and taken as it is by the pretraining."""
    counts = count_the_runs_work(monkeypatch)
    assert main(["pretrain", str(tiny_config("dcco")), "--run-dir", str(tmp_path / "run"),
                 "--no-progress", "--set", "train.rounds=2",
                 "--set", "privacy.noise_multiplier=1.5"]) == 0
    assert counts == {"scans": 1, "partitions": 1, "models": 1, "privacy": 1}


def test_fit__scans_and_partitions_once_and_builds_no_model_of_the_config(tmp_path,
                                                                        monkeypatch):
    """``dcco.fit`` wraps the user's encoder itself and checks the run once with it: one
    pass over the samples, one partition, and no model built from the config."""
    import torch
    from torch import nn

    import dcco

    counts = count_the_runs_work(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    clients = {f"c{k}": torch.randn(4, 6, generator=gen) for k in range(8)}
    encoder = nn.Sequential(nn.Linear(6, 8), nn.GroupNorm(2, 8), nn.ReLU())
    done = dcco.fit(encoder, clients, rounds=2, clients_per_round=4, projector=(8, 8),
                    augment=lambda x: x + 0.1 * torch.randn_like(x), run_dir=tmp_path / "r",
                    progress=False)
    assert done.summary["rounds"] == 2
    assert counts == {"scans": 1, "partitions": 1, "models": 0, "privacy": 0}
