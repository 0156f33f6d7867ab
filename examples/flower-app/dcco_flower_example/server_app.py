"""The ServerApp: Flower's FedAvg swapped for dcco's DCCO strategy."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from dcco.flower import DCCO
from dcco_flower_example.task import SmallCNN

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    torch.manual_seed(0)
    model = SmallCNN()
    strategy = DCCO(fraction_train=float(cfg["fraction-train"]), min_train_nodes=2,
                    min_available_nodes=2, optimizer="lars", lr=float(cfg["lr"]))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=int(cfg["num-server-rounds"]))
    if cfg["out"]:
        out = Path(str(cfg["out"]))
        out.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), out / "model.pt")
        rounds = {r: dict(m) for r, m in result.train_metrics_clientapp.items()}
        (out / "rounds.json").write_text(json.dumps(rounds, indent=1))
