"""``dcco reproduce``: a declarative, restartable experiment grid (the paper's Table 1 protocol).

A grid file (e.g. ``experiments/table1_fmnist.toml``) holds a base run config, the client
settings (α, samples per client, clients per round), the methods, the evaluations, and scales
(``small`` for a CPU, ``full`` for the paper's network and budget). Every cell is a run
directory; a cell whose pretraining and evaluations are already recorded is skipped, and an
interrupted pretraining resumes from its checkpoint. The results table (mean ± std over seeds,
"n/a" with its reason where a method cannot run) is rendered from the run directories alone.

One module per job:

- ``grid``: the grid file (``load_grid``);
- ``plan``: the cells, their configs and run directories (``plan_cells``, ``select_cells``);
- ``cell``: running one cell and reading what it recorded (``run_cell``, ``cell_accuracy``);
- ``pool``: running many cells side by side within a time budget (``run_pool``);
- ``tables``: accuracies over seeds in the paper's layout (``measured``, ``results_table``);
- ``claims``: the paper's Table 1 and its claims beside ours;
- ``plots``: accuracy against samples per client;
- ``section``: the Markdown results section with the runs' provenance.
"""

from dcco.reproduce.cell import cell_accuracy, is_complete, run_cell
from dcco.reproduce.claims import PAPER_TABLE1, claim_checks, claims_table, paper_table
from dcco.reproduce.grid import PROTOCOLS, SUPERVISED, Grid, Setting, load_grid
from dcco.reproduce.plan import Cell, plan_cells, select_cells
from dcco.reproduce.plots import plot_trend
from dcco.reproduce.result_tables import Estimate, measured, results_table
from dcco.reproduce.section import (
    code_commits,
    results_markdown,
    run_machines,
    run_versions,
    write_section,
)

__all__ = [
    "PAPER_TABLE1",
    "PROTOCOLS",
    "SUPERVISED",
    "Cell",
    "Estimate",
    "Grid",
    "Setting",
    "cell_accuracy",
    "claim_checks",
    "claims_table",
    "code_commits",
    "is_complete",
    "load_grid",
    "measured",
    "paper_table",
    "plan_cells",
    "plot_trend",
    "results_markdown",
    "results_table",
    "run_cell",
    "run_machines",
    "run_versions",
    "select_cells",
    "write_section",
]
