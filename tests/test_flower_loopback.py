"""A real deployment: one SuperLink and 3 SuperNodes on 127.0.0.1, ``flwr run`` of the app.

Slow (every message starts a ``flwr-clientapp`` process that imports torch): marked ``slow``,
and ``.ci/run`` runs it with the rest of the suite.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from dcco.checkpoint import load_checkpoint
from dcco.client import trainable_parameters
from dcco.config import load_config
from dcco.flower.loopback import Loopback, seconds_per_round
from dcco.models import build_dual_encoder
from dcco.optim import build_optimizer

NODES = 3


# ----------------------------------------------------------------- the launcher as a user meets it

LAUNCHER = [sys.executable, "-m", "dcco.flower.loopback"]


def _tiny_overrides(data: Path, rounds: int) -> list[str]:
    return [f"--set=data.data_dir={json.dumps(str(data))}", "--set=data.samples_per_client=2",
            '--set=model.widths="[4, 8, 8]"', '--set=model.projector="[16, 16, 16]"',
            "--set=train.clients_per_round=4", f"--set=train.rounds={rounds}",
            "--set=train.knn_every=0", "--set=flower.min_nodes=1"]


def _started_by(home: Path) -> list[int]:
    """PIDs of live processes whose environment names this deployment's FLWR_HOME."""
    marker = f"FLWR_HOME={home}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                state = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(environ.parent.name))
        except (OSError, IndexError):
            continue
    return pids


def test_launcher__refuses_an_undeclared_key_or_a_bad_value_before_starting_anything(
        tmp_path, capsys):
    from dcco.flower.loopback import main

    out = tmp_path / "deploy"
    assert main(["--nodes", "1", "--out", str(out), "--set", "train.roundz=3"]) == 2
    err = capsys.readouterr().err
    assert "'train.roundz' is not declared by the app" in err and "'train.rounds'" in err
    assert main(["--nodes", "1", "--out", str(out), "--set", "train.rounds=three"]) == 2
    assert "train.rounds must be an integer, got 'three'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_launcher__a_signal_stops_every_process_it_started_with_one_line(
        tmp_path, tiny_fmnist, signum):
    out = tmp_path / "deploy"
    proc = subprocess.Popen(LAUNCHER + ["--nodes", "1", "--out", str(out)]
                            + _tiny_overrides(tiny_fmnist, rounds=500),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "run" / "metrics.jsonl").is_file():  # the ServerApp is training
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        assert _started_by(out / "flwr-home")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    expected = 130 if signum == signal.SIGINT else 128 + signum
    assert proc.returncode == expected, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "every process it started has been stopped" in err
    assert _started_by(out / "flwr-home") == []


