"""The cell plan: every run of a grid (a method on a setting, with a seed), its config and its
run directory; and the choice of some of them by name."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dcco.config import ConfigError, RunConfig
from dcco.data.paired import is_paired
from dcco.methods.registry import METHODS
from dcco.reproduce.grid import SUPERVISED, Grid, Setting, method_parts


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a method on a setting (None for centralized/supervised) and a seed."""

    method: str
    setting: Setting | None
    seed: int
    cfg: RunConfig
    path: Path
    na: str | None = None
    """Why the cell cannot run ("n/a"), or None."""
    skipped: frozenset[str] = frozenset()
    """Evaluations of the grid this cell does not run (``Grid.supervised_labels``)."""
    recipe: str | None = None
    """The method's recipe this cell runs (``r1``, …) in a grid with a tuning rule or a
    final grid's picks; None: the grid's base config."""

    def evaluations(self, grid_evaluations: tuple[str, ...]) -> tuple[str, ...]:
        """The grid's evaluations that this cell runs."""
        return tuple(e for e in grid_evaluations if e not in self.skipped)


def select_cells(cells: list[Cell], patterns: list[str]) -> list[Cell]:
    """The cells whose run-directory name matches any of the shell patterns (all if none),
    e.g. ``*-s2`` for one seed or ``non-iid-*-dcco-*`` for one method, in the order of the
    first pattern each matches (the grid's order within a pattern): ``--cells 'non-iid-4-*-s0'
    --cells '*'`` runs seed 0's non-IID 4 cells first, then the rest."""
    from fnmatch import fnmatchcase

    if not patterns:
        return cells

    def rank(c: Cell) -> int:
        return next((i for i, p in enumerate(patterns) if fnmatchcase(c.path.name, p)),
                    len(patterns))

    chosen = sorted((c for c in cells if rank(c) < len(patterns)), key=rank)
    if not chosen:
        raise ConfigError(f"no cell matches {', '.join(patterns)}; cells are named like "
                          f"{cells[0].path.name}" if cells else "the grid has no cells")
    return chosen


def plan_cells(grid: Grid, out: Path) -> list[Cell]:
    """Every cell of the grid, with its config and run directory."""
    cells = []
    for seed in grid.seeds:
        for method in grid.methods:
            for recipe in grid.recipes(method):
                cells += _method_cells(grid, out, method, seed, recipe)
    return cells


def _method_cells(grid: Grid, out: Path, method: str, seed: int, recipe) -> list[Cell]:
    """A method's cells of one seed (and one recipe of a tuning grid), setting by setting."""
    cells = []
    base = grid.base if recipe is None else grid.recipe_bases[method, recipe.name]
    tag = "" if recipe is None else f"-{recipe.name}"
    trained, aggregation = method_parts(method)
    federated = trained in METHODS and METHODS[trained].federated
    for setting in grid.settings if federated else (None,):
        cfg = replace(base, train=replace(base.train, seed=seed,
                                          method=trained if trained in METHODS
                                          else base.train.method))
        if aggregation is not None:
            cfg = replace(cfg, train=replace(cfg.train, aggregation=aggregation))
        name = f"{method}{tag}-s{seed}"
        na = None
        if trained in METHODS and not federated and grid.global_batch is not None:
            # centralized training pools clients_per_round × samples_per_client
            # images a step: the same global batch as every federated round
            cfg = replace(cfg, train=replace(
                cfg.train, clients_per_round=grid.global_batch // cfg.data.samples_per_client))
        if method == SUPERVISED and is_paired(cfg.data.dataset):
            na = "supervised from scratch trains an image classifier; paired data has none"
        if setting is not None:
            name = f"{_slug(setting.name)}-{name}"
            minimum = METHODS[trained].min_client_samples
            if setting.samples_per_client < minimum:
                na = (f"{method} computes its loss within a client and needs "
                      f"≥ {minimum} samples per client")
            else:
                cfg = replace(cfg, data=replace(
                    cfg.data, alpha=setting.alpha,
                    samples_per_client=setting.samples_per_client),
                    train=replace(cfg.train, clients_per_round=setting.clients_per_round))
        skipped = frozenset()
        if method == SUPERVISED and grid.supervised_labels is not None:
            skipped = frozenset(e for e in grid.evaluations
                                if int(e.split("@")[1]) not in grid.supervised_labels)
        cells.append(Cell(method, setting, seed, cfg, out / name, na, skipped,
                          None if recipe is None else recipe.name))
    return cells


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")

