"""examples/flower-app as tests/test_flower_strategy.py runs it (4 nodes of 8 one-class
photos, every node a round, 5 rounds of the app's DCCO at the strategy's defaults): the
final model's CCO loss (at the strategy's λ) on the nodes' photos, over 32 seeded pairs of
views, against the initial model's, for each strategy seed asked for.

The app keys each node's views by its partition (``answer(..., views_key=...)``), not by
Flower's node id, which the simulation draws at random in every run: so a run repeats, and
the node ids drawn here do not matter. Each run is on dcco's in-process grid (the same
ServerApp and ClientApp, no SuperLink); with ``--simulation``, the test's own `flwr run` on
Flower's local simulation:

    OMP_NUM_THREADS=1 python experiments/flower_app_loss.py --seeds $(seq 0 29) \\
        --record experiments/results/collapse/flower_app_loss-1thread.json
    OMP_NUM_THREADS=2 python experiments/flower_app_loss.py --seeds $(seq 0 29) \\
        --record experiments/results/collapse/flower_app_loss-2threads.json
    python experiments/flower_app_loss.py --simulation --seeds 0 1 2 \\
        --record experiments/results/collapse/flower_app_loss-simulation.json

`worst_ratio` reads those records: the highest trained/initial ratio over every seed, thread
count and engine, from which the test takes its margin.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import tomllib
import torch
from flwr.app import Context, RecordDict
from torch import nn

from dcco.flower.testing.inprocess import InProcessGrid

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "flower-app"
RECORDS = ROOT / "experiments" / "results" / "collapse"
ROUNDS, NODES = 5, 4


def _app():
    sys.path.insert(0, str(PROJECT))
    try:
        from dcco_flower_example import client_app, server_app, task
    finally:
        sys.path.remove(str(PROJECT))
    return client_app, server_app, task


def config(out: Path) -> dict:
    """The app's run config with the test's overrides."""
    from flwr.common.config import flatten_dict  # dotted keys, as Flower's run config has them

    app = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    return flatten_dict(app["config"]) | {"num-server-rounds": ROUNDS, "fraction-train": 1.0,
                            "out": str(out)}


def score(out: Path) -> tuple[float, float]:
    """The initial and the trained (``out/model.pt``) model's CCO loss at the strategy's
    λ (``dcco.config.USER``) on the 4 nodes' photos, the mean over 32 seeded pairs of
    views."""
    from dcco.config import USER
    from dcco.core.losses import cco_loss
    from dcco.core.stats import encoding_stats

    _, _, task = _app()
    photos = torch.cat([task.node_photos(p, 8) for p in range(NODES)])
    trained = task.SmallCNN()
    trained.load_state_dict(torch.load(out / "model.pt"))
    torch.manual_seed(0)  # the server app's initial model
    initial = task.SmallCNN()

    def loss(model: nn.Module) -> float:
        total = 0.0
        with torch.no_grad():
            for seed in range(32):
                torch.manual_seed(seed)
                x1, x2 = task.augment(photos), task.augment(photos)
                total += float(cco_loss(encoding_stats(model(x1), model(x2)).moments(),
                                        USER.lambd))
        return total / 32

    return loss(initial), loss(trained)


def run(seed: int, out: Path | None = None) -> dict:
    """One run at the strategy's ``seed``, with node ids drawn at random as Flower's
    simulation draws them (random 64-bit; the app keys its views by partition, so they do
    not matter)."""
    client_app, server_app, _ = _app()
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="flower-app-loss-"))
    cfg = config(out) | {"seed": seed}
    ids = random.Random().sample(range(1, 1 << 63), NODES)
    nodes = [{"partition-id": i, "num-partitions": NODES} for i in range(NODES)]
    start = time.perf_counter()
    grid = InProcessGrid(client_app.app, nodes, cfg, node_ids=ids)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=cfg))
    seconds = time.perf_counter() - start
    before, after = score(out)
    return {"seed": seed, "initial": before, "trained": after, "ratio": after / before,
            "seconds": seconds}


def simulate(seed: int, out: Path | None = None) -> dict:
    """One `flwr run` of the app on Flower's local simulation at the strategy's ``seed``."""
    from dcco.flower.testing.loopback import LocalSimulation

    out = out if out is not None else Path(tempfile.mkdtemp(prefix="flower-app-loss-"))
    start = time.perf_counter()
    with LocalSimulation(NODES, out / "sim", project=PROJECT) as sim:
        run_id = sim.submit({"num-server-rounds": ROUNDS, "fraction-train": 1.0,
                             "out": str(out / "out"), "seed": seed})
        state = sim.wait(run_id, timeout=900)
        if state != "finished:completed":
            raise RuntimeError(f"flwr run ended {state}: {sim.details}")
    seconds = time.perf_counter() - start
    before, after = score(out / "out")
    return {"seed": seed, "initial": before, "trained": after, "ratio": after / before,
            "seconds": seconds}


def recorded_runs() -> list[dict]:
    """Every run in the committed records (every seed, thread count and engine)."""
    runs = [r for path in sorted(RECORDS.glob("flower_app_loss-*.json"))
            for r in json.loads(path.read_text())["runs"]]
    if not runs:
        raise LookupError(f"no record in {RECORDS}/flower_app_loss-*.json")
    return runs


def worst_ratio() -> tuple[float, int]:
    """The highest trained/initial loss ratio in the committed records, and how many runs
    it is the worst of."""
    ratios = [r["ratio"] for r in recorded_runs()]
    return max(ratios), len(ratios)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--simulation", action="store_true",
                    help="run `flwr run` on Flower's local simulation, not the in-process grid")
    ap.add_argument("--record", type=Path, default=None, help="the results as JSON")
    args = ap.parse_args(argv)
    runs = []
    for seed in args.seeds:
        r = simulate(seed) if args.simulation else run(seed)
        runs.append(r)
        print(f"seed {seed}: CCO loss {r['trained']:.2f} trained against {r['initial']:.2f} "
              f"initial ({r['ratio']:.3f} x; {r['seconds']:.0f} s)", flush=True)
    if args.record is not None:
        from dcco.files import atomic_write_text
        from dcco.run.rundir import code_version

        record = {"command": "python experiments/flower_app_loss.py " + " ".join(
                      sys.argv[1:] if argv is None else argv),
                  "threads": torch.get_num_threads(),
                  "engine": "simulation" if args.simulation else "in-process", "code": code_version(), "runs": runs}
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
