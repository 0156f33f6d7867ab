"""The tuning rule read off a grid's records: each method's candidates and its pick
(``dcco.reproduce.tuning``), as a table and as ``picks.json``, the file a final grid reads
its recipes from."""

from __future__ import annotations

import json
from pathlib import Path

from dcco.reproduce.cell import cell_accuracy, divergence
from dcco.reproduce.grid import Grid
from dcco.reproduce.plan import Cell
from dcco.reproduce.tuning import Candidate, Pick, choose
from dcco.run.rundir import RunDir


def candidate(cell: Cell, recipe, select: str) -> Candidate:
    """One cell's record as a candidate of the pick."""
    if (cell.path / "metrics.jsonl").is_file() and divergence(RunDir(cell.path)) is not None:
        return Candidate(recipe, None, "diverged")
    accuracy = cell_accuracy(cell, select)
    if accuracy is None:
        return Candidate(recipe, None)
    warning = RunDir(cell.path).summary().get("collapse_warning")
    return Candidate(recipe, accuracy, None if warning is None else "collapse warning")


def picks(grid: Grid, cells: list[Cell]) -> list[Pick]:
    """Each method's pick under the grid's tuning rule, from the cells of its first setting
    and seed (the rule tunes one setting at one seed)."""
    if grid.tuning is None:
        raise ValueError("the grid has no [tuning]")
    rule = grid.tuning
    first = {}
    for c in cells:
        first.setdefault((c.method, c.recipe), c)
    return [choose(m, tuple(candidate(first[m, r.name], r, rule.select)
                            for r in rule.recipes[m]), rule.tie)
            for m in grid.methods]


def picks_record(grid: Grid, chosen: list[Pick]) -> dict:
    """``picks.json``: the rule and each method's pick, with every candidate's reading."""
    rule = grid.tuning
    return {"select": rule.select, "tie": rule.tie,
            "validation": grid.base.data.validation,
            "validation_seed": grid.base.data.validation_seed,
            "methods": {p.method: {
                "pick": None if p.recipe is None else p.recipe.name,
                "overrides": None if p.recipe is None else list(p.recipe.overrides),
                "why": p.why,
                "candidates": [{"recipe": c.recipe.name, "overrides": list(c.recipe.overrides),
                                "accuracy": c.accuracy, "excluded": c.excluded}
                               for c in p.candidates]} for p in chosen}}


def write_picks(path: Path, grid: Grid, chosen: list[Pick]) -> None:
    """Write ``picks.json`` atomically."""
    from dcco.files import atomic_write_text

    atomic_write_text(path, json.dumps(picks_record(grid, chosen), indent=2) + "\n")


def picks_markdown(grid: Grid, chosen: list[Pick]) -> str:
    """The candidates and the pick of every method, as a Markdown table: validation
    accuracy of each recipe, the picked one in bold."""
    rule = grid.tuning
    width = max(len(r) for r in rule.recipes.values())
    head = " | ".join(f"r{i}" for i in range(1, width + 1))
    intro = (f"Tuning rule: each method's recipes on the validation split "
             f"({grid.base.data.validation} training samples held out, seed "
             f"{grid.base.data.validation_seed}), {rule.select}; the pick is the highest "
             f"without a collapse warning, a recipe listed earlier winning within "
             f"{rule.tie * 100:g} points.")
    lines = [intro, "",
             f"| method | {head} | pick |", "|---|" + "---:|" * width + "---|"]
    for p in chosen:
        cells = []
        for c in p.candidates:
            text = ("…" if c.accuracy is None and c.excluded is None else
                    c.excluded if c.accuracy is None else f"{100 * c.accuracy:.1f}"
                    + (f" ({c.excluded})" if c.excluded else ""))
            cells.append(f"**{text}**" if p.recipe is not None and c.recipe == p.recipe
                         else text)
        lines.append(f"| {p.method} | {' | '.join(cells)} | {p.why} |")
    lines += ["", "Recipes (over the scale's settings):", ""]
    for m in grid.methods:
        lines += [f"- {m}: " + "; ".join(f"{r.name} {' '.join(r.overrides)}"
                                          for r in rule.recipes[m])]
    return "\n".join(lines) + "\n"


__all__ = ["candidate", "picks", "picks_markdown", "picks_record", "write_picks"]
