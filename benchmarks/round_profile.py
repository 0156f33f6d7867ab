"""Where one round's time goes: torch.profiler over a few rounds of a grid cell, as
``dcco.run.pretraining.Pretraining.step`` runs them (the plan, the augmentation, the round, the server
step), after warm-up rounds.

    python benchmarks/round_profile.py --scale gpu --cell non-iid-4-dcco-s0 --out benchmarks/results

writes ``round_profile_<device>.txt`` (the operator table, sorted by device time on a GPU and
by CPU time on a CPU), ``round_profile_<device>.trace.json`` with ``--trace``, and ``round_profile_<device>.json`` (the
top operators, ms per round, and the command) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=Path, default=ROOT / "experiments" / "table1_fmnist.toml")
    ap.add_argument("--scale", default="gpu")
    ap.add_argument("--cell", default="non-iid-4-dcco-s0")
    ap.add_argument("--warmup", type=int, default=10, help="rounds before profiling")
    ap.add_argument("--rounds", type=int, default=5, help="rounds profiled")
    ap.add_argument("--rows", type=int, default=30, help="operators in the table")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a value of the cell's config")
    ap.add_argument("--trace", action="store_true",
                    help="also write the Chrome trace (large on a GPU)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from dcco.reproduce import load_grid, plan_cells, select_cells
    from dcco.run.pretraining import Pretraining
    from dcco.run.setup import resolved
    from dcco.run.splits import load_splits

    grid = load_grid(args.grid, args.scale, args.set)
    (cell,) = select_cells([c for c in plan_cells(grid, Path(tempfile.gettempdir()))
                            if c.na is None], [args.cell])
    cfg = resolved(cell.cfg)
    pt = Pretraining.of(cfg, load_splits(cfg)[0])
    on_gpu = pt.device.type == "cuda"

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(pt.device)

    for _ in range(args.warmup):
        pt.step()
    sync()
    start = time.perf_counter()
    for _ in range(args.rounds):
        pt.step()
    sync()
    unprofiled_ms = (time.perf_counter() - start) / args.rounds * 1e3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(args.rounds):
            pt.step()
        sync()
    sort = "device_time_total" if on_gpu else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=args.rows)
    device = torch.cuda.get_device_name(pt.device) if on_gpu else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"round_profile_{_slug(device)}"
    trace = stem.with_suffix(".trace.json") if args.trace else None
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    command = "python benchmarks/round_profile.py " + shlex.join(
            sys.argv[1:] if argv is None else argv)
    head = (f"# One round of {args.cell} ({args.scale} scale) on {device}, torch "
            f"{torch.__version__}: {unprofiled_ms:.2f} ms per round unprofiled (mean of "
            f"{args.rounds} after {args.warmup} warm-up); precision {cfg.train.precision}, "
            f"compile {cfg.train.compile}. Totals below are over {args.rounds} profiled "
            f"rounds.\n# Command: {command}\n"
            + (f"# Chrome trace: {trace.name}\n" if trace is not None else "") + "\n")
    stem.with_suffix(".txt").write_text(head + table + "\n")
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: getattr(e, sort),
                    reverse=True)[:args.rows]:
        rows.append({"op": e.key, "calls": e.count,
                     "cpu_ms_per_round": e.cpu_time_total / 1e3 / args.rounds,
                     "device_ms_per_round": (getattr(e, "device_time_total", 0) / 1e3
                                             / args.rounds) if on_gpu else None})
    stem.with_suffix(".json").write_text(json.dumps(
        {"device": device, "torch": torch.__version__, "cell": args.cell, "scale": args.scale,
         "precision": cfg.train.precision, "compile": cfg.train.compile,
         "ms_per_round_unprofiled": unprofiled_ms, "rounds": args.rounds,
         "warmup": args.warmup, "command": command, "top_ops": rows}, indent=2) + "\n")
    print(head + table)
    print(f"wrote {stem}.txt and {stem}.json" + (f" and {trace}" if trace else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