@pytest.mark.slow
def test_launcher__a_failed_run_prints_flowers_reason(tmp_path, tiny_fmnist):
    out = tmp_path / "deploy"
    done = subprocess.run(LAUNCHER + ["--nodes", "1", "--out", str(out)]
                          + _tiny_overrides(tmp_path / "no-such-folder", rounds=1),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1
    assert "ended finished:failed: ServerApp failed with exception: the data directory" in \
        done.stderr
    assert "(data.data_dir or --data-dir) does not exist" in done.stderr
    assert "Traceback" not in done.stderr
    assert _started_by(out / "flwr-home") == []


@pytest.mark.slow
def test_flwr_run_local_simulation__trains_and_leaves_no_process(tmp_path, tiny_fmnist):
    """``flwr run`` on Flower's local simulation runtime (2 virtual SuperNodes), 2 rounds of
    the tiny model; the detached SuperLink it leaves is stopped afterwards."""
    from dcco.flower.loopback import LocalSimulation

    run_dir = tmp_path / "run"
    run_config = {
        "data.data_dir": str(tiny_fmnist), "data.samples_per_client": 2,
        "model.widths": "[4, 8, 8]", "model.projector": "[16, 16, 16]",
        "train.clients_per_round": 4, "train.rounds": 2, "train.log_every": 1,
        "train.knn_every": 0, "flower.min_nodes": 2, "flower.run_dir": str(run_dir),
    }
    sim = LocalSimulation(2, tmp_path / "sim")
    with sim:
        run_id = sim.submit(run_config)
        assert sim.wait(run_id, timeout=600) == "finished:completed", sim.details
        assert sim.alive()  # flwr run left its SuperLink running, as documented
    assert sim.alive() == []
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    windows = [r for r in records if "loss" in r]
    assert [r["round"] for r in windows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["replies"]["update"]["accepted"] == 2
               for r in windows)
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2


@pytest.mark.slow
def test_superlink_killed_and_restarted_with_resume__continues_to_the_configured_rounds(
        tmp_path, tiny_fmnist):
    """The whole deployment (SuperLink, ServerApp, SuperNodes) is killed once round 1's
    checkpoint is written; a new one started with ``flower.resume = true`` continues from the
    last checkpoint to the configured 3 rounds, logging each round once. (That the result is
    bit-identical to an uninterrupted run is tested in process,
    ``test_flower_resume__continues_from_the_checkpoint_bit_identically``: a third deployment
    here would double this test's minutes.)"""
    from dcco.flower.loopback import Loopback

    def config(resume: bool = False) -> dict:
        return {"data.data_dir": str(tiny_fmnist), "data.samples_per_client": 2,
                "model.widths": "[4, 8, 8]", "model.projector": "[16, 16, 16]",
                "train.clients_per_round": 4, "train.rounds": 3, "train.log_every": 1,
                "train.checkpoint_every": 1, "train.knn_every": 0, "flower.min_nodes": 2,
                "flower.run_dir": str(run), "flower.resume": resume}

    run = tmp_path / "run"
    patience = 12 * max(25.0, 12 * _import_seconds())  # see the fault test below
    first = Loopback(2, tmp_path / "deploy-1")
    with first:
        first.submit(config())
        deadline = time.monotonic() + patience
        while not (run / "checkpoint.safetensors").is_file():
            assert time.monotonic() < deadline, first.log_tails()
            time.sleep(0.2)
    assert first.alive() == []  # killed mid-run
    done_before = load_checkpoint(run / "checkpoint.safetensors", _net(run))
    assert 1 <= done_before < 3

    second = Loopback(2, tmp_path / "deploy-2")
    with second:
        run_id = second.submit(config(resume=True))
        assert second.wait(run_id, timeout=2 * patience) == "finished:completed", \
            second.details
    assert json.loads((run / "summary.json").read_text())["rounds"] == 3
    assert load_checkpoint(run / "checkpoint.safetensors", _net(run)) == 3
    rounds = [json.loads(line)["round"] for line in _lines(run / "metrics.jsonl")
              if "loss" in json.loads(line)]
    assert rounds == [1, 2, 3]


def _import_seconds() -> float:
    """How long a ClientApp's imports take on this machine now (a fresh process imports torch,
    flwr and dcco's app for every message): the unit the fault test scales its waits by."""
    code = "import time; t = time.perf_counter(); import dcco.flower.client_app; " \
           "print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=True)
    return float(done.stdout)


@pytest.mark.slow
def test_supernodes_train_and_survive_being_killed_in_phase_1_and_between_the_phases(
        tmp_path, tiny_fmnist):
    """Real processes: a SuperLink and 3 SuperNodes (with node workers, the default in a
    deployment) train the model (its checkpoint moves,
    every reply of round 1 is accepted); a SuperNode SIGKILLed during phase 1 of round 2, and
    another between the phases of a later round. Each such round completes by the dropout rule
    (the lost node's phase-1 statistics count, its update does not), and each node, started
    again, takes its partition over; the first is seen used again in a round with every reply
    accepted.

    The run is as long as these events take, not a fixed number of rounds: it is configured
    for many more, and stopped (``STOP`` in its run directory) once the last of them is
    recorded, so a node that comes back late on a busy machine only makes the run longer.
    ``flower.timeout`` bounds the wait for a lost node's reply (Flower notices a dead node only
    after 60 s of missed heartbeats); it must leave live nodes, whose every message starts a
    process (10-17 s an exchange on 2 busy cores), a margin, so it and every wait here scale
    with the time a ClientApp's imports take now."""
    run, stamps = tmp_path / "run", tmp_path / "timing.jsonl"
    deployment = Loopback(NODES, tmp_path / "deploy")
    deployment.env["DCCO_TIMING"] = str(stamps)  # the ServerApp stamps each exchange
    workers = Path(tempfile.mkdtemp(prefix="dccow-"))  # flower.worker = "auto"; a short path
    deployment.env["DCCO_WORKER_DIR"] = str(workers)  # (a Unix socket's is at most 107 bytes)
    reply_timeout = max(25.0, 12 * _import_seconds())
    patience = 12 * reply_timeout  # for any one awaited event: 300 s on an idle machine
    config = {"data.data_dir": str(tiny_fmnist), "data.samples_per_client": 2,
              "model.widths": "[4, 8, 8]", "model.projector": "[16, 16, 16]",
              "train.clients_per_round": 9, "train.rounds": 500, "train.log_every": 1,
              "train.knn_every": 0, "flower.min_nodes": NODES,
              "flower.timeout": reply_timeout, "flower.run_dir": str(run)}

    def parsed(path: Path) -> list[dict]:
        out = []
        for line in _lines(path):
            with contextlib.suppress(json.JSONDecodeError):  # a line being written
                out.append(json.loads(line))
        return out

    def records() -> list[dict]:
        return [r for r in parsed(run / "metrics.jsonl") if "loss" in r]

    def exchanges() -> list[dict]:
        return [e for e in parsed(stamps) if e["kind"] == "exchange"]

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + patience
        while not condition():
            assert time.monotonic() < deadline, f"waited for {what}" + deployment.log_tails()
            time.sleep(0.05)

    with deployment:
        run_id = deployment.submit(config)
        wait_for(lambda: len(records()) >= 1, "round 1")
        deployment.kill_node(2)  # round 2's statistics are asked of it: phase 1 is lost
        lost_in_phase_1 = 2
        # its replacement starts once round 2's phase 1 is over, so it cannot answer it
        wait_for(lambda: any(e["round"] == lost_in_phase_1 - 1 for e in exchanges()),
                 "round 2's statistics")
        deployment.start_node(2)  # a new SuperNode for partition 2
        wait_for(lambda: any(r["round"] > lost_in_phase_1 and all(
            t["accepted"] == NODES for t in r["replies"].values()) for r in records()),
            "the restarted node in a round")
        used_again = len(records())
        wait_for(lambda: any(e["round"] == used_again for e in exchanges()),
                 f"round {used_again + 1}'s statistics")
        deployment.kill_node(1)  # between the phases of round used_again + 1
        between = used_again + 1
        deployment.start_node(1)  # takes partition 1 over; later rounds need not wait for it
        wait_for(lambda: any(r["round"] >= between for r in records()), f"round {between}")
        (run / "STOP").touch()
        assert deployment.wait(run_id, timeout=patience) == "finished:completed", \
            deployment.details
    assert deployment.alive() == []
    # the default (auto) answered from node workers: SuperNodes start one process a message
    assert len(list(workers.glob("*.log"))) >= NODES
    shutil.rmtree(workers, ignore_errors=True)

    last = parsed(run / "metrics.jsonl")[-1]
    assert last["round"] >= between and "STOP" in last["stopped"]
    by_round = {r["round"]: r for r in records()}
    assert sorted(by_round) == list(range(1, last["round"] + 1))
    assert all(math.isfinite(r["loss"]) and r["rounds_skipped"] == 0 for r in by_round.values())
    lost = by_round[lost_in_phase_1]["replies"]
    assert lost["stats"]["accepted"] == NODES - 1
    assert lost["stats"]["missing"] + lost["stats"]["failed"] == 1
    assert lost["update"]["sent"] == lost["update"]["accepted"] == NODES - 1
    again = by_round[used_again]["replies"]
    assert again["stats"]["accepted"] == again["update"]["accepted"] == NODES
    cut = by_round[between]["replies"]
    assert cut["stats"]["accepted"] == NODES  # its statistics are in the round's S_A
    assert cut["update"]["accepted"] == NODES - 1
    assert cut["update"]["missing"] + cut["update"]["failed"] == 1
    first = by_round[1]["replies"]  # before any fault: every node answers both phases
    assert all(t["accepted"] == t["sent"] == NODES and not t["rejected"]
               for t in first.values())
    assert all(s > 0 for s in seconds_per_round(run))
    assert json.loads((run / "summary.json").read_text())["backend"] == "flower"
    # the checkpoint, written where the run stopped, holds a trained model: not the initial
    # one of the same config and seed
    cfg = load_config(run / "config.toml")
    initial = build_dual_encoder(cfg.model, 1, cfg.projector, seed=cfg.train.seed)
    trained = build_dual_encoder(cfg.model, 1, cfg.projector, seed=cfg.train.seed)
    opt = build_optimizer(trainable_parameters(trained), cfg.optim)
    assert load_checkpoint(run / "checkpoint.safetensors", trained, opt) == last["round"]
    moved = [not torch.equal(a, b) for (_, a), (_, b) in
             zip(trainable_parameters(initial), trainable_parameters(trained), strict=True)]
    assert sum(moved) > len(moved) // 2
    assert (tmp_path / "deploy" / "logs" / "superlink.log").stat().st_size > 0


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def _net(run_dir: Path):
    cfg = load_config(run_dir / "config.toml")
    return build_dual_encoder(cfg.model, 1, cfg.projector, seed=cfg.train.seed)


def test_client_imports_benchmark__writes_its_record(tmp_path):
    """benchmarks/client_imports.py, whose figures docs/flower.md quotes, runs and splits a
    ClientApp's import time by package."""
    root = Path(__file__).parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "client_imports.py"),
                           "--repeats", "1", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=root, check=False)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "client_imports.json").read_text())
    (run,) = record["runs"]
    assert set(run) == {"all", "torch", "flwr", "kornia", "numpy", "dcco_own"}
    assert all(v > 0 for v in run.values())
    assert run["torch"] + run["flwr"] + run["dcco_own"] < run["all"]


