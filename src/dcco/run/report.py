"""Tables and plots from run directories: what ``dcco compare`` and ``dcco demo`` show.

Reads only files (summary.json, metrics.jsonl); imports matplotlib lazily, with the Agg backend.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dcco.run.checkpoint import atomic_write_text
from dcco.run.rundir import RunDir

COLUMNS = ["run", "method", "dataset", "alpha", "samples/client", "clients/round", "rounds",
           "final loss", "k-NN"]


def knn_features(record: dict[str, Any]) -> str:
    """The space a k-NN figure (a metrics record or a summary) was measured in
    (``dcco.evaluate.KNN_FEATURES``); records from before it was recorded used ``raw``."""
    return record.get("knn_features", "raw")


def knn_cell(record: dict[str, Any]) -> str:
    """A k-NN figure in %, marked with its space unless it is the standardized default, so
    that old raw-cosine figures are not read as today's monitor."""
    if record.get("knn") is None:
        return "—"
    space = knn_features(record)
    return _pct(record["knn"]) + ("" if space == "standardized" else f" ({space})")


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _pct(acc: float | None) -> str:
    return "—" if acc is None else f"{100 * acc:.1f}"


def _progress(run: RunDir) -> dict[str, Any]:
    """What an unfinished run (no summary yet) has logged so far, in the summary's keys; its
    rounds read "<done> of <planned> (unfinished)"."""
    cfg = run.config()
    logged = run.metrics()
    losses = [m for m in logged if "loss" in m]
    knns = [m for m in logged if "knn" in m]
    done = losses[-1]["round"] if losses else 0
    return {"method": cfg.train.method, "dataset": cfg.data.dataset, "alpha": cfg.data.alpha,
            "samples_per_client": cfg.data.samples_per_client,
            "clients_per_round": cfg.train.clients_per_round,
            "rounds": f"{done} of {cfg.train.rounds} (unfinished)",
            "final_loss": losses[-1]["loss"] if losses else None,
            "knn": knns[-1]["knn"] if knns else None,
            **({"knn_features": knn_features(knns[-1])} if knns else {})}


def comparison_rows(runs: Sequence[RunDir]) -> tuple[list[str], list[list[str]]]:
    """One row per run: its setting, final loss, k-NN and every evaluation it holds (in %).
    A run still pretraining (or stopped before its summary) shows what it has logged."""
    summaries = [r.summary() for r in runs]
    summaries = [s or _progress(r) for r, s in zip(runs, summaries, strict=True)]
    protocols = sorted({p for s in summaries for p in s.get("evaluations", {})})
    header = COLUMNS + protocols
    rows = []
    for run, s in zip(runs, summaries, strict=True):
        evals = s.get("evaluations", {})
        rows.append([
            run.path.name, _fmt(s.get("method")), _fmt(s.get("dataset")), _fmt(s.get("alpha")),
            _fmt(s.get("samples_per_client")), _fmt(s.get("clients_per_round")),
            _fmt(s.get("rounds")), _fmt(s.get("final_loss")), knn_cell(s),
        ] + [_pct(evals.get(p, {}).get("accuracy")) for p in protocols])
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*row) for row in rows]) + "\n"


def write_tables(header: list[str], rows: list[list[str]], prefix: Path) -> tuple[Path, Path]:
    """Write ``prefix.md`` and ``prefix.csv``; returns both paths."""
    md, csv_path = prefix.with_suffix(".md"), prefix.with_suffix(".csv")
    atomic_write_text(md, markdown_table(header, rows))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(csv_path, buf.getvalue())
    return md, csv_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _round_axis(ax, rounds: Sequence[int]) -> None:
    """Integer round ticks on an axis from round 0 (a run with one logged point gets 0 to
    that round, not a span of ±0.2 rounds around it)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, max(1, max(rounds)) * 1.04)
    ax.set_xlabel("round")


def _method_of(run: RunDir) -> str:
    summary = run.summary()
    if summary.get("method"):
        return summary["method"]
    try:
        return run.config().train.method
    except ValueError:
        return run.path.name


def plot_run_curves(run: RunDir) -> list[Path]:
    """plots/loss.png and plots/knn.png of one run (those it has data for). The loss is the
    logged mean over each logging window; k-NN accuracy is in %, on a 0–100 axis."""
    plt = _pyplot()
    records = run.metrics()
    run.plots_path.mkdir(exist_ok=True)
    method = _method_of(run)
    written = []
    for key, name in (("loss", "loss.png"), ("knn", "knn.png")):
        points = [(r["round"], r[key]) for r in records if key in r]
        if not points:
            continue
        rounds, values = zip(*points)
        fig, ax = plt.subplots(figsize=(5, 3.2))
        if key == "knn":
            ax.plot(rounds, [100 * v for v in values], marker="o")
            ax.set_ylim(0, 100)
            ax.set_ylabel("k-NN top-1 accuracy (%)")
            ax.set_title(f"{method}: {_knn_title(run, records)}", fontsize=9)
        else:
            ax.plot(rounds, values, marker="o" if len(points) < 30 else None)
            ax.set_ylabel("training loss")
            ax.set_title(f"{method}: {_loss_kind(method)}", fontsize=9)
        _round_axis(ax, rounds)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run.plots_path / name, dpi=120)
        plt.close(fig)
        written.append(run.plots_path / name)
    return written


def _knn_title(run: RunDir, records: list[dict[str, Any]]) -> str:
    """What the k-NN panel shows: the space of its last record and the monitor's sizes (from
    the summary, or from the config while the run has none)."""
    last = [r for r in records if "knn" in r][-1]
    described = run.summary().get("knn_monitor")
    if described and knn_features(run.summary()) == knn_features(last):
        return f"{described} monitor"
    try:
        from dcco.evaluate import knn_description

        e = run.config().eval
        return f"{knn_description(replace(e, knn_features=knn_features(last)))} monitor"
    except (OSError, ValueError):
        return f"{knn_features(last)} k-NN monitor"


def _loss_kind(method: str) -> str:
    """What a method's logged loss measures (``Method.loss_kind``)."""
    from dcco.methods.registry import METHODS

    return METHODS[method].loss_kind if method in METHODS else "training loss"


