"""The fair fight's final table (issue 79): every method at its tuned pick, on the test split,
mean ± sd over seeds, beside the floors (raw pixels, the untrained encoders) and the paper's
number where the paper has one; then the verdicts, paired by seed, in the words
``dcco.reproduce.verdicts`` defines.

Reads only records: the final cells (``dcco reproduce experiments/fair_fmnist_final.toml
--scale final --out experiments/results/fair_fmnist-final``), the picks they ran
(experiments/results/fair_fmnist-tune/picks.json), the floors
(``python experiments/fair_baselines.py``) and the paper's Table 1. One command writes it into
docs/results/README.md (where it opens the index) and into the README's status:

    python experiments/fair_table.py --write

``--check`` exits 1 when either file's table differs from the records (tests/test_fair_table.py
runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "fair_fmnist-final"
GRIDS = ((ROOT / "experiments" / "fair_fmnist_final.toml", RESULTS),
         (ROOT / "experiments" / "fair_fmnist_cross_silo.toml",
          ROOT / "experiments" / "results" / "fair_fmnist-cross-silo"))
"""The final grids (scale ``final``) and their cells' folders: their settings are the table's
columns, in this order."""
PICKS = ROOT / "experiments" / "results" / "fair_fmnist-tune" / "picks.json"
BASELINES = RESULTS / "baselines.json"
EVALUATION = "linear@5000"
TAG = "fair-table"
TARGETS = {"docs": ROOT / "docs" / "results" / "README.md", "readme": ROOT / "README.md"}
NAMES = {"dcco": "DCCO", "cco_fedavg": "CCO + FedAvg", "contrastive_fedavg": "contrastive FedAvg",
         "fedsc": "FedSC", "moco_fedavg": "MoCo v2 + FedAvg", "byol_fedavg": "BYOL + FedAvg",
         "simsiam_fedavg": "SimSiam + FedAvg", "centralized_cco": "centralized CCO (bound)",
         "fedu": "FedU", "fedema": "FedEMA"}
FLOORS = ("raw pixels", "untrained (gn)", "untrained (bn)")
SHORT = {"optim.lr": "lr", "optim.weight_decay": "wd", "model.norm": "", "loss.moco_queue":
         "queue", "loss.moco_directions": "", "loss.divergence": "", "loss.fedu_threshold":
         "thr", "loss.fedema_mix": "", "model.clip_encodings": "clip",
         "optim.vector_lr_scale": "vector lr ×"}


def recipe_text(overrides: list[str]) -> str:
    """A pick's overrides, short: ``lr 1.5, wd 1e-06, gn``."""
    parts = []
    for item in overrides:
        key, value = item.split("=", 1)
        value = value.strip('"')
        name = SHORT.get(key, key)
        parts.append(f"{name} {value}" if name else value)
    return ", ".join(parts)


