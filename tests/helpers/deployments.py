"""What the real-process deployment tests share: the unit their waits scale by, and the
round records of a run directory being written."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path


def import_seconds() -> float:
    """How long the ClientApp's imports take on this machine now (Flower starts a process that
    imports it for every message): the unit the deployment tests scale their waits by."""
    code = "import time; t = time.perf_counter(); import dcco.flower.app.client_app; " \
           "print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=True)
    return float(done.stdout)


def lines_written(path: Path) -> list[dict]:
    """The JSON lines of a file written so far (none while it does not exist); a line being
    written is left out."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def round_records(run: Path) -> list[dict]:
    """The round records (those with a loss) of a run's ``metrics.jsonl`` written so far."""
    return [r for r in lines_written(run / "metrics.jsonl") if "loss" in r]