def loss_panels(runs: Sequence[RunDir]) -> dict[str, list[tuple[str, list[tuple[int, float]]]]]:
    """The logged loss curves of ``runs`` grouped by kind of loss: {loss kind: [(method,
    [(round, loss), ...]), ...]}, in the order of ``runs``; runs with no loss logged are left
    out."""
    panels: dict[str, list[tuple[str, list[tuple[int, float]]]]] = {}
    for run in runs:
        points = [(r["round"], r["loss"]) for r in run.metrics() if "loss" in r]
        if points:
            method = _method_of(run)
            panels.setdefault(_loss_kind(method), []).append((method, points))
    return panels


def plot_loss_curves(runs: Sequence[RunDir], path: Path, title: str = "training loss") -> Path:
    """Loss curves of several runs, one panel per kind of loss (``Method.loss_kind``): only
    losses that measure the same thing share a panel, on their own values (DCCO's loss on the
    round's pooled batch and cco_fedavg's within-client loss are not comparable)."""
    plt = _pyplot()
    panels = loss_panels(runs)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.6),
                             squeeze=False)
    for ax, (kind, curves) in zip(axes[0], panels.items()):
        rounds = []
        for method, points in curves:
            x, y = zip(*points)
            rounds += x
            ax.plot(x, y, label=method, marker="o" if len(points) < 30 else None)
        ax.set_title(kind, fontsize=8)
        ax.set_ylabel("loss")
        _round_axis(ax, rounds)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _comparison_protocols(runs: Sequence[RunDir]) -> tuple[list[dict], list[str]]:
    summaries = [r.summary() for r in runs]
    return summaries, sorted({p for s in summaries for p in s.get("evaluations", {})})


def comparison_plot_paths(runs: Sequence[RunDir], prefix: Path) -> list[Path]:
    """The files ``plot_comparison`` writes: PREFIX-<protocol>.png per evaluation."""
    return [prefix.parent / f"{prefix.name}-{protocol.replace('@', '-')}.png"
            for protocol in _comparison_protocols(runs)[1]]


def plot_comparison(runs: Sequence[RunDir], prefix: Path) -> list[Path]:
    """One bar chart of accuracy per run for each evaluation protocol: PREFIX-<protocol>.png."""
    summaries, protocols = _comparison_protocols(runs)
    written = []
    for protocol, path in zip(protocols, comparison_plot_paths(runs, prefix), strict=True):
        pairs = [(r.path.name, s["evaluations"][protocol]["accuracy"], s.get("method"))
                 for r, s in zip(runs, summaries) if protocol in s.get("evaluations", {})]
        written.append(plot_accuracy_bars([p[0] for p in pairs], [p[1] for p in pairs], path,
                                          f"test accuracy, {protocol}",
                                          families=[family(p[2]) for p in pairs]))
    return written


FAMILY_COLOURS = {"federated": "#4c72b0", "centralized": "#dd8452",
                  "reference baseline": "#8c8c8c"}
"""Bar colours by kind of method."""


def family(method: str | None) -> str:
    """"federated", "centralized" or "reference baseline" (supervised from scratch, a random
    encoder, anything that is not a pretraining method)."""
    from dcco.methods.registry import METHODS

    if method in METHODS:
        return "federated" if METHODS[method].federated else "centralized"
    return "reference baseline"


def plot_accuracy_bars(labels: Sequence[str], accuracies: Sequence[float], path: Path,
                       title: str, families: Sequence[str] | None = None) -> Path:
    """A bar chart of accuracy (in %) per method, coloured by ``families`` (see ``family``)
    with a legend, or all alike when None."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(labels)), 3.6))
    colours = [FAMILY_COLOURS[f] for f in families] if families else FAMILY_COLOURS["federated"]
    bars = ax.bar(range(len(labels)), [100 * a for a in accuracies], color=colours)
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 118)  # room above 100 % for the bar labels and the legend
    ax.set_yticks(range(0, 101, 20))
    if families:
        from matplotlib.patches import Patch

        shown = [f for f in FAMILY_COLOURS if f in families]
        ax.legend([Patch(color=FAMILY_COLOURS[f]) for f in shown], shown, fontsize=7,
                  loc="upper left", ncol=len(shown), frameon=False)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
