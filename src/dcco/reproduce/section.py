"""The results section of a grid: its tables, the claims, the paper's table, the plot and the
provenance of the runs, written into a Markdown file between markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dcco.reproduce.cell import cell_accuracy
from dcco.reproduce.claims import CLAIMS_INTRO, claim_checks, claims_table, paper_table
from dcco.reproduce.grid import Grid
from dcco.reproduce.plan import Cell
from dcco.reproduce.result_tables import results_table


def run_versions(cells: list[Cell]) -> list[dict[str, Any]]:
    """The cells' version.json records, in cell order (cells without a readable one skipped)."""
    found = []
    for cell in cells:
        try:
            found.append(json.loads((cell.path / "version.json").read_text()))
        except (OSError, ValueError):
            continue
    return found


def code_commits(versions: list[dict[str, Any]]) -> list[str]:
    """The short git commits the runs recorded (``run_versions``), in first-seen order (a grid
    run across several code versions lists each)."""
    seen: list[str] = []
    for info in versions:
        commit = str(info.get("git_commit") or "")
        short = commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")
        if commit and short not in seen:
            seen.append(short)
    return seen


def run_machines(versions: list[dict[str, Any]]) -> list[str]:
    """Where the runs ran (``run_versions``): one entry per machine, with its number of runs, in
    first-seen order. Runs from before dcco recorded the CPU and GPU are described by what
    they did record (architecture, host name, torch build)."""
    counts: dict[str, int] = {}
    for info in versions:
        if "cpu" in info:
            gpu = info.get("gpu") or "none"
            where = f"{info['cpu']}, {'no GPU' if gpu == 'none' else gpu}"
        else:
            where = f"{info.get('machine', 'unknown machine')} (host {info.get('host', '?')})"
        key = f"{where}; torch {info.get('torch', '?')}, Python {info.get('python', '?')}"
        counts[key] = counts.get(key, 0) + 1
    return [f"{n} run{'s' if n != 1 else ''} on {key}" for key, n in counts.items()]


def results_markdown(grid: Grid, cells: list[Cell], command: str, plot: str | None) -> str:
    """The results section: our table, the claims beside the paper's, the paper's table, the
    plot, and provenance."""
    done = sum(1 for c in cells if c.na is None and all(
        cell_accuracy(c, e) is not None for e in c.evaluations(grid.evaluations)))
    total = sum(1 for c in cells if c.na is None)
    versions = run_versions(cells)
    machines = run_machines(versions)
    machine = ("Machines:\n\n" + "".join(f"- {m}\n" for m in machines) if len(machines) > 1
               else f"Machine: {machines[0] if machines else 'no runs yet'}\n")
    commits = code_commits(versions)
    code = (f"\nCode: commit {', '.join(commits)} (from the runs' `version.json`)\n"
            if commits else "")
    head = (f"Scale `{grid.scale}`, seeds {list(grid.seeds)}, data `{grid.base.data.dataset}`; "
            f"{done} of {total} runs complete.\n\nCommand: `{command}`\n\n{machine}"
            + code)
    if grid.tuning is not None:  # the recipes' validation accuracies, not a results table
        from dcco.reproduce.picks import picks, picks_markdown

        return "\n".join([head, picks_markdown(grid, picks(grid, cells))])
    parts = [head, "Test accuracy (%), mean ± std over seeds:\n", results_table(grid, cells),
             CLAIMS_INTRO, claims_table(grid, cells)]
    checks = claim_checks(grid, cells)
    if checks:
        parts.append(checks)
    parts += ["Paper, CIFAR-100 (Vemulapalli et al. 2023, Table 1), for reference:\n",
              paper_table()]
    if plot:
        parts.append(f"![accuracy against samples per client]({plot})\n")
    return "\n".join(parts)


def write_section(path: Path, text: str, tag: str = "reproduce") -> None:
    """Replace (or append) the block between <!-- tag:begin --> and <!-- tag:end --> in path."""
    from dcco.run.checkpoint import atomic_write_text

    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    old = path.read_text() if path.is_file() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = (old.rstrip() + "\n\n" if old else "") + block + "\n"
    atomic_write_text(path, new)
