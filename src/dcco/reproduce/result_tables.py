"""The result tables: accuracies over seeds (mean ± std) in the paper's layout."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from dcco.reproduce.cell import cell_accuracy, divergence
from dcco.reproduce.grid import Grid
from dcco.reproduce.plan import Cell
from dcco.run.rundir import RunDir


@dataclass(frozen=True)
class Estimate:
    """A cell's accuracy in percent: mean and sample std over ``n`` seeds (std 0 when n ≤ 1)."""

    mean: float
    std: float = 0.0
    n: int = 1

    @classmethod
    def of(cls, accuracies: list[float]) -> Estimate:
        values = [100 * a for a in accuracies]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(statistics.fmean(values), std, len(values))

    def minus(self, other: Estimate) -> Difference:
        """The difference of two independent means, with its standard error where both have
        more than one seed (√(s₁²/n₁ + s₂²/n₂))."""
        se = None
        if self.n > 1 and other.n > 1:
            se = math.sqrt(self.std ** 2 / self.n + other.std ** 2 / other.n)
        return Difference(self.mean - other.mean, se)


@dataclass(frozen=True)
class Difference:
    value: float
    se: float | None = None

    def __str__(self) -> str:
        return _signed(self.value) + ("" if self.se is None else f" ± {self.se:.1f}")


def _signed(x: float) -> str:
    """+1.2, -0.3, and +0.0 (not -0.0) for anything that rounds to zero."""
    return f"{round(x, 1) + 0.0:+.1f}"


FAILED = "failed"
"""A cell the paper reports as "Failed" (training diverged)."""

Entry = Estimate | str | None
"""A table entry: an estimate, "failed", or None (not run / not applicable)."""


def measured(grid: Grid, cells: list[Cell]) -> dict[str, dict[str, dict[str, Entry]]]:
    """Our table as data, shaped like PAPER_TABLE1 (centralized and supervised repeat across
    settings; cells with no finished seed are None)."""
    table: dict[str, dict[str, dict[str, Entry]]] = {}
    for evaluation in grid.evaluations:
        for method in grid.methods:
            row = table.setdefault(evaluation, {}).setdefault(method, {})
            for setting in grid.settings:
                group = [c for c in cells if c.method == method
                         and (c.setting is None or c.setting == setting)]
                accs = [a for c in group if (a := cell_accuracy(c, evaluation)) is not None]
                row[setting.name] = Estimate.of(accs) if accs else None
    return table


def _show(entry: Entry) -> str:
    if entry is None:
        return "—"
    if isinstance(entry, str):
        return entry
    return f"{entry.mean:.1f}" + (f" ± {entry.std:.1f}" if entry.n > 1 else "")


def _layout(evaluations, methods, settings: list[str], cell: Callable[[str, str, str], str]) -> str:
    lines = ["| method | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for evaluation in evaluations:
        lines.append(f"| **{evaluation}** |" + " |" * len(settings))
        lines += [f"| {m} | " + " | ".join(cell(evaluation, m, s) for s in settings) + " |"
                  for m in methods]
    return "\n".join(lines) + "\n"


def results_table(grid: Grid, cells: list[Cell]) -> str:
    """The paper's layout: one block per evaluation, methods as rows, settings as columns.
    Cells still missing seeds say how many they have; impossible cells say "n/a" and why."""
    table = measured(grid, cells)
    notes: set[str] = set()
    diverged = {c.path for c in cells if c.na is None and divergence(RunDir(c.path))}

    def cell(evaluation: str, method: str, name: str) -> str:
        setting = next(s for s in grid.settings if s.name == name)
        group = [c for c in cells if c.method == method
                 and (c.setting is None or c.setting == setting)]
        if group and group[0].na:
            notes.add(group[0].na)
            return "n/a"
        if group and evaluation in group[0].skipped:
            notes.add(f"{method} was trained with {', '.join(map(str, grid.supervised_labels))} "
                      f"labels only (grid.supervised_labels)")
            return "not run"
        entry = table[evaluation][method][name]
        finished = 0 if entry is None else entry.n  # type: ignore[union-attr]
        lost = sum(c.path in diverged for c in group)
        return _show(entry) + (f" ({finished}/{len(group)} seeds)"
                               if 0 < finished < len(group) else "") + (
            f" ({lost} diverged)" if lost else "")

    text = _layout(grid.evaluations, grid.methods, [s.name for s in grid.settings], cell)
    if notes:
        text += "\n" + "\n".join(f"- n/a: {why}." for why in sorted(notes)) + "\n"
    return text

