"""``dcco reproduce``: a declarative, restartable experiment grid (the paper's Table 1 protocol).

A grid file (e.g. ``experiments/table1_fmnist.toml``) holds a base run config, the client
settings (α, samples per client, clients per round), the methods, the evaluations, and scales
(``small`` for a CPU, ``full`` for the paper's network and budget). Every cell is a run
directory; a cell whose pretraining and evaluations are already recorded is skipped, and an
interrupted pretraining resumes from its checkpoint. The results table (mean ± std over seeds,
"n/a" with its reason where a method cannot run) is rendered from the run directories alone.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dcco.config import ConfigError, RunConfig, load_config
from dcco.data.datasets import ImageDataset
from dcco.experiments import eval_config_for, eval_key, evaluate_model, pretrained_model
from dcco.methods.registry import METHODS
from dcco.rundir import RunDir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SUPERVISED = "supervised"
PROTOCOLS = ("linear", "finetune")


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


def load_grid(path: str | Path, scale: str) -> Grid:
    """Read a grid file and apply one scale's overrides, with errors naming the key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"grid file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"grid file {path} is not valid TOML: {e}") from None
    for key in raw:
        if key not in ("base", "setting", "grid", "scale"):
            raise ConfigError(f"unknown key '{key}' in {path}; allowed: base, setting, grid, scale")
    scales = raw.get("scale", {})
    if scale not in scales:
        raise ConfigError(f"{path} has no scale {scale!r}; choose one of {', '.join(scales)}")
    unknown = set(scales[scale]) - {"set", "seeds", "global_batch"}
    if unknown:
        raise ConfigError(f"unknown key 'scale.{scale}.{min(unknown)}'; allowed: set, seeds, "
                          f"global_batch")
    base = load_config(None, _flatten(raw.get("base", {})) + list(scales[scale].get("set", [])))
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
    g = raw.get("grid", {})
    methods = tuple(g.get("methods", []))
    for m in methods:
        if m not in METHODS and m != SUPERVISED:
            raise ConfigError(f"grid.methods: unknown method {m!r}; choose from "
                              f"{', '.join(sorted(METHODS))}, {SUPERVISED}")
    evaluations = tuple(g.get("evaluations", []))
    for e in evaluations:
        protocol, _, labels = e.partition("@")
        if protocol not in PROTOCOLS or not labels.isdigit():
            raise ConfigError(f"grid.evaluations: {e!r} must look like linear@5000 or "
                              f"finetune@5000")
    seeds = tuple(scales[scale].get("seeds", g.get("seeds", [0])))
    return Grid(base, settings, methods, evaluations, seeds, scale)


def _flatten(sections: dict[str, Any]) -> list[str]:
    """``{"train": {"rounds": 5}}`` → ``["train.rounds=5"]`` (values as TOML literals)."""
    from dcco.config import _toml_value

    return [f"{s}.{k}={_toml_value(v)}" for s, keys in sections.items() for k, v in keys.items()]


