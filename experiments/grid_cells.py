"""One cell's run config from a grid file, for the scripts that run a cell round by round
(the diagnoses), with the data folder of this machine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dcco.config import RunConfig
from dcco.reproduce import load_grid, plan_cells, select_cells


def cell_config(grid_file: Path, scale: str, cell: str, data_dir: str) -> RunConfig:
    """The config of ``cell`` (its run-directory name, e.g. ``non-iid-4-dcco-s0``) in
    ``scale`` of ``grid_file``, reading its data from ``data_dir``."""
    (found,) = select_cells(plan_cells(load_grid(grid_file, scale), Path("/nonexistent")),
                            [cell])
    return replace(found.cfg, data=replace(found.cfg.data, data_dir=data_dir))
