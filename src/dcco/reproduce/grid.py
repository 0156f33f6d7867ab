"""The grid file: a base run config, the client settings, the methods, the evaluations and
the scales of an experiment grid (e.g. ``experiments/table1_fmnist.toml``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dcco.config import ConfigError, RunConfig, load_config, read_toml
from dcco.core.aggregation import AGGREGATIONS
from dcco.methods.registry import METHODS
from dcco.reproduce.tuning import Recipe, TuningRule, parse_tuning, read_picks
from dcco.run.setup import resolved

SUPERVISED = "supervised"
PROTOCOLS = ("linear", "finetune", "linear_y", "retrieval", "knn", "case_linear",
             "case_finetune")


def method_parts(name: str) -> tuple[str, str | None]:
    """A grid method's (method, server aggregation): "contrastive_fedavg+ldawa" is
    contrastive FedAvg under L-DAWA's aggregation (``train.aggregation``), a method of the
    grid of its own (its cells, its tuning, its pick); a plain name has no aggregation of its
    own (None: the config's)."""
    method, plus, aggregation = name.partition("+")
    return method, (aggregation if plus else None)


def check_method(name: str) -> None:
    """``ConfigError`` naming what is wrong with a grid method's name."""
    method, aggregation = method_parts(name)
    if method not in METHODS and method != SUPERVISED:
        raise ConfigError(f"grid.methods: unknown method {name!r}; choose from "
                          f"{', '.join(sorted(METHODS))}, {SUPERVISED}, or a federated "
                          f"method with a server aggregation, e.g. contrastive_fedavg+ldawa")
    if aggregation is not None and (aggregation not in AGGREGATIONS or aggregation == "fedavg"
                                    or method not in METHODS or not METHODS[method].federated):
        raise ConfigError(f"grid.methods: {name!r} must be a federated method, '+', and a "
                          f"server aggregation other than fedavg "
                          f"({', '.join(a for a in AGGREGATIONS if a != 'fedavg')})")


@dataclass(frozen=True)
class Setting:
    """One column of the table: a client structure."""

    name: str
    alpha: float
    samples_per_client: int
    clients_per_round: int


@dataclass(frozen=True)
class Grid:
    """A parsed grid file at one scale."""

    base: RunConfig
    settings: tuple[Setting, ...]
    methods: tuple[str, ...]
    evaluations: tuple[str, ...]
    """e.g. ``linear@5000``; supervised runs take the labels of each."""
    seeds: tuple[int, ...]
    scale: str
    global_batch: int | None = None
    """The scale's images per round (federated) and per step (centralized); None: the base
    config's and the settings' own."""
    supervised_labels: tuple[int, ...] | None = None
    """The label counts supervised training from scratch runs with (its cells skip the
    evaluations of other counts: 100 epochs of 5,000 labels take most of an hour on a CPU);
    None: every count of ``evaluations``."""
    tuning: TuningRule | None = None
    """The grid's tuning rule (``[tuning]``, ``dcco.reproduce.tuning``): each method runs
    every one of its recipes; None: each method runs once, on ``base``."""
    recipe_bases: dict[tuple[str, str], RunConfig] | None = None
    """With ``tuning`` or ``picked``: the base config of each (method, recipe name), the
    scale's with the recipe's overrides."""
    picked: dict[str, Recipe] | None = None
    """A final grid's recipe of each method (``grid.picks``: a tuning grid's picks.json,
    ``dcco.reproduce.tuning.read_picks``); None: each method runs on ``base``."""

    def recipes(self, method: str) -> tuple[Recipe | None, ...]:
        """The recipes ``method`` runs: every one of a tuning grid's, a final grid's pick,
        or (None,): the base config."""
        if self.tuning is not None:
            return self.tuning.recipes[method]
        return (None,) if self.picked is None else (self.picked[method],)


def load_grid(path: str | Path, scale: str, overrides: list[str] | None = None) -> Grid:
    """Read a grid file and apply one scale's overrides, then ``overrides`` (``section.key=
    value``, e.g. the data folder), with errors naming the key."""
    path = Path(path)
    raw = read_toml(path, "grid file")
    for key in raw:
        if key not in ("base", "setting", "grid", "scale", "tuning"):
            raise ConfigError(f"unknown key '{key}' in {path}; allowed: base, setting, grid, "
                              f"scale, tuning")
    scales = raw.get("scale", {})
    if scale not in scales:
        raise ConfigError(f"{path} has no scale {scale!r}; choose one of {', '.join(scales)}")
    unknown = set(scales[scale]) - {"set", "seeds", "global_batch", "evaluations",
                                    "supervised_labels"}
    if unknown:
        raise ConfigError(f"unknown key 'scale.{scale}.{min(unknown)}'; allowed: set, seeds, "
                          f"global_batch, evaluations, supervised_labels")
    flat, scale_set = _flatten(raw.get("base", {})), list(scales[scale].get("set", []))
    base = resolved(load_config(None, flat + scale_set + list(overrides or [])))
    try:
        settings = tuple(Setting(**s) for s in raw.get("setting", []))
    except TypeError as e:
        raise ConfigError(f"{path}: a [[setting]] needs exactly name, alpha, samples_per_client "
                          f"and clients_per_round ({e})") from None
    batch = scales[scale].get("global_batch")
    if batch is not None:  # the same client structure at another global batch size
        for s in settings:
            if batch % s.samples_per_client:
                raise ConfigError(f"scale.{scale}.global_batch = {batch} is not a multiple of "
                                  f"the {s.samples_per_client} samples per client of {s.name!r}")
        settings = tuple(replace(s, clients_per_round=batch // s.samples_per_client)
                         for s in settings)
        if batch % base.data.samples_per_client:  # centralized cells need it (plan_cells)
            raise ConfigError(f"scale.{scale}.global_batch = {batch} is not a multiple of the "
                              f"base data.samples_per_client = {base.data.samples_per_client}")
    g = raw.get("grid", {})
    methods = tuple(g.get("methods", []))
    for m in methods:
        check_method(m)
    evaluations = tuple(scales[scale].get("evaluations", g.get("evaluations", [])))
    for e in evaluations:
        protocol, _, labels = e.partition("@")
        if protocol not in PROTOCOLS or not labels.isdigit() or int(labels) < 1:
            raise ConfigError(f"grid.evaluations: {e!r} must look like linear@5000, "
                              f"finetune@5000, knn@10000 (the k-NN monitor with a bank of "
                              f"10000), linear_y@5000 (paired data: the second tower) or "
                              f"retrieval@1000 (paired data: a gallery of 1000 test pairs)")
    seeds = tuple(scales[scale].get("seeds", g.get("seeds", [0])))
    supervised = scales[scale].get("supervised_labels", g.get("supervised_labels"))
    if supervised is not None:
        counts = {int(e.split("@")[1]) for e in evaluations}
        if not supervised or any(n not in counts for n in supervised):
            raise ConfigError(f"grid.supervised_labels = {supervised} must be label counts of "
                              f"the evaluations ({sorted(counts)})")
        supervised = tuple(int(n) for n in supervised)
    tuning, picked, recipes = None, None, None
    if "tuning" in raw and "picks" in g:
        raise ConfigError(f"{path}: a grid either tunes ([tuning]) or runs the picks of a "
                          f"tuning grid (grid.picks), not both")
    if "tuning" in raw:
        tuning = parse_tuning(raw["tuning"], methods, evaluations, str(path))
        recipes = tuning.recipes
        if not base.data.validation:
            raise ConfigError(f"{path}: a grid with [tuning] picks recipes on a validation "
                              f"split and never reads the test split; set data.validation "
                              f"(e.g. \"data.validation=5000\" in scale.{scale}.set)")
    if "picks" in g:
        picked = read_picks(path.parent / str(g["picks"]), methods, str(path))
        recipes = {m: (r,) for m, r in picked.items()}
        if base.data.validation:
            raise ConfigError(f"{path}: a final grid (grid.picks) is read on the test split, "
                              f"its recipes having been picked on the validation split; "
                              f"leave data.validation unset in its scale")
    recipe_bases = None
    if recipes is not None:
        where = "tuning.{}" if tuning is not None else "grid.picks' {}"
        recipe_bases = {(m, r.name): _recipe_base(path, where.format(m), r, flat + scale_set,
                                                  list(overrides or []), base)
                        for m, rs in recipes.items() for r in rs}
    return Grid(base, settings, methods, evaluations, seeds, scale, batch, supervised,
                tuning, recipe_bases, picked)


def _recipe_base(path: Path, where: str, recipe: Recipe, scale_set: list[str],
                 overrides: list[str], base: RunConfig) -> RunConfig:
    """The base config of one recipe (``where``: its method's place in the grid file, for
    errors): the scale's with its overrides, checked to leave [data] and [eval] as the
    scale has them."""
    try:
        cfg = resolved(load_config(None, scale_set + list(recipe.overrides) + overrides))
    except ConfigError as e:
        raise ConfigError(f"{path}: {where} recipe {recipe.name} "
                          f"({', '.join(recipe.overrides)}): {e}") from None
    if cfg.data != base.data or cfg.eval != base.eval:
        raise ConfigError(f"{path}: {where} recipe {recipe.name} changes [data] or "
                          f"[eval]; recipes tune training only, and every one is read on the "
                          f"same split")
    return cfg


def _flatten(sections: dict[str, Any]) -> list[str]:
    """``{"train": {"rounds": 5}}`` → ``["train.rounds=5"]`` (values as TOML literals)."""
    from dcco.config import to_toml_value

    return [f"{s}.{k}={to_toml_value(v)}" for s, keys in sections.items() for k, v in keys.items()]