def plan_cells(grid: Grid, out: Path) -> list[Cell]:
    """Every cell of the grid, with its config and run directory."""
    cells = []
    for seed in grid.seeds:
        for method in grid.methods:
            federated = method in METHODS and METHODS[method].federated
            for setting in grid.settings if federated else (None,):
                cfg = replace(grid.base, train=replace(grid.base.train, seed=seed,
                                                       method=method if method in METHODS
                                                       else grid.base.train.method))
                name = f"{method}-s{seed}"
                na = None
                if setting is not None:
                    name = f"{_slug(setting.name)}-{name}"
                    minimum = METHODS[method].min_client_samples
                    if setting.samples_per_client < minimum:
                        na = (f"{method} computes its loss within a client and needs "
                              f"≥ {minimum} samples per client")
                    else:
                        cfg = replace(cfg, data=replace(
                            cfg.data, alpha=setting.alpha,
                            samples_per_client=setting.samples_per_client),
                            train=replace(cfg.train, clients_per_round=setting.clients_per_round))
                cells.append(Cell(method, setting, seed, cfg, out / name, na))
    return cells


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def run_cell(cell: Cell, evaluations: tuple[str, ...], splits: tuple[ImageDataset, ImageDataset],
             pretrain: Callable[..., dict], say: Callable[[str], None]) -> None:
    """Pretrain (or resume) one cell and run its missing evaluations."""
    from dcco.evaluate import labelled_subset, supervised_from_scratch
    from dcco.train import resolve_device

    if cell.na is not None:
        return
    run, existed = RunDir.open_or_create(cell.path, cell.cfg)
    train, test = splits
    device = resolve_device(cell.cfg.train.device)
    if cell.method != SUPERVISED and run.summary().get("rounds") != cell.cfg.train.rounds:
        say(f"[{cell.path.name}] pretraining" + (" (resuming)" if existed else ""))
        pretrain(cell.cfg, run, train, test, existed)
    done = run.summary().get("evaluations", {})
    for e in evaluations:
        protocol, labels = e.split("@")[0], int(e.split("@")[1])
        ecfg = eval_config_for(cell.cfg, labels)
        if cell.method == SUPERVISED:
            key = eval_key(SUPERVISED, labels)
            if key in done:  # one supervised run serves every protocol with these labels
                continue
            say(f"[{cell.path.name}] supervised from scratch, {labels} labels")
            ids = labelled_subset(train.labels, labels, train.num_classes, cell.seed)
            result = supervised_from_scratch(cell.cfg.model, train.images.shape[1], train, test,
                                             ids, ecfg, cell.seed, device)
            run.update_summary(method=SUPERVISED, evaluations={key: asdict(result)})
        else:
            if eval_key(protocol, labels) in done:
                continue
            say(f"[{cell.path.name}] {protocol} evaluation, {labels} labels")
            model = pretrained_model(cell.cfg, run, train.images.shape[1], device)
            result = evaluate_model(model, protocol, ecfg, cell.seed, train, test, device)
            run.update_summary(evaluations={eval_key(protocol, labels): asdict(result)})
        done = run.summary().get("evaluations", {})


def cell_accuracy(cell: Cell, evaluation: str) -> float | None:
    """The recorded accuracy of one evaluation of a cell, or None if not run yet."""
    if cell.na is not None or not (cell.path / "summary.json").is_file():
        return None
    protocol, labels = evaluation.split("@")
    key = eval_key(SUPERVISED if cell.method == SUPERVISED else protocol, int(labels))
    entry = RunDir(cell.path).summary().get("evaluations", {}).get(key)
    return None if entry is None else entry["accuracy"]


def mean_std(values: list[float]) -> str:
    """``mean ± std`` in percent (sample std; a single seed shows no ±)."""
    if not values:
        return "—"
    m = 100 * statistics.fmean(values)
    if len(values) == 1:
        return f"{m:.1f}"
    return f"{m:.1f} ± {100 * statistics.stdev(values):.1f}"


