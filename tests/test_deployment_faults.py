"""Real deployments over TLS that lose processes: SuperNodes killed in phase 1 and between the
phases of a round (each message's ClientApp through the node's worker, the default in a
deployment), each started again under its registered key, then the whole deployment killed
and a new one started with resume, in one test: the faults share the first deployment, and
the second is the resumed run's.

Slow (minutes: Flower notices a lost node only by its missed heartbeats and each wait scales
with the machine's speed); pytest-xdist (``--dist worksteal``) runs it on a worker of its own
when one is free, beside ``tests/test_flower_loopback.py``.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch
from helpers.deployments import import_seconds, lines_written, round_records

from dcco.config import load_config
from dcco.core.client import trainable_parameters
from dcco.core.optim import build_optimizer
from dcco.flower.testing.loopback import Loopback, seconds_per_round
from dcco.models import build_dual_encoder
from dcco.run.checkpoint import load_checkpoint, read_checkpoint
from dcco.run.setup import projector

NODES = 3


@pytest.mark.slow
def test_supernodes_killed_in_a_round_and_the_whole_deployment_killed_then_resumed(
        tmp_path, tiny_fmnist):
    """Real processes: a SuperLink and 3 SuperNodes (with node workers, the default in a
    deployment) train the model (its checkpoint moves, every reply of round 1 is accepted); a
    SuperNode SIGKILLed during phase 1 of round 2, and another between the phases of a later
    round. Each such round completes by the dropout rule (the lost node's phase-1 statistics
    count, its update does not), and each node, started again, takes its partition over; the
    first is seen used again in a round with every reply accepted. Then the whole deployment
    (SuperLink, ServerApp, SuperNodes) is killed, and a new one started with
    ``flower.resume = true`` continues from the last checkpoint, logging each round once.
    (That a resumed result is bit-identical to an uninterrupted run is tested in process,
    ``test_flower_resume__continues_from_the_checkpoint_bit_identically``.)

    The run is as long as these events take, not a fixed number of rounds: it is configured
    for many more, and stopped (``STOP`` in its run directory) once the resumed deployment
    has recorded a round, so a node that comes back late on a busy machine only makes the run
    longer. ``flower.timeout`` bounds the wait for a lost node's reply (Flower notices a dead
    node only after 60 s of missed heartbeats); it must leave live nodes, whose every message
    starts a process (10-17 s an exchange on 2 busy cores), a margin, so it and every wait
    here scale with the time a ClientApp's imports take now."""
    run, stamps = tmp_path / "run", tmp_path / "timing.jsonl"
    workers = Path(tempfile.mkdtemp(prefix="dccow-"))  # flower.worker = "auto"; a short path

    def deployment_at(folder: Path) -> Loopback:
        # TLS, every SuperNode signing in with its registered key: a killed node starts again
        # under the same key (_rejoin)
        deployment = Loopback(NODES, folder)
        deployment.env["DCCO_TIMING"] = str(stamps)  # the ServerApp stamps each exchange
        deployment.env["DCCO_WORKER_DIR"] = str(workers)  # (a Unix socket's is at most 107
        return deployment  # bytes)

    reply_timeout = max(25.0, 12 * import_seconds())
    patience = 12 * reply_timeout  # for any one awaited event: 300 s on an idle machine
    config = {"data.data_dir": str(tiny_fmnist), "data.samples_per_client": 2,
              "model.widths": "[4, 8, 8]", "model.projector": "[16, 16, 16]",
              "train.clients_per_round": 9, "train.rounds": 500, "train.log_every": 1,
              "train.checkpoint_every": 1, "train.knn_every": 0, "flower.min_nodes": NODES,
              "flower.timeout": reply_timeout, "flower.run_dir": str(run)}

    def records() -> list[dict]:
        return round_records(run)

    def exchanges() -> list[dict]:
        return [e for e in lines_written(stamps) if e["kind"] == "exchange"]

    def wait_for(condition, what: str, deployment: Loopback) -> None:
        deadline = time.monotonic() + patience
        while not condition():
            assert time.monotonic() < deadline, f"waited for {what}" + deployment.log_tails()
            time.sleep(0.05)

    first = deployment_at(tmp_path / "deploy")
    with first:
        first.submit(config)
        wait_for(lambda: len(records()) >= 1, "round 1", first)
        first.kill_node(2)  # round 2's statistics are asked of it: phase 1 is lost
        lost_in_phase_1 = 2
        # its replacement starts once round 2's phase 1 is over, so it cannot answer it
        wait_for(lambda: any(e["round"] == lost_in_phase_1 - 1 for e in exchanges()),
                 "round 2's statistics", first)
        rejoined = [_rejoin(first, 2, patience)]  # a new SuperNode for partition 2
        wait_for(lambda: any(r["round"] > lost_in_phase_1 and all(
            t["accepted"] == NODES for t in r["replies"].values()) for r in records()),
            "the restarted node in a round", first)
        used_again = len(records())
        wait_for(lambda: any(e["round"] == used_again for e in exchanges()),
                 f"round {used_again + 1}'s statistics", first)
        first.kill_node(1)  # between the phases of round used_again + 1
        between = used_again + 1
        rejoined.append(_rejoin(first, 1, patience))  # takes partition 1 over; later
        # rounds need not wait for it
        wait_for(lambda: _checkpoint_round(run) >= between, f"round {between}'s checkpoint",
                 first)
    assert first.alive() == []  # the whole deployment killed mid-run
    killed_at = _checkpoint_round(run)
    before_kill = {r["round"]: r for r in records()}

    second = deployment_at(tmp_path / "deploy-2")
    with second:
        run_id = second.submit(config | {"flower.resume": True})
        wait_for(lambda: any(r["round"] > killed_at for r in records()),
                 f"round {killed_at + 1} after the resume", second)
        (run / "STOP").touch()
        assert second.wait(run_id, timeout=patience) == "finished:completed", second.details
    assert second.alive() == []
    # how long a node killed while online waited before the SuperLink admitted it again
    # (docs/flower.md quotes a run's figures: pytest -s prints them)
    print(f"rejoined after (seconds, refused starts): {rejoined}")
    assert first.secure and len(rejoined) == 2
    # the default (auto) answered from node workers: SuperNodes start one process a message
    assert len(list(workers.glob("*.log"))) >= NODES
    shutil.rmtree(workers, ignore_errors=True)

    last = lines_written(run / "metrics.jsonl")[-1]
    assert last["round"] > killed_at >= between and "STOP" in last["stopped"]
    rounds = [r["round"] for r in records()]
    assert rounds == list(range(1, last["round"] + 1))  # each round logged once
    by_round = {r["round"]: r for r in records()}
    # what the first deployment recorded up to its checkpoint stands as it was
    assert all(by_round[r] == before_kill[r] for r in range(1, killed_at + 1))
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
    initial = build_dual_encoder(cfg.model, 1, projector(cfg), seed=cfg.train.seed)
    trained = build_dual_encoder(cfg.model, 1, projector(cfg), seed=cfg.train.seed)
    opt = build_optimizer(trainable_parameters(trained), cfg.optim)
    assert load_checkpoint(run / "checkpoint.safetensors", trained, opt) == last["round"]
    moved = [not torch.equal(a, b) for (_, a), (_, b) in
             zip(trainable_parameters(initial), trainable_parameters(trained), strict=True)]
    assert sum(moved) > len(moved) // 2
    assert (tmp_path / "deploy" / "logs" / "superlink.log").stat().st_size > 0


