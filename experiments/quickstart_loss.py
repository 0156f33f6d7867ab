"""Flower's quickstart `Net` (examples/flower-quickstart) under `dcco.flower.DCCO()` with its
defaults, as tests/test_quickstart.py runs it (4 nodes of dcco's in-process grid, every node
a round, 200 images a node): the final model's CCO loss on the nodes' seeded test views
against the untrained model's, and the last round's collapse figures, for each round count
asked for.

    OMP_NUM_THREADS=1 python experiments/quickstart_loss.py --rounds 6 10
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import tomllib
import torch
from flwr.app import Context, RecordDict

from dcco.flower.testing.inprocess import InProcessGrid

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "flower-quickstart"


def run(rounds: int, images: int) -> dict:
    """One run of the app: its collapse figures at the last round and the loss ratio."""
    sys.path.insert(0, str(PROJECT))
    try:
        from quickstart_dcco import client_app, server_app, task
    finally:
        sys.path.remove(str(PROJECT))
    out = Path(tempfile.mkdtemp(prefix="quickstart-loss-"))
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"] | {"num-server-rounds": rounds, "fraction-train": 1.0,
                     "fraction-evaluate": 1.0, "images": images, "out": str(out)}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    task.fds = None
    start = time.perf_counter()
    grid = InProcessGrid(client_app.app, nodes, config)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=config))
    seconds = time.perf_counter() - start
    last = json.loads((out / "rounds.json").read_text())["train"][str(rounds)]
    torch.manual_seed(0)  # the server app's initial model
    initial, trained = task.Net(), task.Net()
    trained.load_state_dict(torch.load(out / "final_model.pt"))
    before = after = 0.0
    for pid in range(4):
        _, test = task.load_data(pid, 4, 32, images)
        before += task.cco_loss_on(initial, test)
        after += task.cco_loss_on(trained, test)
    return {"rounds": rounds, "untrained": before, "trained": after, "ratio": after / before,
            "dead_dims": last["dead_dims"], "eff_rank": last["eff_rank"], "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[6, 10])
    ap.add_argument("--images", type=int, default=800, help="in all, over the 4 nodes")
    args = ap.parse_args(argv)
    for rounds in args.rounds:
        r = run(rounds, args.images)
        print(f"{rounds} rounds: CCO loss {r['trained']:.1f} trained against "
              f"{r['untrained']:.1f} untrained ({r['ratio']:.3f} x); dead "
              f"{r['dead_dims']:.0%}, C's effective rank {r['eff_rank']:.1f} "
              f"({r['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
