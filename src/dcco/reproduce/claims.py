"""The paper's Table 1 and its claims, set beside ours."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from dcco.reproduce.cell import cell_accuracy
from dcco.reproduce.grid import Grid, Setting
from dcco.reproduce.plan import Cell
from dcco.reproduce.result_tables import (
    FAILED,
    Difference,
    Entry,
    Estimate,
    _layout,
    _show,
    _signed,
)

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
    claim and evaluation, settings as columns. Ours: the mean of the per-seed differences ±
    its standard error (``paired_difference``) and the verdict; the paper's CIFAR-100 value
    in brackets."""
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
                if isinstance(mine, Paired) and isinstance(theirs, Difference):
                    text += f" {mine.verdict(theirs.value)}"
                if theirs is not None:
                    text += f" ({theirs})"
                row.append(text)
            if any(x != "—" for x in row):
                lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


_PAPER_SETTINGS = tuple(Setting(n, 1000.0 if n.startswith("IID") else 0.0, int(n.split()[-1]), 0)
                        for n in _P)

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}
"""Student's t, 97.5th percentile, by degrees of freedom: a two-sided 95 % interval."""


def t_975(df: int) -> float:
    """``T_975`` at ``df`` (the next tabulated smaller df beyond the table: conservative)."""
    return T_975[max(k for k in T_975 if k <= df)] if df >= 1 else math.inf


@dataclass(frozen=True)
class Paired:
    """A claim's quantity from runs paired by seed: the mean of the per-seed differences (in
    points), its standard error (sd / √n; None for one seed) and the number of seeds."""

    value: float
    se: float | None
    n: int

    def __str__(self) -> str:
        return _signed(self.value) + ("" if self.se is None else f" ± {self.se:.1f}")

    def sure(self) -> bool:
        """Whether the 95 % interval (Student's t, n − 1 degrees of freedom) excludes 0."""
        return self.se is not None and abs(self.value) > t_975(self.n - 1) * self.se

    def verdict(self, paper: float) -> str:
        """"held" (the paper's sign, the interval excludes 0), "not held" (the opposite sign,
        likewise) or "undecided" (the interval covers 0, or one seed)."""
        if not self.sure():
            return "undecided"
        return "held" if self.value * paper > 0 else "not held"


def paired_difference(a: dict[int, float], b: dict[int, float]) -> Paired | None:
    """The differences a_s − b_s over the seeds s in both (percent points), as ``Paired``;
    None when no seed is in both."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    d = [a[s] - b[s] for s in seeds]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None
    return Paired(statistics.fmean(d), se, len(d))


def _seed_values(cells: list[Cell], evaluation: str, method: str,
                 setting: Setting) -> dict[int, float]:
    """Seed → accuracy in percent of a method's cells at a setting (centralized and supervised
    cells serve every setting)."""
    out = {}
    for c in cells:
        if c.method == method and (c.setting is None or c.setting == setting):
            acc = cell_accuracy(c, evaluation)
            if acc is not None:
                out[c.seed] = 100 * acc
    return out


def _operand(cells: list[Cell], evaluation: str, method: str,
             setting: Setting) -> dict[int, float]:
    """The per-seed values of a claim's operand: a method, or "best FedAvg", the FedAvg
    variant with the higher mean over its seeds at this setting."""
    if method != "best FedAvg":
        return _seed_values(cells, evaluation, method, setting)
    runs = [_seed_values(cells, evaluation, m, setting) for m in FEDAVG]
    runs = [r for r in runs if r]
    return max(runs, key=lambda r: statistics.fmean(r.values())) if runs else {}


def _paired_value(cells: list[Cell], evaluation: str, settings: tuple[Setting, ...],
                  name: str, minuend: str, subtrahend: str) -> Paired | None:
    """Our value of a claim at one setting, paired by seed (``_claim_value``'s rules)."""
    setting = next(s for s in settings if s.name == name)
    non_iid = [s for s in settings if s.alpha < 100]
    if subtrahend in ("@fewest", "@non-IID"):
        if subtrahend == "@fewest":
            if setting.alpha >= 100 or not non_iid:
                return None
            other = min(non_iid, key=lambda s: s.samples_per_client)
            if other == setting:
                return None
        else:
            twin = [s for s in non_iid if s.samples_per_client == setting.samples_per_client]
            if setting.alpha < 100 or not twin:
                return None
            other = twin[0]
        return paired_difference(_operand(cells, evaluation, minuend, setting),
                                 _operand(cells, evaluation, minuend, other))
    return paired_difference(_operand(cells, evaluation, minuend, setting),
                             _operand(cells, evaluation, subtrahend, setting))


Value = Difference | Paired | str | None


def _claim_values(grid: Grid, cells: list[Cell]) -> dict[tuple[str, str], list[tuple[Value,
                                                                                    Value]]]:
    """(evaluation, claim label) → [(ours, paired by seed; the paper's)] in the grid's setting
    order."""
    values = {}
    for evaluation in grid.evaluations:
        for label, _, minuend, subtrahend in CLAIMS:
            values[evaluation, label] = [
                (_paired_value(cells, evaluation, grid.settings, s.name, minuend, subtrahend),
                 _claim_value(PAPER_TABLE1, evaluation, _PAPER_SETTINGS, s.name, minuend,
                              subtrahend) if s.name in _P and evaluation in PAPER_TABLE1
                 else None)
                for s in grid.settings]
    return values


def claim_checks(grid: Grid, cells: list[Cell]) -> str:
    """A mechanical reading of the claims table, one line per claim and evaluation: in how
    many settings the claim is held (the paper's sign, the 95 % interval of the per-seed
    differences excluding 0), not held (the opposite sign, likewise) or undecided, and the
    mean difference, ours against the paper's, over the settings where both exist. It says
    nothing about why; that is the reader's job."""
    values = _claim_values(grid, cells)
    lines = []
    for label, meaning, minuend, subtrahend in CLAIMS:
        if not _claim_applies(grid.methods, minuend, subtrahend):
            continue
        for evaluation in grid.evaluations:
            pairs = [(m, t) for m, t in values[evaluation, label]
                     if isinstance(m, Paired) and isinstance(t, Difference)]
            if not pairs:
                continue
            verdicts = [m.verdict(t.value) for m, t in pairs]
            lone = sum(1 for m, _ in pairs if m.se is None)
            seeds = (f" ({lone} of those settings have one seed so far)" if lone else "")
            mean_ours = statistics.fmean(m.value for m, _ in pairs)
            mean_paper = statistics.fmean(t.value for _, t in pairs)
            lines.append(
                f"- {meaning[0].upper() + meaning[1:]} ({label}), {evaluation}: held in "
                f"{verdicts.count('held')} of {len(pairs)} settings, not held in "
                f"{verdicts.count('not held')}, undecided in {verdicts.count('undecided')}"
                f"{seeds}. Mean over those settings: {_signed(mean_ours)} points (paper: "
                f"{_signed(mean_paper)}).")
    if not lines:
        return ""
    return ("The claims, checked mechanically against the table above (written by the "
            "harness): held where the per-seed differences have the paper's sign and their "
            "95 % interval (Student's t) excludes zero, not held where the opposite sign is "
            "as sure, undecided otherwise.\n\n" + "\n".join(lines) + "\n")


CLAIMS_INTRO = ("The paper's claims, measured. Each entry: ours, the mean over seeds of the "
                "per-seed difference in points (runs of one seed share the partition, the "
                "initialisation and the labelled subset) ± its standard error, and whether "
                "the paper's claim is held, not held or undecided within that noise; in "
                "brackets, the paper's CIFAR-100 value from Table 1:\n")