def test_timing_breakdown__splits_an_exchange_into_its_parts(tmp_path):
    """The slowest node of an exchange decides it: its process start and imports (from the
    exchange's start, as a process may have started earlier), data load and compute; the
    rest of the server's wall time is Flower's."""
    from dcco.flower.timing import breakdown

    lines = [
        {"kind": "exchange", "sent": 100.0, "received": 110.0},
        {"kind": "message", "phase": "stats", "process_start": 101.0, "imported": 104.0,
         "handler_start": 104.0, "handler_end": 106.0, "data_load": 0.5, "compute": 1.5},
        {"kind": "message", "phase": "stats", "process_start": 101.0, "imported": 103.0,
         "handler_start": 103.0, "handler_end": 104.0, "data_load": 0.2, "compute": 0.8},
        {"kind": "message", "phase": "stats", "process_start": 50.0, "imported": 52.0,
         "handler_start": 52.0, "handler_end": 53.0, "data_load": 0.1, "compute": 0.9},
    ]
    path = tmp_path / "timing.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    parts = breakdown(path)
    assert parts == {"exchange": 10.0, "process_start_and_imports": 3.0, "data_load": 0.5,
                     "compute": 1.5, "flower": 5.0, "exchanges": 1}
    # Flower's part after the nodes' work: the last handler ended at 106, the server had
    # every reply at 110
    from dcco.flower.timing import reply_gaps

    assert reply_gaps(path) == {"stats": [4.0]}
