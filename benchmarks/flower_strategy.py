"""The ``dcco.flower.DCCO`` strategy's round against Flower's own ``FedAvg`` round, on the same
app, model and nodes, measured in one run (issue 38's target: at most 1.5 ×).

Runs ``examples/flower-app`` on Flower's local simulation with ``--nodes`` virtual nodes and
``compare-fedavg = true``: its ServerApp alternates blocks of ``--rounds`` rounds of FedAvg
(one exchange: the model down, new weights up, after one local step of contrastive FedAvg) and
of DCCO (two exchanges: the model down and statistics up, S_A down and an update up), timing
every round from the server (``evaluate_fn`` after each). The ratio is of the medians of the
rounds after each block's first.

    python benchmarks/flower_strategy.py --record benchmarks/results/flower_strategy.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from dcco.flower.loopback import LocalSimulation
from dcco.rundir import code_version, cpu_name

PROJECT = Path(__file__).resolve().parents[1] / "examples" / "flower-app"
TARGET = 1.5


def measure(args: argparse.Namespace, photos: int) -> dict:
    """One simulation of the app with ``photos`` photos a node: both strategies' seconds per
    round, their medians and the ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        sim = LocalSimulation(args.nodes, Path(tmp) / "sim", project=PROJECT)
        with sim:
            run_id = sim.submit({"num-server-rounds": args.rounds, "blocks": args.blocks,
                                 "fraction-train": args.fraction, "compare-fedavg": True,
                                 "photos-per-node": photos, "out": str(out)})
            status = sim.wait(run_id, timeout=3600)
        if status != "finished:completed":
            sys.exit(f"the run ended {status}: {sim.details}")
        seconds = json.loads((out / "timings.json").read_text())
    medians = {}
    for name, values in seconds.items():
        # a block of R rounds gives R round times; its first (the strategy's warm-up) is
        # left out
        kept = [v for i, v in enumerate(values) if i % args.rounds != 0]
        medians[name] = statistics.median(kept)
    return {"photos_per_node": photos, "seconds_per_round": seconds, "median_s": medians,
            "ratio": medians["dcco"] / medians["fedavg"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6, help="rounds per block")
    ap.add_argument("--blocks", type=int, default=3, help="blocks per strategy, alternated")
    ap.add_argument("--fraction", type=float, default=0.5, help="fraction_train")
    ap.add_argument("--photos", type=int, nargs="+", default=[8],
                    help="photos per node: one simulation each (the app's photos-per-node)")
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    rows = [measure(args, photos) for photos in args.photos]
    for row in rows:
        print(f"{row['photos_per_node']} photos a node: FedAvg {row['median_s']['fedavg']:.3f} "
              f"s a round, DCCO {row['median_s']['dcco']:.3f} s a round: {row['ratio']:.2f} × "
              f"(target ≤ {TARGET} ×)")
    if args.record:
        record = {"command": "python benchmarks/flower_strategy.py " + " ".join(sys.argv[1:]),
                  "machine": f"{cpu_name()} ({os.cpu_count()} cores), {platform.system()}",
                  "code": code_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                  "nodes": args.nodes, "rounds_per_block": args.rounds,
                  "blocks": args.blocks, "fraction_train": args.fraction, "rows": rows,
                  "target": TARGET}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")


if __name__ == "__main__":
    main()
