"""A round of the quickstart app (examples/flower-quickstart) under DCCO against the same app
under Flower's FedAvg (issue 54's target: at most 1.5 ×), measured in one run.

    python benchmarks/quickstart_speed.py --record benchmarks/results/quickstart_speed.json

`examples/flower-quickstart` with 4 nodes of dcco's in-process grid (the ClientApp as
written, its messages deep-copied both ways as a network would; no Flower engine, whose
fixed polls are the same for both), its images stored as a Hugging Face `Image` column as
hub data sets store theirs: its ServerApp's strategy is FedAvg (the app's supervised form:
one epoch of SGD a round, `lr` 0.01, batch 32, the classifier's accuracy as its evaluation)
or DCCO (its defaults: statistics, then one step on the anchored loss;
`dcco.flower.evaluate_encoder` as its evaluation), `fraction-train` and `fraction-evaluate`
as the app's (0.5), the app's `@app.evaluate` after each round in both. Blocks of
``--rounds`` rounds alternate, ``--blocks`` of each; a round is timed from the server
(``evaluate_fn`` after each), and the ratio is of the medians of the rounds after each
block's first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "flower-quickstart"
TARGET = 1.5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds a block")
    ap.add_argument("--blocks", type=int, default=3, help="blocks of each strategy")
    ap.add_argument("--images", type=int, default=8000,
                    help="Fashion-MNIST training images shared out (0: all 60,000)")
    ap.add_argument("--record", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    from dcco.flower import DCCO
    from dcco.flower.testing.inprocess import InProcessGrid
    from dcco.run.rundir import code_version, cpu_name

    sys.path.insert(0, str(PROJECT))
    from quickstart_dcco import client_app, task

    base = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"] | {"images": args.images}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    seconds: dict[str, list[float]] = {"fedavg": [], "dcco": []}
    for _ in range(args.blocks):
        for name in ("fedavg", "dcco"):
            config = base | {"strategy": name}
            grid = InProcessGrid(client_app.app, nodes, config)
            torch.manual_seed(0)
            initial = ArrayRecord(task.Net().state_dict())
            kw = {"fraction_train": config["fraction-train"],
                  "fraction_evaluate": config["fraction-evaluate"]}
            strategy = FedAvg(**kw) if name == "fedavg" else DCCO(**kw)
            stamps: list[float] = []
            strategy.start(grid=grid, initial_arrays=initial, num_rounds=args.rounds,
                           train_config=ConfigRecord({"lr": config["lr"]})
                           if name == "fedavg" else None,
                           evaluate_fn=lambda r, arrays, s=stamps: s.append(
                               time.perf_counter()))
            rounds = [b - a for a, b in itertools.pairwise(stamps)]
            seconds[name] += rounds[1:]  # the block's first round warms caches up
            print(f"{name}: {', '.join(f'{x:.2f}' for x in rounds)} s", flush=True)
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    ratio = medians["dcco"] / medians["fedavg"]
    print(f"median round: FedAvg {medians['fedavg']:.2f} s, DCCO {medians['dcco']:.2f} s, "
          f"{ratio:.2f} × (target ≤ {TARGET})")
    if args.record is not None:
        record = {"command": "python benchmarks/quickstart_speed.py " + " ".join(
                      sys.argv[1:] if argv is None else argv),
                  "images": args.images, "nodes": 4, "rounds_per_block": args.rounds,
                  "blocks": args.blocks, "seconds": seconds, "median_seconds": medians,
                  "ratio": ratio, "target": TARGET, "within_target": ratio <= TARGET,
                  "machine": {"cpu": cpu_name(), "python": platform.python_version(),
                              **{k: v for k, v in code_version().items()
                                 if k in ("torch", "threads", "git_commit")}}}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
