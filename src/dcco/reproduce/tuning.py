"""A grid's tuning rule (section ``[tuning]`` of a grid file): every method's recipes, the
same number for each, run on the validation split; and the pick among them.

A grid file with ``[tuning]`` gives each method of ``grid.methods`` a table of axes::

    [tuning]
    select = "linear@5000"   # the evaluation that picks, read on the validation split
    tie = 0.005              # within this of the best, the first listed recipe wins

    [tuning.dcco]
    "optim.lr" = [1.5, 0.75, 3.0]               # an axis of one config key
    "optim.weight_decay" = [1e-6, 1e-5]

    [tuning.moco_fedavg]
    "optim.lr" = [1.0, 0.5, 2.0]
    form = [{ "loss.moco_loss" = "mean" },      # an axis of named bundles of keys
            { "loss.moco_loss" = "sum", "loss.moco_queue" = 256 }]

A method's recipes are the product of its axes, the first axis outermost and each axis's
values in their listed order, numbered ``r1``, ``r2``, … (``r1`` takes every axis's first
value: list the method's default first, so that a tie goes to it). Every method must have
the same number of recipes, and the grid's scale must hold out a validation split
(``data.validation``): tuning never reads the test split.

A final grid runs each method at its pick: ``picks = "results/…-tune/picks.json"`` in its
``[grid]`` (a path from the grid file's folder) reads the picks a tuning grid's records
gave (``dcco.reproduce.picks.write_picks``; ``read_picks``), and its cells are named by the
picked recipe (``non-iid-4-dcco-r4-s0``). Its scale reads the test split: it holds no
validation split.

The pick (``choose``): among a method's recipes whose cells finished without a collapse
warning and without diverging, the highest ``select`` accuracy; a recipe within ``tie`` of
it that is listed earlier wins. A method with a recipe not yet recorded has no pick.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcco.config import ConfigError, to_toml_value


@dataclass(frozen=True)
class Recipe:
    """One of a method's recipes: its number and its config overrides."""

    name: str
    """``r1``, ``r2``, …, in the rule's order."""
    overrides: tuple[str, ...]
    """``section.key=value``, applied over the scale's ``set``."""


@dataclass(frozen=True)
class TuningRule:
    """A grid's ``[tuning]``: the recipes of every method and how the pick is made."""

    select: str
    """The evaluation that picks (e.g. ``linear@5000``), on the validation split."""
    tie: float
    """Accuracies within this of the best count as a tie (0.005: half a point)."""
    recipes: dict[str, tuple[Recipe, ...]]
    """Each method's recipes, in the rule's order."""

    def describe(self, method: str) -> list[str]:
        """One line per recipe of ``method``: its name and overrides."""
        return [f"{r.name}: {', '.join(r.overrides)}" for r in self.recipes[method]]


def parse_tuning(raw: dict[str, Any], methods: tuple[str, ...], evaluations: tuple[str, ...],
                 where: str) -> TuningRule:
    """The ``[tuning]`` table of a grid file (module docstring), checked against the grid's
    methods and evaluations; errors name the key."""
    raw = dict(raw)
    select = raw.pop("select", None)
    if select not in evaluations:
        raise ConfigError(f"{where}: tuning.select must be one of the grid's evaluations "
                          f"({', '.join(evaluations) or 'none'}), got {select!r}")
    tie = raw.pop("tie", 0.0)
    if not (isinstance(tie, (int, float)) and 0 <= tie < 1):
        raise ConfigError(f"{where}: tuning.tie must be an accuracy difference in [0, 1) "
                          f"(0.005 is half a point), got {tie!r}")
    unknown = sorted(set(raw) - set(methods))
    if unknown:
        raise ConfigError(f"{where}: tuning.{unknown[0]} is not a method of grid.methods "
                          f"({', '.join(methods)})")
    missing = [m for m in methods if m not in raw]
    if missing:
        raise ConfigError(f"{where}: every method goes through the tuning rule; "
                          f"[tuning.{missing[0]}] is missing")
    recipes = {m: _recipes(raw[m], f"{where}: tuning.{m}") for m in methods}
    sizes = {m: len(r) for m, r in recipes.items()}
    if len(set(sizes.values())) > 1:
        raise ConfigError(f"{where}: every method gets the same tuning budget, but the "
                          f"recipes number " + ", ".join(f"{m} {n}" for m, n in sizes.items()))
    return TuningRule(select, float(tie), recipes)


