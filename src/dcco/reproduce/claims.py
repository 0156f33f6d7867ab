"""The paper's Table 1 and its claims, set beside ours."""

from __future__ import annotations

import statistics

from dcco.reproduce.grid import Grid, Setting
from dcco.reproduce.plan import Cell
from dcco.reproduce.tables import (
    FAILED,
    Difference,
    Entry,
    Estimate,
    _layout,
    _show,
    _signed,
    measured,
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


CLAIMS_INTRO = ("The paper's claims, measured. Each entry: ours, the mean difference in "
                "points ± its standard error over seeds; in brackets, the paper's CIFAR-100 "
                "value from Table 1:\n")

