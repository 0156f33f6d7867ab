"""Flower's quickstart-pytorch switched to DCCO (examples/flower-quickstart): its `Net`, which
has no normalisation, trains under the strategy's defaults without collapsing, and the app's
own `@app.evaluate` runs after every round."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomllib
import torch
from flwr.app import Context, RecordDict

from dcco.flower.testing.inprocess import InProcessGrid

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "flower-quickstart"


def _apps():
    sys.path.insert(0, str(PROJECT))
    try:
        from quickstart_dcco import client_app, server_app, task
    finally:
        sys.path.remove(str(PROJECT))
    return client_app, server_app, task


def test_quickstart_net__trains_under_dcco_defaults_and_evaluates_every_round(tmp_path,
                                                                             caplog):
    """Four nodes of the quickstart's IID partition (800 Fashion-MNIST images, 32 × 32 RGB),
    six rounds of `DCCO()` with its defaults, every node a round: the collapse figures of a
    live encoder (no dead dimension, C's effective rank above 2; the watch itself starts at
    round 20, after twice the warm-up), the app's evaluation each round, and the final
    model's CCO loss on the nodes' seeded test views below the untrained model's (0.91 of it
    here; after ten rounds 0.97, the warm-up's full rate already undoing part of it)."""
    client_app, server_app, task = _apps()
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"] | {"num-server-rounds": 6, "fraction-train": 1.0, "fraction-evaluate": 1.0,
                     "images": 800, "out": str(tmp_path)}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    task.fds = None
    grid = InProcessGrid(client_app.app, nodes, config)
    with caplog.at_level("WARNING", logger="flwr.dcco"):
        server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                      run_config=config))
    assert "collapse" not in caplog.text
    rounds = json.loads((tmp_path / "rounds.json").read_text())
    assert sorted(rounds["evaluate"], key=int) == [str(r) for r in range(1, 7)]
    last = rounds["train"]["6"]
    assert last["update-accepted"] == 4 and last["dead_dims"] == 0 and last["eff_rank"] > 2
    torch.manual_seed(0)  # the server app's initial model
    initial, trained = task.Net(), task.Net()
    trained.load_state_dict(torch.load(tmp_path / "final_model.pt"))
    before = after = 0.0
    for pid in range(4):
        _, test = task.load_data(pid, 4, 32, 800)
        before += task.cco_loss_on(initial, test)
        after += task.cco_loss_on(trained, test)
    assert after < 0.95 * before, (before, after)