def _recipes(axes: Any, where: str) -> tuple[Recipe, ...]:
    if not isinstance(axes, dict) or not axes:
        raise ConfigError(f"{where} must be a table of axes, e.g. \"optim.lr\" = [1.0, 2.0]")
    choices = []
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.{axis} must be a non-empty list of values")
        if "." in axis:  # one config key
            choices.append([(f"{axis}={to_toml_value(v)}",) for v in values])
        else:  # named bundles of keys
            if not all(isinstance(v, dict) and v for v in values):
                raise ConfigError(f"{where}.{axis}: an axis without a dot in its name is a "
                                  f"list of tables of config keys, e.g. "
                                  f"[{{ \"loss.moco_loss\" = \"sum\" }}]")
            choices.append([tuple(f"{k}={to_toml_value(x)}" for k, x in v.items())
                            for v in values])
    return tuple(Recipe(f"r{i}", tuple(o for part in combo for o in part))
                 for i, combo in enumerate(itertools.product(*choices), 1))


@dataclass(frozen=True)
class Candidate:
    """One recipe's record in the pick: its accuracy, or why it cannot be picked."""

    recipe: Recipe
    accuracy: float | None
    """The ``select`` accuracy on the validation split; None if not recorded."""
    excluded: str | None = None
    """Why the recipe cannot be picked (a collapse warning, divergence), or None."""


@dataclass(frozen=True)
class Pick:
    """A method's pick under the rule, with every candidate it was chosen from."""

    method: str
    recipe: Recipe | None
    """The picked recipe; None while a recipe is unrecorded, or when every one is excluded."""
    candidates: tuple[Candidate, ...]
    why: str
    """The rule's reading, in words."""


def choose(method: str, candidates: tuple[Candidate, ...], tie: float) -> Pick:
    """The rule applied to one method's candidates (module docstring)."""
    waiting = [c.recipe.name for c in candidates if c.accuracy is None and c.excluded is None]
    if waiting:
        return Pick(method, None, candidates, f"not yet recorded: {', '.join(waiting)}")
    valid = [c for c in candidates if c.excluded is None]
    if not valid:
        return Pick(method, None, candidates, "every recipe collapsed or diverged")
    best = max(c.accuracy for c in valid)
    first = next(c for c in valid if c.accuracy >= best - tie - 1e-12)
    why = (f"{first.recipe.name}, the highest" if first.accuracy == best else
           f"{first.recipe.name}, listed first within {tie * 100:g} points of the best "
           f"{100 * best:.1f} %")
    return Pick(method, first.recipe, candidates, why)


def read_picks(path: Path, methods: tuple[str, ...], where: str) -> dict[str, Recipe]:
    """Each of ``methods``' picked recipe from a tuning grid's ``picks.json`` (module
    docstring); errors name the file and the method that has no pick."""
    try:
        record = json.loads(path.read_text())
        chosen = record["methods"]
    except FileNotFoundError:
        raise ConfigError(f"{where}: grid.picks names {path}, which does not exist; the "
                          f"tuning grid's `dcco reproduce ... --table-only` writes it") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}: grid.picks {path} is not a picks.json "
                          f"({type(e).__name__}: {e})") from None
    recipes = {}
    for m in methods:
        entry = chosen.get(m) if isinstance(chosen, dict) else None
        if entry is None:
            raise ConfigError(f"{where}: {path} has no pick for {m}; its tuning grid did not "
                              f"tune it")
        if entry.get("pick") is None:
            raise ConfigError(f"{where}: {path} has no pick for {m} yet ({entry.get('why')})")
        recipes[m] = Recipe(str(entry["pick"]), tuple(str(o) for o in entry["overrides"]))
    return recipes


__all__ = ["Candidate", "Pick", "Recipe", "TuningRule", "choose", "parse_tuning", "read_picks"]
