"""The healthy-DCCO study's tables (issue 97; docs/results/healthy-dcco.md): each recipe of
experiments/healthy_dcco.toml that has run, its validation probe, and its health by round:
the views' mean correlation C_ii, the median and largest dimension variance in units of the
loss's ε, and C's effective rank, read from the cell's metrics.jsonl (the round's pooled
statistics S_A).

    python experiments/healthy_dcco_table.py            # print the tables
    python experiments/healthy_dcco_table.py --write    # into docs/results/healthy-dcco.md
    python experiments/healthy_dcco_table.py --check    # exit 1 if the doc differs

Reads only records; a cell still running or not yet run is listed as such.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from dcco.reproduce.verdicts import Paired

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "experiments" / "healthy_dcco.toml"
RESULTS = ROOT / "experiments" / "results" / "healthy_dcco"
DOC = ROOT / "docs" / "results" / "healthy-dcco.md"
TAG = "healthy-dcco-table"
EVALUATION = "linear@5000"
ROUNDS = (50, 100, 300)
"""The rounds whose health the table shows, with the cell's last."""
EPS = 1e-5
"""The pick's ε: variances are shown in its units for every recipe (a recipe at ε = 1e-12
reads the same units, so its scale compares with the pick's)."""


def recipes() -> dict[str, list[str]]:
    """Each recipe's name and what it changes from the pick (r1): its overrides that r1
    does not have."""
    from dcco.reproduce.grid import load_grid

    rule = load_grid(GRID, "study").tuning.recipes["dcco"]
    pick = set(rule[0].overrides)
    return {r.name: [o for o in r.overrides if o not in pick] for r in rule}


def _split(name: str) -> tuple[str, str, str]:
    """A cell's (setting, recipe, seed) from its folder's name: "non-iid-4-dcco-r13-s0" →
    ("non-iid-4", "r13", "s0"); centralized CCO's "centralized_cco-r13-s0" has the setting
    "centralized" (128 random images a step, non-IID 4's pooled batch)."""
    if name.startswith("centralized_cco-"):
        setting, rest = "centralized", name.removeprefix("centralized_cco-")
    else:
        setting, _, rest = name.partition("-dcco-")
    recipe, _, seed = rest.partition("-")
    return setting, recipe, seed


def _cells() -> list[Path]:
    """The finished cells (a summary written; a cell still running is not a record)."""
    def order(path: Path) -> tuple[str, int, str]:
        setting, recipe, seed = _split(path.name)
        return setting, int(recipe[1:]), seed

    found = [*RESULTS.glob("*-dcco-r*-s*"), *RESULTS.glob("centralized_cco-r*-s*")]
    return sorted((p for p in found if (p / "summary.json").is_file()), key=order)


def _health(records: list[dict], at: int) -> dict | None:
    readings = [r for r in records if "corr_diag" in r and r["round"] <= at]
    return readings[-1] if readings else None


def _fmt(x: float) -> str:
    return f"{x:.2g}" if x < 100 else f"{x:.0f}"


@functools.cache
def _records(cell: Path) -> tuple[dict, list[dict]]:
    """A finished cell's summary and metrics records, read once for both tables."""
    summary = json.loads((cell / "summary.json").read_text())
    return summary, [json.loads(x) for x in (cell / "metrics.jsonl").read_text().splitlines()]


def row(cell: Path, changes: dict[str, list[str]]) -> list[str]:
    """A cell's row: its recipe, the change, the probe, its health at ``ROUNDS`` and its
    last round, its collapse warning."""
    setting, recipe, seed = _split(cell.name)
    summary, records = _records(cell)
    evaluation = summary.get("evaluations", {}).get(EVALUATION)
    last = max((r["round"] for r in records if "corr_diag" in r), default=0)
    probe = f"{100 * evaluation['accuracy']:.1f}" if evaluation else "—"
    parts = []
    for name, pick in (("C_ii", lambda h: f"{h['corr_diag']:.2f}"),
                       ("median var / ε", lambda h: _fmt(h["median_var"] / EPS)),
                       ("largest var / ε", lambda h: _fmt(h["max_var"] / EPS)),
                       ("rank", lambda h: f"{h['eff_rank']:.1f}")):
        values = []
        for at in (*[r for r in ROUNDS if r < last], last):
            h = _health(records, at)
            values.append(pick(h) if h is not None and "median_var" in h else "–")
        parts.append(" / ".join(values))
    warning = summary.get("collapse_warning") or next(
        (r["message"] for r in records if r.get("warning") == "collapse"), None)
    warned = warning.split(":")[0].replace("collapse at ", "") if warning else "none"
    change = ", ".join(changes.get(recipe, [])) or "— (the pick)"
    return [f"{setting} {recipe} {seed}", change.replace('"', ""), probe, *parts,
            f"{last}", warned]


