"""A real deployment: one SuperLink and 3 SuperNodes on 127.0.0.1, ``flwr run`` of the app.

Slow (every message starts a ``flwr-clientapp`` process that imports torch): marked ``slow``,
and ``.ci/run`` runs it with the rest of the suite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dcco.checkpoint import load_checkpoint
from dcco.client import trainable_parameters
from dcco.config import load_config
from dcco.flower.loopback import Loopback, seconds_per_round
from dcco.models import build_dual_encoder
from dcco.optim import build_optimizer

NODES, ROUNDS = 3, 2


@pytest.mark.slow
def test_superlink_and_three_supernodes_train_the_model(tmp_path: Path, tiny_fmnist: Path):
    run_dir = tmp_path / "run"
    run_config = {
        "data.data_dir": str(tiny_fmnist), "data.samples_per_client": 2,
        "model.widths": "[4, 8, 8]", "model.projector": "[16, 16, 16]",
        "train.clients_per_round": 6, "train.rounds": ROUNDS, "train.log_every": 1,
        "train.knn_every": 0, "flower.min_nodes": NODES, "flower.run_dir": str(run_dir),
    }
    deployment = Loopback(NODES, tmp_path / "deploy")
    with deployment:
        run_id = deployment.submit(run_config)
        assert deployment.wait(run_id, timeout=600) == "finished:completed", deployment.log_tails()
        assert len(deployment.procs) == NODES + 1
    assert deployment.alive() == []  # every process and process group started is gone

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    windows = [r for r in records if "loss" in r]
    assert [r["round"] for r in windows] == list(range(1, ROUNDS + 1))
    assert all(math.isfinite(r["loss"]) and r["rounds_skipped"] == 0 for r in windows)
    for r in windows:
        for phase in ("stats", "update"):
            tally = r["replies"][phase]
            assert tally["accepted"] == tally["sent"] >= 2 and not tally["rejected"]
    assert all(s > 0 for s in seconds_per_round(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backend"] == "flower" and summary["rounds"] == ROUNDS

    # the checkpoint holds a trained model: not the initial one of the same config and seed
    cfg = load_config(run_dir / "config.toml")
    initial = build_dual_encoder(cfg.model, 1, cfg.projector, seed=cfg.train.seed)
    trained = build_dual_encoder(cfg.model, 1, cfg.projector, seed=cfg.train.seed)
    opt = build_optimizer(trainable_parameters(trained), cfg.optim)
    assert load_checkpoint(run_dir / "checkpoint.safetensors", trained, opt) == ROUNDS
    moved = [not torch.equal(a, b) for (_, a), (_, b) in
             zip(trainable_parameters(initial), trainable_parameters(trained), strict=True)]
    assert sum(moved) > len(moved) // 2
    assert (tmp_path / "deploy" / "logs" / "superlink.log").stat().st_size > 0
