"""The grid's plot: accuracy against samples per client."""

from __future__ import annotations

from pathlib import Path

from dcco.reproduce.grid import Grid
from dcco.reproduce.plan import Cell
from dcco.reproduce.result_tables import Estimate, measured


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
    from dcco.run.report import _pyplot

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