def _seed_record(cell: Path) -> tuple[float | None, bool, float, float]:
    """A finished cell's (probe %, warned, last median variance / ε, last C_ii)."""
    summary, records = _records(cell)
    evaluation = summary.get("evaluations", {}).get(EVALUATION)
    warned = bool(summary.get("collapse_warning") or any(
        r.get("warning") == "collapse" for r in records))
    last = [r for r in records if "median_var" in r][-1]
    return (100 * evaluation["accuracy"] if evaluation else None, warned,
            last["median_var"] / EPS, last["corr_diag"])


COMPARISONS = (
    (("non-iid-4", "r13"), ("non-iid-4", "r1"), "eq. 1's recipe against the braked pick"),
    (("non-iid-16", "r13"), ("non-iid-16", "r1"), "eq. 1's recipe against the braked pick"),
    (("non-iid-4", "r15"), ("non-iid-4", "r13"), "eq. 1 as written (ε 1e-12) against r13"),
    (("centralized", "r13"), ("non-iid-4", "r13"),
     "the bound: centralized CCO against DCCO, one recipe"),
)
"""The paired comparisons the study reads, each (A, B, what it asks): A − B by seed."""


def seeds_table() -> str:
    """Each (setting, recipe) run on several seeds: its probe by seed, their mean, the seeds
    warned, the smallest last median variance and C_ii; then ``COMPARISONS``, paired by seed,
    with the verdict's word, t and two-sided p (``dcco.reproduce.verdicts``) from 2 seeds."""
    groups: dict[tuple[str, str], dict[str, tuple]] = {}
    for cell in _cells():
        setting, recipe, seed = _split(cell.name)
        groups.setdefault((setting, recipe), {})[seed] = _seed_record(cell)
    header = ("| setting | recipe | seeds | probe by seed (%) | mean (%) | seeds warned | "
              "smallest last median var / ε | smallest last C_ii |")
    lines = [header, "|" + "---|" * 8]
    for (setting, recipe), by_seed in groups.items():
        if len(by_seed) < 2:
            continue
        probes = [v[0] for v in by_seed.values() if v[0] is not None]
        lines.append(
            f"| {setting} | {recipe} | {', '.join(sorted(by_seed))} | "
            f"{' / '.join(f'{p:.1f}' for p in probes)} | {sum(probes) / len(probes):.1f} | "
            f"{sum(v[1] for v in by_seed.values())} of {len(by_seed)} | "
            f"{_fmt(min(v[2] for v in by_seed.values()))} | "
            f"{min(v[3] for v in by_seed.values()):.2f} |")
    paired = []
    for (a_setting, a_recipe), (b_setting, b_recipe), what in COMPARISONS:
        mine, theirs = groups.get((a_setting, a_recipe), {}), groups.get((b_setting, b_recipe), {})
        diffs = [(seed, mine[seed][0] - theirs[seed][0]) for seed in sorted(mine)
                 if seed in theirs and None not in (mine[seed][0], theirs[seed][0])]
        if not diffs:
            continue
        d = Paired(tuple(x for _, x in diffs))
        strength = (f"; {d.word}, t {d.t:.1f}, two-sided p {d.p:.2g}" if d.word else "")
        paired.append(f"- {what}: {a_setting} {a_recipe} − {b_setting} {b_recipe} by seed "
                      f"{', '.join(f'{s} {x:+.1f}' for s, x in diffs)} (mean {d.mean:+.1f} "
                      f"points over {d.n} seed{'s' * (d.n > 1)}{strength})")
    return "\n".join([*lines, "", *paired])


def table() -> str:
    """The study's table, in Markdown."""
    changes = recipes()
    header = ["cell", "change from the pick", f"validation {EVALUATION} (%)",
              "C_ii", "median var / ε", "largest var / ε", "C's effective rank",
              "rounds", "collapse warning"]
    rows = [row(c, changes) for c in _cells()]
    intro = (f"Health at rounds {', '.join(map(str, ROUNDS))} and the cell's last (a value "
             f"each, separated by /), from the round's pooled statistics; variances in units "
             f"of ε = {EPS:g}. {len(rows)} cells recorded.")
    lines = [
        intro,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "By seed (a setting and recipe run on more than one seed; a cell's last reading):",
        "",
        seeds_table(),
        "",
        "Written by `python experiments/healthy_dcco_table.py --write` from "
        + "`experiments/results/healthy_dcco/`."]
    return "\n".join(lines)


def _replace(text: str, block: str) -> str:
    begin, end = f"<!-- {TAG}:begin -->", f"<!-- {TAG}:end -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write it into {DOC.name}")
    ap.add_argument("--check", action="store_true", help="exit 1 if the doc differs")
    args = ap.parse_args(argv)
    block = table()
    if args.write or args.check:
        text = DOC.read_text()
        new = _replace(text, block)
        if args.check:
            if new != text:
                print(f"{DOC} differs from the records: python {Path(__file__).name} --write")
                return 1
            return 0
        DOC.write_text(new)
        return 0
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
