"""The test suite, several times in a row, with CPU-bound processes running beside it.

Real deployments and CI machines are busy. This starts ``--burners`` processes that each
spin one core (pure Python, no I/O), runs the README's test command (``python -m pytest -q``)
``--runs`` times one after the other, stops the burners (by PID), and records each run's
wall time, exit status and pytest's last line:

    python benchmarks/suite_under_load.py --record benchmarks/results/suite_under_load.json

It exits non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from dcco.run.rundir import cpu_name

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--burners", type=int, default=2, help="CPU-bound processes beside it")
    ap.add_argument("--record", type=Path, default=None, help="write the record here (JSON)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (default none)")
    args = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.burners)]
    runs = []
    try:
        for i in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   *args.pytest_args], cwd=ROOT, capture_output=True,
                                  text=True, check=False)
            seconds = time.perf_counter() - start
            lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
            runs.append({"run": i + 1, "seconds": round(seconds, 1),
                         "returncode": done.returncode,
                         "pytest": lines[-1] if lines else done.stderr[-500:]})
            failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
            if failed:
                runs[-1]["failed"] = failed
            print(f"run {i + 1}/{args.runs}: exit {done.returncode} in {seconds / 60:.1f} min; "
                  f"{runs[-1]['pytest']}", flush=True)
    finally:
        for p in burners:
            p.send_signal(signal.SIGTERM)
        for p in burners:
            p.wait(timeout=10)
    record = {"command": "python benchmarks/suite_under_load.py " + " ".join(sys.argv[1:]),
              "machine": f"{cpu_name()}, {os.cpu_count()} cores, {platform.system()}",
              "burners": args.burners, "runs": runs,
              "all_passed": all(r["returncode"] == 0 for r in runs)}
    if args.record is not None:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n")
        print(f"record: {args.record}")
    return 0 if record["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