def _rejoin(deployment: Loopback, index: int, patience: float) -> tuple[float, int]:
    """Start the killed SuperNode ``index`` again under its registered key until the
    SuperLink admits it: Flower activates a node only from the registered or offline status,
    so one killed while online may be refused (the process ends) until its missed heartbeats
    mark it offline. Returns the seconds from the first start to the admission ("SuperNode
    ID" in its log) and the number of refused starts."""
    log = deployment.logs / f"supernode-{index}.log"
    began, refused = time.monotonic(), 0
    while True:
        assert time.monotonic() - began < patience, \
            f"SuperNode {index} not admitted again" + deployment.log_tails()
        seen = log.stat().st_size if log.exists() else 0
        deployment.start_node(index)
        proc = deployment.procs[f"supernode-{index}"]
        while True:
            if "SuperNode ID:" in log.read_bytes()[seen:].decode(errors="replace"):
                return time.monotonic() - began, refused
            if proc.poll() is not None:
                break
            assert time.monotonic() - began < patience, \
                f"SuperNode {index} not admitted again" + deployment.log_tails()
            time.sleep(0.2)
        refused += 1  # it ended, refused: start it again a little later
        deployment.kill_node(index)  # (ended already: this keeps its group for the clean-up)
        time.sleep(1.0)


def _checkpoint_round(run: Path) -> int:
    """The rounds done in the run's checkpoint (0: none yet)."""
    path = run / "checkpoint.safetensors"
    return int(read_checkpoint(path)[1]["rounds_done"]) if path.is_file() else 0

