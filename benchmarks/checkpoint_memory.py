"""What a checkpoint of clients' kept models costs in memory beyond the store itself: the
earlier way (the store stacked into tensors, saved by safetensors' ``save_file``, the whole
file loaded back by ``load_file``) against dcco's (``dcco.tensorfile``: written row by row,
read a tensor at a time), each save and each load in a process of its own, measured in one
run as the peak resident memory over the store's (``overhead``: 1.0 is a second copy of the
store) and as the ratio of the two ways' peaks.

    python benchmarks/checkpoint_memory.py [--clients 2000] [--entry-mib 0.5] \
        [--record benchmarks/results/checkpoint_memory.json]

The store is ``--clients`` entries of FedEMA's shape, a few dozen float16 tensors of
``--entry-mib`` MiB together (FedEMA's small network: 0.89 MiB a client). The overhead is
(peak RSS − RSS with the store built) / store bytes for a save, (peak RSS − RSS before the
load − the store) / store bytes for a load.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from dcco.core.client_state import ClientStates

TENSORS = 24
"""Tensors an entry holds (FedEMA's small network: its layers' weights and biases)."""


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _store(clients: int, entry_mib: float) -> ClientStates:
    numel = int(entry_mib * 2**20 / 2 / TENSORS)
    gen = torch.Generator().manual_seed(0)
    store = ClientStates(torch.float16)
    for c in range(clients):
        store.put(c, {f"layer{i}.weight": torch.randn(numel, generator=gen)
                      for i in range(TENSORS)})
    return store


def child(way: str, phase: str, clients: int, entry_mib: float, path: Path) -> None:
    """One measurement, in this process: prints base RSS, peak RSS and the store's MiB."""
    from safetensors.torch import load_file, save_file

    from dcco.tensorfile import Stacked, TensorFile, write_tensors

    if phase == "save":
        store = _store(clients, entry_mib)
        base = _rss_mib()
        if way == "stacked":
            save_file({k: v.tensor() if isinstance(v, Stacked) else v
                       for k, v in store.state().items()}, path)
        else:
            write_tensors(path, store.state())
    else:
        base = _rss_mib()
        read = load_file(path) if way == "stacked" else TensorFile(path)
        store = ClientStates.from_state(read, torch.float16)
        del read
    print(json.dumps({"base_mib": base, "peak_mib": _peak_mib(),
                      "store_mib": store.nbytes / 2**20}))


def measure(way: str, phase: str, args: argparse.Namespace, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", way, phase, "--clients",
                          str(args.clients), "--entry-mib", str(args.entry_mib), "--path",
                          str(path)], check=True, capture_output=True, text=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # a load's base is before the store exists: its overhead is what exceeds the store
    held = got["store_mib"] if phase == "load" else 0.0
    got["overhead"] = round((got["peak_mib"] - got["base_mib"] - held) / got["store_mib"], 3)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--entry-mib", type=float, default=0.5)
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.clients, args.entry_mib, args.path)
        return
    result: dict = {"clients": args.clients, "entry_mib": args.entry_mib,
                    "machine": platform.processor() or platform.machine(),
                    "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as d:
        for way in ("stacked", "rows"):
            path = Path(d) / f"{way}.safetensors"
            for phase in ("save", "load"):
                result[f"{way}_{phase}"] = measure(way, phase, args, path)
                print(f"{way:8s} {phase}: peak {result[f'{way}_{phase}']['peak_mib']:8.0f} MiB, "
                      f"overhead {result[f'{way}_{phase}']['overhead']:.2f} × the store "
                      f"({result[f'{way}_{phase}']['store_mib']:.0f} MiB)", flush=True)
    for phase in ("save", "load"):  # the earlier way's peak over dcco's, same store
        result[f"{phase}_peak_ratio"] = round(
            result[f"stacked_{phase}"]["peak_mib"] / result[f"rows_{phase}"]["peak_mib"], 2)
    print(json.dumps({k: v for k, v in result.items() if k.endswith("ratio")}))
    if args.record is not None:
        args.record.write_text(json.dumps(result, indent=2) + "\n")
        print(f"record: {args.record}")


if __name__ == "__main__":
    main()