def results_table(grid: Grid, cells: list[Cell]) -> str:
    """The paper's layout: one block per evaluation, methods as rows, settings as columns."""
    names = [s.name for s in grid.settings]
    lines = ["| method | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    notes: dict[str, str] = {}
    for evaluation in grid.evaluations:
        lines.append(f"| **{evaluation}** |" + " |" * len(names))
        for method in grid.methods:
            row = []
            for setting in grid.settings:
                group = [c for c in cells if c.method == method
                         and (c.setting is None or c.setting == setting)]
                if group and group[0].na:
                    notes[method] = group[0].na
                    row.append("n/a")
                    continue
                accs = [a for c in group if (a := cell_accuracy(c, evaluation)) is not None]
                pending = len(group) - len(accs)
                row.append(mean_std(accs) + (f" ({len(accs)}/{len(group)} seeds)"
                                             if pending and accs else ""))
            lines.append(f"| {method} | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "\n".join(f"- n/a: {why}." for why in sorted(set(notes.values()))) + "\n"
    return text


def accuracy_series(grid: Grid, cells: list[Cell], evaluation: str, method: str,
                    iid: bool) -> list[tuple[int, float]]:
    """(samples per client, mean accuracy) for a method over IID or non-IID settings."""
    points = []
    for s in grid.settings:
        if (s.alpha >= 100) != iid:
            continue
        accs = [a for c in cells if c.method == method and c.setting in (s, None)
                and (a := cell_accuracy(c, evaluation)) is not None]
        if accs:
            points.append((s.samples_per_client, statistics.fmean(accs)))
    return points


def plot_trend(grid: Grid, cells: list[Cell], evaluation: str, path: Path) -> Path:
    """Accuracy against samples per client, one line per method, non-IID and IID panels."""
    from dcco.report import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, iid in zip(axes, (False, True)):
        for method in grid.methods:
            pts = accuracy_series(grid, cells, evaluation, method, iid)
            if pts:
                x, y = zip(*sorted(pts))
                ax.plot(x, [100 * v for v in y], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("samples per client")
        ax.set_title(("IID" if iid else "non-IID") + f" clients, {evaluation}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def is_complete(grid: Grid, cells: list[Cell]) -> bool:
    return all(c.na is not None or cell_accuracy(c, e) is not None
               for c in cells for e in grid.evaluations)


__all__ = [
    "Cell",
    "Grid",
    "Setting",
    "is_complete",
    "load_grid",
    "plan_cells",
    "plot_trend",
    "results_table",
    "run_cell",
]


PAPER_CIFAR100 = """\
Paper, CIFAR-100 (Vemulapalli et al. 2023, Table 1), linear probe with 5K labels:

| method | non-IID 1 | non-IID 4 | non-IID 8 | non-IID 16 | IID 4 | IID 8 | IID 16 |
|---|---|---|---|---|---|---|---|
| cco_fedavg | — | failed | 28.7 | 30.7 | failed | 41.2 | 44.1 |
| contrastive_fedavg | — | 31.1 | 32.4 | 31.8 | 41.1 | 44.1 | 46.4 |
| dcco | 51.7 | 49.6 | 48.1 | 45.9 | 51.4 | 52.0 | 51.9 |
| centralized_cco | 52.6 | 52.6 | 52.6 | 52.6 | 52.6 | 52.6 | 52.6 |
| supervised | 42.4 | 42.4 | 42.4 | 42.4 | 42.4 | 42.4 | 42.4 |

(Full finetuning with 5K labels: dcco 51.5/50.5/49.3/47.7 non-IID, 51.5/52.1/52.0 IID; centralized
52.5; supervised 42.4. Linear probe with 500 labels: dcco 33.3/31.2/29.5/26.7 and 33.3/33.5/33.5;
centralized 34.0; supervised 13.1.)
"""


def results_markdown(grid: Grid, cells: list[Cell], command: str, machine: str,
                     plot: str | None) -> str:
    """The results section: our table, the paper's beside it, the plot, and provenance."""
    done = sum(1 for c in cells if c.na is None and all(cell_accuracy(c, e) is not None
                                                         for e in grid.evaluations))
    total = sum(1 for c in cells if c.na is None)
    head = (f"Scale `{grid.scale}`, seeds {list(grid.seeds)}, data `{grid.base.data.dataset}`; "
            f"{done} of {total} runs complete.\n\nCommand: `{command}`\n\nMachine: {machine}\n")
    parts = [head, "Mean ± std over seeds, test accuracy (%):\n", results_table(grid, cells),
             PAPER_CIFAR100]
    if plot:
        parts.append(f"![accuracy against samples per client]({plot})\n")
    return "\n".join(parts)


def write_section(path: Path, text: str, tag: str = "reproduce") -> None:
    """Replace (or append) the block between <!-- tag:begin --> and <!-- tag:end --> in path."""
    from dcco.checkpoint import atomic_write_text

    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    old = path.read_text() if path.is_file() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = (old.rstrip() + "\n\n" if old else "") + block + "\n"
    atomic_write_text(path, new)
