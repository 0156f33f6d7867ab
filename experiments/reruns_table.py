"""The reruns table of issue 42 (docs/results/reruns.md): per recipe and method, the probe
of seed 0 at each thread count and their spread, against the spread over seeds.

Reads the folders ``dcco reproduce experiments/reruns_fmnist.toml`` wrote, one per scale and
thread count (``reruns_fmnist-<scale>-t<threads>``), and writes a Markdown table and a JSON
record:

    python experiments/reruns_table.py experiments/results/reruns_fmnist-*-t* \\
        --out experiments/results/reruns_fmnist
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

METHODS = ("dcco", "contrastive_fedavg", "centralized_cco")


def probe(cell: Path) -> float | None:
    try:
        summary = json.loads((cell / "summary.json").read_text())
        return 100 * summary["evaluations"]["linear@5000"]["accuracy"]
    except (OSError, KeyError, ValueError):
        return None


def final_loss(cell: Path) -> float | None:
    try:
        return json.loads((cell / "summary.json").read_text())["final_loss"]
    except (OSError, KeyError, ValueError):
        return None


def collect(folders: list[Path]) -> dict:
    """scale → method → {"threads": {t: probe of seed 0}, "seeds": {s: probe at 1 thread},
    "loss": {t: final loss of seed 0}}."""
    out: dict = {}
    for folder in folders:
        m = re.fullmatch(r".*?reruns_fmnist-(.+)-t(\d+)", folder.name)
        if not m:
            continue
        scale, threads = m.group(1), int(m.group(2))
        for cell in sorted(folder.iterdir()):
            name = re.fullmatch(r"(?:non-iid-4-)?(.+)-s(\d+)", cell.name)
            if not cell.is_dir() or not name or (value := probe(cell)) is None:
                continue
            method, seed = name.group(1), int(name.group(2))
            entry = out.setdefault(scale, {}).setdefault(method, {"threads": {}, "seeds": {},
                                                                   "loss": {}})
            if seed == 0:
                entry["threads"][threads] = value
                entry["loss"][threads] = final_loss(cell)
            if threads == 1:
                entry["seeds"][seed] = value
    return out


def table(data: dict) -> str:
    lines = [("| recipe | method | seed 0 at 1 / 2 / 3 threads | rerun spread (max − min) | "
              "seeds 0, 1, 2 at 1 thread | seed std |"),
             "|---|---|---|---|---|---|"]
    for scale, methods in data.items():
        for method in METHODS:
            if method not in methods:
                continue
            e = methods[method]
            runs = [e["threads"].get(t) for t in (1, 2, 3)]
            shown = " / ".join("—" if v is None else f"{v:.1f}" for v in runs)
            got = [v for v in runs if v is not None]
            spread = f"{max(got) - min(got):.1f}" if len(got) > 1 else "—"
            seeds = [e["seeds"][s] for s in sorted(e["seeds"])]
            seed_text = ", ".join(f"{v:.1f}" for v in seeds) or "—"
            std = f"{statistics.stdev(seeds):.1f}" if len(seeds) > 1 else "—"
            lines.append(f"| {scale} | {method} | {shown} | {spread} | {seed_text} | {std} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, help="writes OUT.md and OUT.json")
    args = ap.parse_args()
    data = collect(args.folders)
    text = table(data)
    sys.stdout.write(text)
    if args.out:
        command = "python experiments/reruns_table.py " + " ".join(sys.argv[1:])
        args.out.with_suffix(".md").write_text(f"Command: `{command}`\n\n{text}")
        args.out.with_suffix(".json").write_text(json.dumps(
            {"command": command, "linear@5000": data}, indent=1) + "\n")


if __name__ == "__main__":
    main()