def collect() -> dict:
    """Everything the table shows, read from the records."""
    from dcco.reproduce import cell_accuracy, load_grid, plan_cells

    picks = json.loads(PICKS.read_text())["methods"]
    grids = [load_grid(path, "final") for path, _ in GRIDS]
    methods = grids[0].methods
    if any(g.methods != methods for g in grids):
        raise SystemExit("the final grids list different methods: " + "; ".join(
            f"{path.name}: {', '.join(g.methods)}" for (path, _), g in zip(GRIDS, grids)))
    settings = [s.name for g in grids for s in g.settings]
    scores: dict[str, dict[str, dict[int, float]]] = {}
    versions, extras, collapsed, planned = [], {}, set(), 0
    for grid, (_, results) in zip(grids, GRIDS):
        cells = plan_cells(grid, results)
        planned += sum(c.na is None for c in cells)
        for cell in cells:
            acc = cell_accuracy(cell, EVALUATION)
            if acc is None:
                continue
            summary = json.loads((cell.path / "summary.json").read_text())
            versions.append(json.loads((cell.path / "version.json").read_text()))
            # a centralized cell has no setting: it stands for each of its grid's settings
            for setting in [cell.setting] if cell.setting else grid.settings:
                by = scores.setdefault(cell.method, {}).setdefault(setting.name, {})
                by[cell.seed] = 100 * acc
                if summary.get("collapse_warning"):
                    collapsed.add((cell.method, setting.name, cell.seed))
            if cell.method in ("fedu", "fedema"):
                extras.setdefault((cell.method, cell.setting.name), []).append(
                    _state_figures(cell.path))
    floors: dict[str, dict[int, float]] = {}
    floor_versions = []
    if BASELINES.is_file():
        record = json.loads(BASELINES.read_text())
        floor_versions.append(record["version"])
        for seed, row in record["seeds"].items():
            for name, result in row.items():
                floors.setdefault(name, {})[int(seed)] = 100 * result["accuracy"]
    norms = {m: next(o.split("=", 1)[1].strip('"') for o in p["overrides"]
                     if o.startswith("model.norm=")) for m, p in picks.items()}
    return {"methods": methods, "settings": settings, "planned": planned, "picks": picks,
            "scores": scores, "floors": floors, "versions": versions,
            "floor_versions": floor_versions, "norms": norms, "extras": extras,
            "collapsed": collapsed}


def _state_figures(path: Path) -> dict[str, float]:
    """The means over a FedU or FedEMA cell's logged rounds of its stateful figures."""
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    keys = ("returning_clients", "divergence", "fedu_global_predictor", "fedema_mu")
    return {k: statistics.fmean(v) for k in keys
            if (v := [r[k] for r in rows if isinstance(r.get(k), (int, float))])}


def _estimate(values: dict[int, float], collapsed: int = 0) -> str:
    """``71.2 ± 0.4 (3)``: mean ± sd (seeds), with how many of them the watch warned."""
    if not values:
        return "—"
    xs = [values[s] for s in sorted(values)]
    sd = f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else ""
    return (f"{statistics.fmean(xs):.1f}{sd} ({len(xs)}"
            + (f"; {collapsed} warned" if collapsed else "") + ")")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(cells: list[str]) -> list[str]:
    return [_row(cells), "|---" * len(cells) + "|"]


class _View:
    """The records as the tables read them: a method's seeds at a setting, its collapses."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.settings = data["settings"]

    def score(self, method: str, setting: str) -> dict[int, float]:
        return self.data["scores"].get(method, {}).get(setting, {})

    def collapses(self, method: str, setting: str) -> int:
        return sum(m == method and s == setting for m, s, _ in self.data["collapsed"])

    def floor(self, name: str) -> dict[int, float]:
        return self.data["floors"].get(name, {})


def _accuracy_lines(view: _View) -> list[str]:
    """Method × setting, the floors, and the paper's numbers at the settings it has."""
    from dcco.reproduce import PAPER_TABLE1

    data, paper = view.data, PAPER_TABLE1[EVALUATION]
    in_paper = [s for s in view.settings if any(s in row for row in paper.values())]
    lines = _head(["method (its pick)", *view.settings,
                   *(f"paper, CIFAR-100, {s}" for s in in_paper)])
    for method in data["methods"]:
        pick = data["picks"][method]
        lines.append(_row(
            [f"{NAMES[method]} ({pick['pick']}: {recipe_text(pick['overrides'])})",
             *(_estimate(view.score(method, s), view.collapses(method, s))
               for s in view.settings),
             *(_paper(paper.get(method, {}).get(s)) for s in in_paper)]))
    for floor in FLOORS:
        lines.append(_row([f"*{floor}*", *[_estimate(view.floor(floor))] * len(view.settings),
                           *["—"] * len(in_paper)]))
    return lines


def _against_dcco(view: _View) -> dict[tuple[str, str], object]:
    """Each method − DCCO by setting, paired by seed (``Paired``, or None without a seed
    in common)."""
    from dcco.reproduce.verdicts import paired

    return {(m, s): paired(view.score(m, s), view.score("dcco", s))
            for m in view.data["methods"] if m != "dcco" for s in view.settings}


