"""Where a grouped batched DCCO round's time goes on a CPU (issue 40), on the peers
benchmark's workload, in groups of ``train.max_batch`` samples, two ways interleaved in one
run: each group forwarded twice (a no-gradient forward for the statistics, a forward and
backward for the update: an integer ``max_batch``) and each group forwarded once, its graph
kept to its backward (``keep_graphs``: ``max_batch = "auto"`` on a CPU).

    OMP_NUM_THREADS=1 python benchmarks/round_split.py --clients 1024 --samples 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from peers import workload

from dcco.core.algorithm import Algorithm
from dcco.core.simulator import BatchedExecutor
from dcco.methods import build_method


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
    rounds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for keep in (False, True):
            executor = BatchedExecutor(model, x1, x2, segments, chunk=args.max_batch,
                                       keep_graphs=keep)
            start = time.perf_counter()
            stats = executor.statistics(method.stats)
            middle = time.perf_counter()
            executor.updates(algorithm, stats.moments(), None)
            end = time.perf_counter()
            rounds[keep].append(end - start)
            print(f"{'graphs kept  ' if keep else 'two forwards '} statistics "
                  f"{middle - start:.2f} s, updates {end - middle:.2f} s, round "
                  f"{end - start:.2f} s (statistics {(middle - start) / (end - start):.0%})",
                  flush=True)
    twice, once = (statistics.median(rounds[k]) for k in (False, True))
    print(f"median round: two forwards {twice:.2f} s, graphs kept {once:.2f} s "
          f"({once / twice:.2f} of the time)")


if __name__ == "__main__":
    main()
