"""The quickstart app's `Net` (examples/flower-quickstart) under `DCCOStrategy()` with its
defaults, as tests/test_quickstart.py runs it (4 nodes of dcco's in-process grid, every node
a round, 200 images a node): the final model's CCO loss on the nodes' seeded test views
against the untrained model's, and the last round's collapse figures, for each round count
asked for and each seed (the initial model's, and the strategy's sampling and views).

    OMP_NUM_THREADS=1 python experiments/quickstart_loss.py --rounds 6 10 --seeds 0 1 2 \
        --record experiments/results/collapse/quickstart_loss-1thread.json
    OMP_NUM_THREADS=2 python experiments/quickstart_loss.py --rounds 6 --seeds 0 1 2 \
        --record experiments/results/collapse/quickstart_loss-2threads.json

`worst_ratio` reads those records: the highest trained/untrained ratio at a round count over
every seed and thread count, from which tests/test_quickstart.py takes its margin.
"""

from __future__ import annotations

import argparse
import itertools
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


RECORDS = ROOT / "experiments" / "results" / "collapse"


def worst_ratio(rounds: int) -> tuple[float, int]:
    """The highest trained/untrained loss ratio after ``rounds`` rounds in the committed
    records (every seed, every thread count), and how many runs it is the worst of."""
    ratios = [r["ratio"] for path in sorted(RECORDS.glob("quickstart_loss-*.json"))
              for r in json.loads(path.read_text())["runs"] if r["rounds"] == rounds]
    if not ratios:
        raise LookupError(f"no record of {rounds} rounds in {RECORDS}/quickstart_loss-*.json")
    return max(ratios), len(ratios)


def run(rounds: int, images: int, out: Path | None = None, seed: int = 0) -> dict:
    """One run of the app (writing into ``out``, a fresh folder if None): the CCO losses of
    the untrained and the trained model (both seeded by ``seed``), their ratio, the last round's collapse figures and
    the app's own record of its rounds (``record``: rounds.json)."""
    sys.path.insert(0, str(PROJECT))
    try:
        from quickstart_dcco import client_app, server_app, task
    finally:
        sys.path.remove(str(PROJECT))
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="quickstart-loss-"))
    from flwr.common.config import flatten_dict  # dotted keys, as Flower's run config has them

    config = flatten_dict(tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"][
        "flwr"]["app"]["config"]) | {"num-server-rounds": rounds, "fraction-train": 1.0,
                     "fraction-evaluate": 1.0, "images": images, "out": str(out),
                     "seed": seed}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    start = time.perf_counter()
    grid = InProcessGrid(client_app.app, nodes, config)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=config))
    seconds = time.perf_counter() - start
    record = json.loads((out / "rounds.json").read_text())
    last = record["train"][str(rounds)]
    torch.manual_seed(seed)  # the server app's initial model
    initial, trained = task.Net(), task.Net()
    trained.load_state_dict(torch.load(out / "final_model.pt"))
    before = after = 0.0
    for pid in range(4):
        _, test = task.load_data(pid, 4, 32, images)
        before += task.cco_loss_on(initial, test)
        after += task.cco_loss_on(trained, test)
    return {"rounds": rounds, "seed": seed, "untrained": before, "trained": after, "ratio": after / before,
            "dead_dims": last["dead_dims"], "eff_rank": last["eff_rank"], "seconds": seconds,
            "record": record}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[6, 10])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--images", type=int, default=800, help="in all, over the 4 nodes")
    ap.add_argument("--record", type=Path, default=None, help="the results as JSON")
    args = ap.parse_args(argv)
    runs = []
    for rounds, seed in itertools.product(args.rounds, args.seeds):
        r = run(rounds, args.images, seed=seed)
        runs.append({k: v for k, v in r.items() if k != "record"})
        print(f"{rounds} rounds, seed {seed}: CCO loss {r['trained']:.1f} trained against "
              f"{r['untrained']:.1f} untrained ({r['ratio']:.3f} x); dead "
              f"{r['dead_dims']:.0%}, C's effective rank {r['eff_rank']:.1f} "
              f"({r['seconds']:.0f} s)", flush=True)
    if args.record is not None:
        from dcco.files import atomic_write_text
        from dcco.run.rundir import code_version

        record = {"command": "python experiments/quickstart_loss.py " + " ".join(
                      sys.argv[1:] if argv is None else argv),
                  "threads": torch.get_num_threads(), "torch": torch.__version__,
                  "code": code_version(), "images": args.images, "runs": runs}
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
