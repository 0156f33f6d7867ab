"""``dcco reproduce``: a declarative, restartable experiment grid (the paper's Table 1 protocol).

A grid file (e.g. ``experiments/table1_fmnist.toml``) holds a base run config, the client
settings (α, samples per client, clients per round), the methods, the evaluations, and scales
(``small`` for a CPU, ``full`` for the paper's network and budget). Every cell is a run
directory; a cell whose pretraining and evaluations are already recorded is skipped, and an
interrupted pretraining resumes from its checkpoint. The results table (mean ± std over seeds,
"n/a" with its reason where a method cannot run) is rendered from the run directories alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dcco.config import ConfigError, RunConfig, load_config, read_toml
from dcco.data.paired import Dataset, is_paired
from dcco.evaluate import StepCallback
from dcco.experiments import eval_config_for, eval_key, evaluate_model, pretrained_model
from dcco.methods.registry import METHODS
from dcco.rundir import RunDir

SUPERVISED = "supervised"
PROTOCOLS = ("linear", "finetune", "linear_y", "retrieval")


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


def load_grid(path: str | Path, scale: str, overrides: list[str] | None = None) -> Grid:
    """Read a grid file and apply one scale's overrides, then ``overrides`` (``section.key=
    value``, e.g. the data folder), with errors naming the key."""
    path = Path(path)
    raw = read_toml(path, "grid file")
    for key in raw:
        if key not in ("base", "setting", "grid", "scale"):
            raise ConfigError(f"unknown key '{key}' in {path}; allowed: base, setting, grid, scale")
    scales = raw.get("scale", {})
    if scale not in scales:
        raise ConfigError(f"{path} has no scale {scale!r}; choose one of {', '.join(scales)}")
    unknown = set(scales[scale]) - {"set", "seeds", "global_batch", "evaluations"}
    if unknown:
        raise ConfigError(f"unknown key 'scale.{scale}.{min(unknown)}'; allowed: set, seeds, "
                          f"global_batch, evaluations")
    base = load_config(None, _flatten(raw.get("base", {})) + list(scales[scale].get("set", []))
                       + list(overrides or []))
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
        if m not in METHODS and m != SUPERVISED:
            raise ConfigError(f"grid.methods: unknown method {m!r}; choose from "
                              f"{', '.join(sorted(METHODS))}, {SUPERVISED}")
    evaluations = tuple(scales[scale].get("evaluations", g.get("evaluations", [])))
    for e in evaluations:
        protocol, _, labels = e.partition("@")
        if protocol not in PROTOCOLS or not labels.isdigit() or int(labels) < 1:
            raise ConfigError(f"grid.evaluations: {e!r} must look like linear@5000, "
                              f"finetune@5000, linear_y@5000 (paired data: the second tower) "
                              f"or retrieval@1000 (paired data: a gallery of 1000 test pairs)")
    seeds = tuple(scales[scale].get("seeds", g.get("seeds", [0])))
    return Grid(base, settings, methods, evaluations, seeds, scale, batch)


def _flatten(sections: dict[str, Any]) -> list[str]:
    """``{"train": {"rounds": 5}}`` → ``["train.rounds=5"]`` (values as TOML literals)."""
    from dcco.config import to_toml_value

    return [f"{s}.{k}={to_toml_value(v)}" for s, keys in sections.items() for k, v in keys.items()]


def select_cells(cells: list[Cell], patterns: list[str]) -> list[Cell]:
    """The cells whose run-directory name matches any of the shell patterns (all if none),
    e.g. ``*-s2`` for one seed or ``non-iid-*-dcco-*`` for one method."""
    from fnmatch import fnmatchcase

    if not patterns:
        return cells
    chosen = [c for c in cells if any(fnmatchcase(c.path.name, p) for p in patterns)]
    if not chosen:
        raise ConfigError(f"no cell matches {', '.join(patterns)}; cells are named like "
                          f"{cells[0].path.name}" if cells else "the grid has no cells")
    return chosen


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
                if method in METHODS and not federated and grid.global_batch is not None:
                    # centralized training pools clients_per_round × samples_per_client
                    # images a step: the same global batch as every federated round
                    cfg = replace(cfg, train=replace(
                        cfg.train, clients_per_round=grid.global_batch // cfg.data.samples_per_client))
                if method == SUPERVISED and is_paired(cfg.data.dataset):
                    na = "supervised from scratch trains an image classifier; paired data has none"
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


def run_cell(cell: Cell, evaluations: tuple[str, ...], splits: tuple[Dataset, Dataset],
             pretrain: Callable[..., dict], say: Callable[[str], None],
             progress: StepCallback | None = None) -> None:
    """Pretrain (or resume) one cell and run its missing evaluations, holding the cell's
    lock (``RunDirBusy`` if another process holds it); ``progress`` is told how each
    evaluation advances."""
    if cell.na is not None:
        return
    cell.path.mkdir(parents=True, exist_ok=True)
    with RunDir(cell.path).lock():
        run, existed = RunDir.open_or_create(cell.path, cell.cfg)
        _run_cell(cell, run, existed, evaluations, splits, pretrain, say, progress)


def _run_cell(cell: Cell, run: RunDir, existed: bool, evaluations: tuple[str, ...],
              splits: tuple[Dataset, Dataset], pretrain: Callable[..., dict],
              say: Callable[[str], None], progress: StepCallback | None) -> None:
    from dcco.evaluate import labelled_subset, supervised_from_scratch
    from dcco.train import resolve_device

    train, test = splits
    device = resolve_device(cell.cfg.train.device)
    if cell.method != SUPERVISED and run.summary().get("rounds") != cell.cfg.train.rounds:
        say(f"[{cell.path.name}] pretraining" + (" (resuming)" if existed else ""))
        pretrain(cell.cfg, run, train, test, existed)
    done = _current(run.summary())
    for e in evaluations:
        protocol, labels = e.split("@")[0], int(e.split("@")[1])
        ecfg = eval_config_for(cell.cfg, labels)
        if cell.method == SUPERVISED:
            key = eval_key(SUPERVISED, labels)
            if key in done:  # one supervised run serves every protocol with these labels
                continue
            say(f"[{cell.path.name}] supervised from scratch, {labels} labels"
                + _stale_note(run, key))
            ids = labelled_subset(train.labels, labels, train.num_classes, cell.seed)
            result = supervised_from_scratch(cell.cfg.model, train.images.shape[1], train, test,
                                             ids, ecfg, cell.seed, device, progress)
            run.update_summary(method=SUPERVISED, evaluations={key: asdict(result)})
        else:
            if eval_key(protocol, labels) in done:
                continue
            what = "test pairs" if protocol == "retrieval" else "labels"
            say(f"[{cell.path.name}] {protocol} evaluation, {labels} {what}"
                + _stale_note(run, eval_key(protocol, labels)))
            model = pretrained_model(cell.cfg, run, train.input_shapes, device)
            result = evaluate_model(model, protocol, ecfg, cell.seed, train, test, device,
                                    progress, cell.method)
            run.update_summary(evaluations={eval_key(protocol, labels): asdict(result)})
        done = _current(run.summary())


def _stale_note(run: RunDir, key: str) -> str:
    recorded = run.summary().get("evaluations", {})
    return (" (again: the recorded one predates the protocol's current revision)"
            if key in recorded else "")


def _current(summary: dict) -> dict[str, dict]:
    """A summary's evaluations made under their protocol's current revision."""
    from dcco.evaluate import is_current

    return {k: e for k, e in summary.get("evaluations", {}).items() if is_current(e)}


def cell_accuracy(cell: Cell, evaluation: str) -> float | None:
    """The recorded accuracy of one evaluation of a cell, or None if not run yet."""
    if cell.na is not None or not (cell.path / "summary.json").is_file():
        return None
    protocol, labels = evaluation.split("@")
    key = eval_key(SUPERVISED if cell.method == SUPERVISED else protocol, int(labels))
    entry = _current(RunDir(cell.path).summary()).get(key)
    return None if entry is None else entry["accuracy"]


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

_P = "non-IID 1", "non-IID 4", "non-IID 8", "non-IID 16", "IID 4", "IID 8", "IID 16"


def _paper_rows(cco, contrastive, dcco, centralized, supervised):
    row = (lambda values: dict(zip(_P, (None if v is None else v if isinstance(v, str)
                                         else Estimate(v) for v in values))))
    return {"cco_fedavg": row(cco), "contrastive_fedavg": row(contrastive), "dcco": row(dcco),
            "centralized_cco": row([centralized] * 7), "supervised": row([supervised] * 7)}


F = FAILED
PAPER_TABLE1 = {
    "linear@5000": _paper_rows((None, F, 28.7, 30.7, F, 41.2, 44.1),
                               (None, 31.1, 32.4, 31.8, 41.1, 44.1, 46.4),
                               (51.7, 49.6, 48.1, 45.9, 51.4, 52.0, 51.9), 52.6, 42.4),
    "linear@500": _paper_rows((None, F, 13.5, 14.5, F, 26.2, 27.6),
                              (None, 14.8, 15.6, 15.0, 24.7, 27.8, 29.3),
                              (33.3, 31.2, 29.5, 26.7, 33.3, 33.5, 33.5), 34.0, 13.1),
    "finetune@5000": _paper_rows((None, F, 36.3, 38.9, F, 43.0, 46.0),
                                 (None, 40.8, 41.8, 41.3, 44.9, 46.8, 47.4),
                                 (51.5, 50.5, 49.3, 47.7, 51.5, 52.1, 52.0), 52.5, 42.4),
}
"""Vemulapalli et al. 2023, Table 1 (CIFAR-100): evaluation → method → setting → accuracy."""
del F

FEDAVG = ("cco_fedavg", "contrastive_fedavg")


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

    def cell(evaluation: str, method: str, name: str) -> str:
        setting = next(s for s in grid.settings if s.name == name)
        group = [c for c in cells if c.method == method
                 and (c.setting is None or c.setting == setting)]
        if group and group[0].na:
            notes.add(group[0].na)
            return "n/a"
        entry = table[evaluation][method][name]
        finished = 0 if entry is None else entry.n  # type: ignore[union-attr]
        return _show(entry) + (f" ({finished}/{len(group)} seeds)"
                               if 0 < finished < len(group) else "")

    text = _layout(grid.evaluations, grid.methods, [s.name for s in grid.settings], cell)
    if notes:
        text += "\n" + "\n".join(f"- n/a: {why}." for why in sorted(notes)) + "\n"
    return text


def paper_table() -> str:
    """PAPER_TABLE1 in the same layout ("—": not applicable, 1 sample per client)."""
    methods = list(PAPER_TABLE1["linear@5000"])
    return _layout(list(PAPER_TABLE1), methods, list(_P),
                   lambda e, m, s: _show(PAPER_TABLE1[e][m][s]))


# ------------------------------------------------------------------------ the paper's claims

def _best(row: dict[str, dict[str, Entry]], methods: tuple[str, ...], name: str) -> Entry:
    """The best of several methods at a setting; "failed" if every one that ran failed."""
    entries = [row[m][name] for m in methods if m in row and row[m].get(name) is not None]
    numbers = [e for e in entries if isinstance(e, Estimate)]
    if numbers:
        return max(numbers, key=lambda e: e.mean)
    return FAILED if entries else None


def _get(row: dict[str, dict[str, Entry]], method: str, name: str) -> Entry:
    if method == "best FedAvg":
        return _best(row, FEDAVG, name)
    return row.get(method, {}).get(name)


def _diff(a: Entry, b: Entry) -> Difference | str | None:
    if a is None or b is None:
        return None
    if isinstance(a, str) or isinstance(b, str):
        return "FedAvg failed"
    return a.minus(b)


CLAIMS: tuple[tuple[str, str, str, str], ...] = (
    # (quantity shown, what it measures, minuend, subtrahend); subtrahend "@non-IID" means
    # "the same method on non-IID clients with the same samples per client" and "@fewest" the
    # same method on the non-IID setting with the fewest samples per client.
    ("dcco − best FedAvg", "DCCO against the better FedAvg variant", "dcco", "best FedAvg"),
    ("centralized_cco − dcco", "how far DCCO is from centralized CCO", "centralized_cco", "dcco"),
    ("dcco − supervised", "DCCO against supervised training from scratch", "dcco",
     "supervised"),
    ("dcco − dcco at fewest samples", "the trend with samples per client (non-IID)", "dcco",
     "@fewest"),
    ("dcco: IID − non-IID", "the cost of non-IID clients to DCCO", "dcco", "@non-IID"),
    ("best FedAvg: IID − non-IID", "the cost of non-IID clients to FedAvg", "best FedAvg",
     "@non-IID"),
)


def _claim_value(table, evaluation: str, settings: tuple[Setting, ...], name: str,
                 minuend: str, subtrahend: str) -> Difference | str | None:
    row = table.get(evaluation, {})
    setting = next(s for s in settings if s.name == name)
    non_iid = [s for s in settings if s.alpha < 100]
    if subtrahend == "@fewest":
        if setting.alpha >= 100 or not non_iid:
            return None
        fewest = min(non_iid, key=lambda s: s.samples_per_client)
        if fewest == setting:
            return None
        return _diff(_get(row, minuend, name), _get(row, minuend, fewest.name))
    if subtrahend == "@non-IID":
        twin = [s for s in non_iid if s.samples_per_client == setting.samples_per_client]
        if setting.alpha < 100 or not twin:
            return None
        return _diff(_get(row, minuend, name), _get(row, minuend, twin[0].name))
    return _diff(_get(row, minuend, name), _get(row, subtrahend, name))


def _claim_applies(methods: tuple[str, ...], *operands: str) -> bool:
    """Whether the grid ran every method a claim compares."""
    for operand in operands:
        if operand == "best FedAvg":
            if not set(FEDAVG) & set(methods):
                return False
        elif not operand.startswith("@") and operand not in methods:
            return False
    return True


def claims_table(grid: Grid, cells: list[Cell]) -> str:
    """The quantities behind each of the paper's claims, ours beside the paper's: one row per
    claim and evaluation, settings as columns. Ours: mean difference ± its standard error
    over seeds; the paper's CIFAR-100 value in brackets."""
    names = [s.name for s in grid.settings]
    lines = ["| quantity | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    values = _claim_values(grid, cells)
    for evaluation in grid.evaluations:
        lines.append(f"| **{evaluation}** |" + " |" * len(names))
        for label, _, minuend, subtrahend in CLAIMS:
            if not _claim_applies(grid.methods, minuend, subtrahend):
                continue
            row = []
            for mine, theirs in values[evaluation, label]:
                text = "—" if mine is None else str(mine)
                if theirs is not None:
                    text += f" ({theirs})"
                row.append(text)
            if any(x != "—" for x in row):
                lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


_PAPER_SETTINGS = tuple(Setting(n, 1000.0 if n.startswith("IID") else 0.0, int(n.split()[-1]), 0)
                        for n in _P)

Value = Difference | str | None


def _claim_values(grid: Grid, cells: list[Cell]) -> dict[tuple[str, str], list[tuple[Value,
                                                                                    Value]]]:
    """(evaluation, claim label) → [(ours, the paper's)] in the grid's setting order."""
    ours = measured(grid, cells)
    values = {}
    for evaluation in grid.evaluations:
        for label, _, minuend, subtrahend in CLAIMS:
            values[evaluation, label] = [
                (_claim_value(ours, evaluation, grid.settings, s.name, minuend, subtrahend),
                 _claim_value(PAPER_TABLE1, evaluation, _PAPER_SETTINGS, s.name, minuend,
                              subtrahend) if s.name in _P and evaluation in PAPER_TABLE1
                 else None)
                for s in grid.settings]
    return values


def claim_checks(grid: Grid, cells: list[Cell]) -> str:
    """A mechanical reading of the claims table, one line per claim and evaluation: in how
    many settings our difference has the paper's sign, in how many that holds by more than
    two standard errors (needs ≥ 2 seeds on both sides), in how many the opposite sign holds
    by more than two standard errors, and the mean difference, ours against the paper's, over
    the settings where both exist. It says nothing about why; that is the reader's job."""
    values = _claim_values(grid, cells)
    lines = []
    for label, meaning, minuend, subtrahend in CLAIMS:
        if not _claim_applies(grid.methods, minuend, subtrahend):
            continue
        for evaluation in grid.evaluations:
            pairs = [(m, t) for m, t in values[evaluation, label]
                     if isinstance(m, Difference) and isinstance(t, Difference)]
            if not pairs:
                continue
            same = sum(1 for m, t in pairs if m.value * t.value > 0)
            sure = sum(1 for m, t in pairs if m.value * t.value > 0 and m.se is not None
                       and abs(m.value) > 2 * m.se)
            against = sum(1 for m, t in pairs if m.value * t.value < 0 and m.se is not None
                          and abs(m.value) > 2 * m.se)
            lone = sum(1 for m, _ in pairs if m.se is None)
            seeds = (f" ({lone} of those settings have one seed so far, so no standard error)"
                     if lone else "")
            mean_ours = statistics.fmean(m.value for m, _ in pairs)
            mean_paper = statistics.fmean(t.value for _, t in pairs)
            lines.append(
                f"- {meaning[0].upper() + meaning[1:]} ({label}), {evaluation}: the paper's "
                f"sign in {same} of {len(pairs)} settings, beyond two standard errors in "
                f"{sure}; the opposite sign beyond two standard errors in {against}{seeds}. "
                f"Mean over those settings: {_signed(mean_ours)} points (paper: "
                f"{_signed(mean_paper)}).")
    if not lines:
        return ""
    return ("The claims, checked mechanically against the table above (written by the "
            "harness):\n\n" + "\n".join(lines) + "\n")


def accuracy_series(grid: Grid, cells: list[Cell], evaluation: str, method: str,
                    iid: bool) -> list[tuple[int, Estimate]]:
    """(samples per client, accuracy) for a method over IID or non-IID settings."""
    table = measured(grid, cells)
    return [(s.samples_per_client, e) for s in grid.settings
            if (s.alpha >= 100) == iid and isinstance(e := table[evaluation][method][s.name],
                                                      Estimate)]


def plot_trend(grid: Grid, cells: list[Cell], path: Path) -> Path:
    """Accuracy against samples per client, one line per method (error bars: std over seeds);
    one row of panels per evaluation, non-IID on the left and IID on the right."""
    from dcco.report import _pyplot

    plt = _pyplot()
    rows = len(grid.evaluations)
    fig, axes = plt.subplots(rows, 2, figsize=(9, 3.3 * rows), sharey="row", squeeze=False)
    for evaluation, pair in zip(grid.evaluations, axes):
        for ax, iid in zip(pair, (False, True)):
            for method in grid.methods:
                pts = sorted(accuracy_series(grid, cells, evaluation, method, iid),
                             key=lambda p: p[0])
                if pts:
                    ax.errorbar([x for x, _ in pts], [e.mean for _, e in pts],
                                yerr=[e.std for _, e in pts], marker="o", capsize=3,
                                label=method)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("samples per client")
            ax.set_title(("IID" if iid else "non-IID") + f" clients, {evaluation}", fontsize=9)
            ax.grid(alpha=0.3)
        pair[0].set_ylabel("test accuracy (%)")
    # the legend where there are lines: a grid without IID settings leaves the right empty
    labelled = [ax for ax in axes[0] if ax.get_legend_handles_labels()[0]]
    if labelled:
        labelled[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def is_complete(grid: Grid, cells: list[Cell]) -> bool:
    return all(c.na is not None or cell_accuracy(c, e) is not None
               for c in cells for e in grid.evaluations)


__all__ = [
    "PAPER_TABLE1",
    "Cell",
    "Estimate",
    "Grid",
    "Setting",
    "claim_checks",
    "claims_table",
    "code_commits",
    "is_complete",
    "load_grid",
    "measured",
    "paper_table",
    "plan_cells",
    "plot_trend",
    "results_table",
    "run_cell",
    "run_machines",
    "run_versions",
]


CLAIMS_INTRO = ("The paper's claims, measured. Each entry: ours, the mean difference in "
                "points ± its standard error over seeds; in brackets, the paper's CIFAR-100 "
                "value from Table 1:\n")


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
    done = sum(1 for c in cells if c.na is None and all(cell_accuracy(c, e) is not None
                                                         for e in grid.evaluations))
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
    from dcco.checkpoint import atomic_write_text

    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    old = path.read_text() if path.is_file() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = (old.rstrip() + "\n\n" if old else "") + block + "\n"
    atomic_write_text(path, new)
