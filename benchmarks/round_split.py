"""Where a grouped batched DCCO round's time goes on a CPU (issue 40): its statistics (a
no-gradient forward of each group of ``train.max_batch`` samples) against its updates (a
forward and backward of each group again), on the peers benchmark's workload.

    OMP_NUM_THREADS=1 python benchmarks/round_split.py --clients 1024 --samples 1
"""

from __future__ import annotations

import argparse
import time

import torch
from peers import workload

from dcco.algorithm import Algorithm
from dcco.methods import build_method
from dcco.simulator import BatchedExecutor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, x1, x2, segments = workload(args.clients, args.samples)
    method = build_method("dcco")
    algorithm = Algorithm(method)
    for _ in range(args.repeats):
        executor = BatchedExecutor(model, x1, x2, segments, chunk=args.max_batch)
        start = time.perf_counter()
        stats = executor.statistics(method.stats)
        middle = time.perf_counter()
        executor.updates(algorithm, stats.moments(), None)
        end = time.perf_counter()
        print(f"statistics (no-gradient forwards) {middle - start:.2f} s, updates (forward and "
              f"backward) {end - middle:.2f} s: statistics {(middle - start) / (end - start):.0%}"
              f" of the round", flush=True)


if __name__ == "__main__":
    main()