def _strength(d) -> str:
    """``t 4.1, p 0.06``: the paired t and its two-sided p."""
    t = "∞" if abs(d.t) == float("inf") else f"{abs(d.t):.1f}"
    return f"t {'−' if d.t < 0 else ''}{t}, p {d.p:.2g}"


def _verdict_lines(view: _View) -> list[str]:
    """Each method against DCCO, paired by seed, with the verdict's word, its paired t and
    two-sided p."""
    diffs = _against_dcco(view)
    lines = _head(["method", *(f"{s}: − DCCO" for s in view.settings),
                   *(f"{s}: verdict (t, p)" for s in view.settings)])
    for method in view.data["methods"]:
        if method != "dcco":
            ds = [diffs[method, s] for s in view.settings]
            lines.append(_row([NAMES[method], *(str(d) if d else "—" for d in ds),
                               *(f"**{d.word}** ({_strength(d)})" if d and d.word else "—"
                                 for d in ds)]))
    return lines


def _holm_line(view: _View) -> str:
    """How many comparisons the verdicts make, and which leads and trails survive Holm's
    correction for them at a family-wise 5 %."""
    from dcco.reproduce.verdicts import holm

    judged = [(k, d) for k, d in _against_dcco(view).items() if d is not None and d.p is not None]
    if not judged:
        return "No comparison against DCCO has two seeds yet."
    survive = holm([d.p for _, d in judged])
    decisive = [(k, d, ok) for (k, d), ok in zip(judged, survive) if d.word != "level"]
    kept = [f"{NAMES[m]} {d.word} DCCO at {s}" for (m, s), d, ok in decisive if ok]
    return (f"The verdicts make {len(judged)} comparison{'s' * (len(judged) != 1)} against "
            f"DCCO; at a family-wise 5 % "
            f"(Holm's correction over all {len(judged)}), "
            + (f"{len(kept)} of the {len(decisive)} leads and trails survive: "
               + "; ".join(kept) if kept else
               f"none of the {len(decisive)} leads and trails survives")
            + f". The smallest p is {min(d.p for _, d in judged):.2g}, against Holm's first "
              f"bar of 0.05 / {len(judged)} = {0.05 / len(judged):.2g}.")


def _floor_lines(view: _View) -> list[str]:
    """Each method against the raw pixels and its own normalisation's untrained encoder."""
    from dcco.reproduce.verdicts import paired

    lines = _head(["method", *(f"{s}: − raw pixels" for s in view.settings),
                   *(f"{s}: − untrained" for s in view.settings)])
    for method in view.data["methods"]:
        untrained = view.floor(f"untrained ({view.data['norms'][method]})")
        cells = []
        for floor in (view.floor("raw pixels"), untrained):
            for s in view.settings:
                d = paired(view.score(method, s), floor)
                cells.append("—" if d is None else f"{d}, **{d.floor_word()}**"
                             if d.floor_word() else str(d))
        lines.append(_row([NAMES[method], *cells]))
    return lines


def _state_lines(extras: dict) -> list[str]:
    """FedU's and FedEMA's logged figures, cell means averaged over seeds."""
    lines = _head(["method", "setting", "seeds", "returning clients", "divergence",
                   "took global predictor", "μ"])
    for (method, setting), figures in sorted(extras.items()):
        means = []
        for key in ("returning_clients", "divergence", "fedu_global_predictor", "fedema_mu"):
            xs = [f[key] for f in figures if key in f]
            means.append(f"{statistics.fmean(xs):.3g}" if xs else "—")
        lines.append(_row([NAMES[method], setting, str(len(figures)), *means]))
    return lines


