"""What the decoded data cache (dcco.data.cache) saves a process that loads a split: the
load with the cache off (decoding the files) against the load from a valid cache, measured
in one run, each the median of --repeats loads.

    python benchmarks/data_load.py [--dataset fashion_mnist] [--split train] [--repeats 5]

A Flower SuperNode starts a ClientApp process, which loads its data, for every message
(docs/flower.md), so this is paid per message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from dcco.data import cache
from dcco.data.datasets import load_dataset


def timed(args: argparse.Namespace) -> float:
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        load_dataset(args.dataset, args.split)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--split", default="train")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ[cache.ENV] = "0"
    decoded = timed(args)
    os.environ[cache.ENV] = "1"
    load_dataset(args.dataset, args.split)  # make sure the cache exists
    cached = timed(args)
    print(json.dumps({"dataset": args.dataset, "split": args.split, "repeats": args.repeats,
                      "decode_s": round(decoded, 4), "cached_s": round(cached, 4),
                      "speedup": round(decoded / cached, 1)}))


if __name__ == "__main__":
    main()
