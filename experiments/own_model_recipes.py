"""``examples/own_model.py`` as written, under several server recipes: which train a plain
user's CNN (group norm, no weight standardisation) and which collapse it.

    python experiments/own_model_recipes.py --out experiments/results/collapse/own_model \\
        --recipe 'lars 1.5 (fit before):optim.optimizer="lars";optim.lr=1.5;optim.weight_decay=1e-6' \\
        --recipe 'adam 1e-3 (fit now):' --recipe 'adam 5e-3:optim.lr=5e-3'

A recipe is ``NAME:SETTINGS``, ``section.key=value`` joined by ``;``, given to every
``dcco.fit`` of the example on top of its defaults (``dcco.config.USER``). Each runs the
example in a process of its own (its 100 rounds, its probes of the trained and the untrained
encoder) and the record keeps, per recipe: both probes, the collapse figures of its last
round, its collapse warning if any, and the seconds. Output: ``--out``.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNNER = f"""
import sys, runpy
import dcco
settings = [s for s in sys.argv[2].split(";") if s.strip()]
fit = dcco.fit
dcco.fit = lambda *a, **k: fit(*a, **k, settings=settings)
sys.argv = [sys.argv[0], sys.argv[1]]
runpy.run_path({str(ROOT / "examples" / "own_model.py")!r}, run_name="__main__")
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", action="append", required=True, metavar="NAME:SETTINGS")
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json)")
    args = ap.parse_args(argv)
    from dcco.run.rundir import code_version

    results = {}
    for spec in args.recipe:
        name, _, settings = spec.partition(":")
        with tempfile.TemporaryDirectory() as work:
            runner = Path(work) / "runner.py"
            runner.write_text(RUNNER)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, str(runner), str(Path(work) / "run"),
                                   settings], capture_output=True, text=True, check=False,
                                  env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"[{name}] failed:\n{done.stderr[-3000:]}")
            probes = {k: float(v) for k, v in re.findall(
                r"^(trained|untrained): linear probe ([\d.]+) %$", done.stdout, re.MULTILINE)}
            summary = json.loads((Path(work) / "run" / "summary.json").read_text())
        results[name] = {"settings": settings, "probes": probes,
                         "collapse": summary.get("collapse"),
                         "collapse_warning": summary.get("collapse_warning"),
                         "final_loss": summary.get("final_loss"), "seconds": seconds}
        print(f"[{name}] trained {probes.get('trained')} %, untrained "
              f"{probes.get('untrained')} %, collapse {summary.get('collapse')}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"command": "python experiments/own_model_recipes.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
         "machine": {k: v for k, v in code_version().items()
                     if k in ("cpu", "torch", "threads", "git_commit")},
         "recipes": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
