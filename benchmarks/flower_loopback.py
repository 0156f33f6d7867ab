"""A deployed round on loopback against Flower's own floor, measured in one run.

Deploys, one after the other on this machine, a SuperLink and ``--nodes`` SuperNodes for:

- ``floor, 2 exchanges`` and ``floor, 1 exchange``: ``dcco.flower.testing.floor``, whose ClientApp
  only echoes a tiny message (it imports Flower, not torch): what any Flower app pays per
  round of that many exchanges;
- each ``--methods`` entry: the dcco app (``dcco.flower.testing.loopback``), with
  ``dcco.flower.timing`` splitting its exchanges into process start and imports, data load,
  compute and the rest (Flower's); with ``--worker``, each again with ``flower.worker = true``
  (the nodes' long-lived workers hold torch, the data and the model); with ``--stale``, DCCO
  with stale statistics too (``train.staleness = 1``, one exchange a round).

Each figure is the median of the rounds after the first (the first includes the nodes'
discovery); a method's ratio is to the floor with as many exchanges as its round has
(``exchanges_per_round`` in its summary). The targets: DCCO (two exchanges) and FedAvg (one)
each at most 1.5 × its floor.

    python benchmarks/flower_loopback.py --out /tmp/loopback --worker --stale \\
        --record benchmarks/results/flower_loopback.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from dcco.flower import timing
from dcco.flower.testing.loopback import Loopback, run_loopback, seconds_per_round
from dcco.run.rundir import cpu_name

FLOOR_PROJECT = Path(__file__).resolve().parent / "flower_floor"
TARGET = 1.5

DCCO_OVERRIDES = {"model.widths": "[16, 32, 64]", "model.projector": "[128, 128, 128]",
                  "data.samples_per_client": 4, "train.clients_per_round": 16,
                  "train.knn_every": 0, "train.log_every": 1}
"""The app's round as the earlier record (flower_loopback_before_cache.json) ran it."""


def floor(nodes: int, exchanges: int, rounds: int, out: Path, payload: int = 0,
          payload_arrays: int = 1) -> list[float]:
    """Seconds of each round of the floor app (``payload`` bytes each way per message, in
    ``payload_arrays`` arrays)."""
    record = out / "floor.json"
    with Loopback(nodes, out, FLOOR_PROJECT) as deployment:
        run_id = deployment.submit({"rounds": rounds, "exchanges": exchanges,
                                    "min_nodes": nodes, "payload": payload,
                                    "payload_arrays": payload_arrays,
                                    "record": str(record)})
        status = deployment.wait(run_id, timeout=1800)
        if status != "finished:completed":
            raise SystemExit(f"the floor app ended {status}: {deployment.details}"
                             + deployment.log_tails())
    return json.loads(record.read_text())["seconds_per_round"]


def dcco_round(nodes: int, variant: dict, rounds: int,
               out: Path) -> tuple[list[float], dict, int, dict]:
    """Seconds of each round of the dcco app, the mean breakdown of its exchanges, the
    exchanges of its round, and per phase the seconds from the last node's work to the
    server having every reply (``timing.reply_gaps``)."""
    stamps = out / "timing.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    stamps.unlink(missing_ok=True)
    os.environ[timing.ENV] = str(stamps)  # every process of the deployment inherits it
    try:
        run_dir, _ = run_loopback(nodes, out, DCCO_OVERRIDES | {
            "train.method": variant["method"], "train.rounds": rounds,
            "train.staleness": int(variant["stale"]), "flower.secagg": variant["secagg"],
            "flower.worker": variant["worker"]}, timeout=1800)
    finally:
        del os.environ[timing.ENV]
    summary = json.loads((run_dir / "summary.json").read_text())
    return (seconds_per_round(run_dir), timing.breakdown(stamps),
            summary["exchanges_per_round"], timing.reply_gaps(stamps))


def typical(seconds: list[float]) -> float:
    """The median round after the first."""
    return statistics.median(seconds[1:] or seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the deployments")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=["dcco", "cco_fedavg"])
    ap.add_argument("--secagg", action="store_true", help="also DCCO through SecAgg+")
    ap.add_argument("--worker", action="store_true",
                    help="also every method with flower.worker = true")
    ap.add_argument("--stale", action="store_true",
                    help="also DCCO with stale statistics (train.staleness = 1: one exchange)")
    ap.add_argument("--payload", type=int, default=0,
                    help="bytes each floor message carries each way (dcco's carry the model: "
                         "about 1,000,000 for these overrides); 0: tiny messages")
    ap.add_argument("--payload-arrays", type=int, default=1,
                    help="split the floor's payload into this many distinct random arrays "
                         "(dcco's model: 55 tensors); 1: one array of zeros")
    ap.add_argument("--floor-only", action="store_true", help="measure the floors only")
    ap.add_argument("--record", type=Path, default=None, help="write the record here (JSON)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # 3 nodes' processes on a few cores
    started = time.perf_counter()

    floors: dict[int, list[float]] = {}
    for exchanges in (2, 1):
        floors[exchanges] = floor(args.nodes, exchanges, args.rounds,
                                  args.out / f"floor-{exchanges}", args.payload,
                                  args.payload_arrays)
        print(f"floor, {exchanges} exchange(s): {typical(floors[exchanges]):.2f} s per round",
              flush=True)
    rows = []
    plain = [{"method": m, "secagg": False, "worker": False, "stale": False}
             for m in args.methods] + ([{"method": "dcco", "secagg": False, "worker": False,
                                         "stale": True}] if args.stale else [])
    variants = (plain + ([v | {"worker": True} for v in plain] if args.worker else [])
                + ([{"method": "dcco", "secagg": True, "worker": False, "stale": False}]
                   if args.secagg else []))
    for variant in [] if args.floor_only else variants:
        label = "-".join([variant["method"]] + [k for k in ("secagg", "worker", "stale")
                                                if variant[k]])
        seconds, parts, exchanges, gaps = dcco_round(args.nodes, variant, args.rounds,
                                                     args.out / label)
        base = typical(floors[min(exchanges, 2)])
        rows.append(variant | {"label": label, "exchanges": exchanges,
                               "s_per_round": typical(seconds), "rounds_s": seconds,
                               "floor_s": base, "ratio_to_floor": typical(seconds) / base,
                               "breakdown": parts, "reply_gaps_s": gaps})
        print(f"{label}: {typical(seconds):.2f} s per round, "
              f"{typical(seconds) / base:.2f} × the floor of {exchanges} exchange(s) "
              f"(target {TARGET})", flush=True)
    record = {
        "command": "python benchmarks/flower_loopback.py " + " ".join(sys.argv[1:]),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {platform.system()}",
        "nodes": args.nodes, "rounds": args.rounds, "overrides": DCCO_OVERRIDES,
        "floor_payload_bytes": args.payload, "floor_payload_arrays": args.payload_arrays,
        "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "statistic": "median seconds per round, rounds after the first",
        "target_ratio": TARGET,
        "floor": {str(k): {"s_per_round": typical(v), "rounds_s": v} for k, v in floors.items()},
        "rows": rows, "seconds": time.perf_counter() - started}
    if args.record is not None:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n")
        print(f"record: {args.record}")


if __name__ == "__main__":
    main()
