"""A grid file of one tiny setting (``dcco reproduce``'s format) for the tests that run one."""

from __future__ import annotations

import json
from pathlib import Path

GRID = """
[grid]
methods = {methods}
evaluations = ["linear@20"]
seeds = [0]

[[setting]]
name = "IID 2"
alpha = 1000.0
samples_per_client = 2
clients_per_round = 4

[base.data]
dataset = "fashion_mnist"
data_dir = "{data_dir}"

[base.model]
widths = [4, 8, 8]
projector = [16, 16, 16]

[base.train]
rounds = {rounds}
knn_every = 0
log_every = 2
checkpoint_every = 1000

[base.eval]
probe_steps = 10
scratch_epochs = 1
scratch_batch = 16

[scale.tiny]
set = []
"""


def tiny_grid(folder: Path, data_dir: Path, rounds: int, methods: list[str]) -> Path:
    """``folder/grid.toml``: ``methods`` at IID 2 (4 clients a round), seed 0, ``rounds``
    rounds of the tiny network on the data in ``data_dir``, its scale ``tiny``."""
    path = folder / "grid.toml"
    path.write_text(GRID.format(data_dir=data_dir, rounds=rounds, methods=json.dumps(methods)))
    return path
