"""Where a deployed round's seconds go: timestamps from every process, for the breakdown of
``python -m dcco.flower.testing.loopback --timing``.

With ``DCCO_TIMING`` naming a file, each ClientApp process appends one JSON line per message
it handles (its process start, when the dcco app module began and finished importing, when
the handler ran, and how long the data load and the computation took), and the ServerApp
one line per exchange (when its messages went out and the replies were in). The processes
share only that file (appends of one short line are atomic on POSIX).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV = "DCCO_TIMING"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def process_start() -> float:
    """This process's start, seconds since the epoch (Linux ``/proc``; else now)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text()
                    .splitlines() if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def record(kind: str, **fields: object) -> None:
    """Append one line to the ``DCCO_TIMING`` file (nothing without it)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), "at": time.time(), **fields})
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def exchanges(path: Path) -> list[tuple[dict, list[dict]]]:
    """The stamps' exchanges, each with the node messages handled within it (queries
    aside); exchanges that handled none are left out."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    messages = [m for m in lines if m["kind"] == "message" and m.get("phase") != "query"]
    out = []
    for e in (e for e in lines if e["kind"] == "exchange"):
        inside = [m for m in messages if e["sent"] <= m["handler_start"] <= e["received"]]
        if inside:
            out.append((e, inside))
    return out


def breakdown(path: Path) -> dict[str, float]:
    """Mean seconds per exchange: the server's wall time, and within it the slowest node's
    process start and imports, data load and computation; "flower" is the rest (Flower's
    polling waits, message transfer, process management)."""
    rows = []
    for e, inside in exchanges(path):
        slow = max(inside, key=lambda m: m["handler_end"] - e["sent"])
        start = max(slow["process_start"], e["sent"])
        rows.append({"exchange": e["received"] - e["sent"],
                     "process_start_and_imports": max(slow["imported"] - start, 0.0),
                     "data_load": slow["data_load"], "compute": slow["compute"]})
    if not rows:
        return {}
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    mean["flower"] = max(mean["exchange"] - mean["process_start_and_imports"]
                         - mean["data_load"] - mean["compute"], 0.0)
    mean["exchanges"] = len(rows)
    return mean


def reply_gaps(path: Path) -> dict[str, list[float]]:
    """Per phase, the seconds from the last node's handler end to the server having every
    reply, exchange by exchange: what Flower takes to bring the replies back."""
    gaps: dict[str, list[float]] = {}
    for e, inside in exchanges(path):
        gaps.setdefault(inside[0]["phase"], []).append(
            e["received"] - max(m["handler_end"] for m in inside))
    return gaps


__all__ = ["ENV", "breakdown", "enabled", "exchanges", "process_start", "record",
           "reply_gaps"]