def render(data: dict, brief: bool = False) -> str:
    """The Markdown block: the accuracies, then (unless ``brief``) the verdicts."""
    view = _View(data)
    done, planned = len(data["versions"]), data["planned"]
    progress = (f"{done} of the final grids' {planned} cells are finished"
                + ("." if done == planned else
                   "; the rest are under way and will fill in by the same command."))
    if brief:
        return "\n".join([
            (f"Fashion-MNIST, `{EVALUATION}` on the test split, %: mean ± sd over seeds (how "
             f"many). {progress} Floors in italics; the paper's numbers are CIFAR-100's."),
            "", *_accuracy_lines(view)]) + "\n"
    commits = Counter(v["git_commit"] for v in data["versions"] + data["floor_versions"])
    cpus = Counter(v["cpu"] for v in data["versions"])
    text = [
        (f"Fashion-MNIST, `{EVALUATION}` on the 10,000 test photos, in percent: mean ± sd "
         f"over seeds (how many seeds). {progress} \"Warned\": the run's collapse watch "
         "warned (`collapse_warning` in its summary.json); the seed counts in the mean like "
         "any other. A warned run has not necessarily collapsed: \"collapsed\" means its "
         "encodings ended on about one line, C's effective rank under 2 (fair-fight.md). "
         "Floors (in italics) are probed alike at the same seeds; the untrained "
         "encoders are the weights each cell of that seed and normalisation starts from. The "
         "paper's numbers are CIFAR-100 at the paper's network: a trend to compare, not a "
         "figure to match."),
        "", *_accuracy_lines(view), "",
        ("The cells' code: "
         + ", ".join(f"`{c[:12]}` ({n} records)" for c, n in sorted(commits.items()))
         + "; CPUs: " + ", ".join(f"{c} ({n} cells)" for c, n in sorted(cpus.items()))
         + ". Written by `python experiments/fair_table.py --write` from the records ("
         + ", ".join(f"`{r.relative_to(ROOT)}/`" for _, r in GRIDS) + ")."),
        "",
        ("Against DCCO, paired by seed (method − DCCO, points: mean ± sd, on how many seeds "
         "ahead) and the verdict in the words defined above, with the paired t and its "
         "two-sided p (Student's t, seeds − 1 degrees of freedom):"),
        "", *_verdict_lines(view), "", _holm_line(view), "",
        ("Against the floors, paired by seed (method − floor; the untrained encoder of the "
         "method's own normalisation):"),
        "", *_floor_lines(view)]
    if data["extras"]:
        text += ["", ("What the stateful peers did (means over each cell's logged rounds, then "
                      "over its seeds): clients a round that had trained before, their "
                      "divergence (FedU's travelled distance or FedEMA's distance at receipt), "
                      "the share of them that took the global predictor (FedU) and FedEMA's "
                      "μ:"), "", *_state_lines(data["extras"])]
    return "\n".join(text) + "\n"


def _paper(entry) -> str:
    if entry is None:
        return "—"
    return entry if isinstance(entry, str) else f"{entry.mean:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true",
                      help="write the table into docs/results/README.md and README.md")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if either file's table differs from the records")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from dcco.reproduce import write_section

    data = collect()
    blocks = {"docs": render(data), "readme": render(data, brief=True)}
    if args.check:
        stale = [name for name, path in TARGETS.items()
                 if _block(path.read_text()) != blocks[name].rstrip()]
        for name in stale:
            print(f"{TARGETS[name].relative_to(ROOT)}: the fair-fight table differs from the "
                  f"records; run python experiments/fair_table.py --write", file=sys.stderr)
        return 1 if stale else 0
    if args.write:
        for name, path in TARGETS.items():
            write_section(path, blocks[name], TAG)
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    print(blocks["docs"], end="")
    return 0


def _block(text: str) -> str | None:
    begin, end = f"<!-- {TAG}:begin -->", f"<!-- {TAG}:end -->"
    if begin not in text or end not in text:
        return None
    return text[text.index(begin) + len(begin):text.index(end)].strip("\n")


if __name__ == "__main__":
    sys.exit(main())
