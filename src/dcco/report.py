"""Tables and plots from run directories: what ``dcco compare`` and ``dcco demo`` show.

Reads only files (summary.json, metrics.jsonl); imports matplotlib lazily, with the Agg backend.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcco.checkpoint import atomic_write_text
from dcco.rundir import RunDir

COLUMNS = ["run", "method", "dataset", "alpha", "samples/client", "clients/round", "rounds",
           "final loss", "k-NN"]


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
    knns = [m["knn"] for m in logged if "knn" in m]
    done = losses[-1]["round"] if losses else 0
    return {"method": cfg.train.method, "dataset": cfg.data.dataset, "alpha": cfg.data.alpha,
            "samples_per_client": cfg.data.samples_per_client,
            "clients_per_round": cfg.train.clients_per_round,
            "rounds": f"{done} of {cfg.train.rounds} (unfinished)",
            "final_loss": losses[-1]["loss"] if losses else None,
            "knn": knns[-1] if knns else None}


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
            _fmt(s.get("rounds")), _fmt(s.get("final_loss")), _pct(s.get("knn")),
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


def plot_run_curves(run: RunDir) -> list[Path]:
    """plots/loss.png and plots/knn.png of one run (those it has data for)."""
    plt = _pyplot()
    records = run.metrics()
    run.plots_path.mkdir(exist_ok=True)
    written = []
    for key, ylabel, name in (("loss", "training loss", "loss.png"),
                              ("knn", "k-NN top-1 accuracy", "knn.png")):
        points = [(r["round"], r[key]) for r in records if key in r]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(*zip(*points), marker="o" if len(points) < 30 else None)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{run.summary().get('method', run.path.name)}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run.plots_path / name, dpi=120)
        plt.close(fig)
        written.append(run.plots_path / name)
    return written


def plot_loss_curves(runs: Sequence[RunDir], path: Path) -> Path:
    """Loss curves of several runs on one figure (each normalised by its first value)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for run in runs:
        points = [(r["round"], r["loss"]) for r in run.metrics() if "loss" in r]
        if points:
            x, y = zip(*points)
            ax.plot(x, [v / y[0] for v in y], label=run.summary().get("method", run.path.name))
    ax.set_xlabel("round")
    ax.set_ylabel("loss / first logged loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_comparison(runs: Sequence[RunDir], prefix: Path) -> list[Path]:
    """One bar chart of accuracy per run for each evaluation protocol: PREFIX-<protocol>.png."""
    summaries = [r.summary() for r in runs]
    protocols = sorted({p for s in summaries for p in s.get("evaluations", {})})
    written = []
    for protocol in protocols:
        pairs = [(f"{r.path.name}", s["evaluations"][protocol]["accuracy"])
                 for r, s in zip(runs, summaries) if protocol in s.get("evaluations", {})]
        path = prefix.parent / f"{prefix.name}-{protocol.replace('@', '-')}.png"
        written.append(plot_accuracy_bars([p[0] for p in pairs], [p[1] for p in pairs], path,
                                          f"test accuracy, {protocol}"))
    return written


def plot_accuracy_bars(labels: Sequence[str], accuracies: Sequence[float], path: Path,
                       title: str) -> Path:
    """A bar chart of accuracy (in %) per method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(labels)), 3.6))
    bars = ax.bar(range(len(labels)), [100 * a for a in accuracies], color="#4c72b0")
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
