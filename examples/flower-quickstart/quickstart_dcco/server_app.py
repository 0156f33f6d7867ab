"""The ServerApp: ``dcco.flower.DCCO`` where a FedAvg app starts ``FedAvg`` (``strategy`` in
the run config picks), the final model and the rounds' metrics written to ``out``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from dcco.flower import DCCO
from quickstart_dcco.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    seed = int(cfg.get("seed", 0))
    torch.manual_seed(seed)
    initial = ArrayRecord(Net().state_dict())
    fractions = {"fraction_train": float(cfg["fraction-train"]),
                 "fraction_evaluate": float(cfg["fraction-evaluate"])}
    if cfg["strategy"] == "dcco":  # its nodes step at its local rate, its server at its own
        strategy, train_config = DCCO(**fractions, seed=seed), None
    else:
        strategy, train_config = FedAvg(**fractions), ConfigRecord({"lr": float(cfg["lr"])})
    result = strategy.start(grid=grid, initial_arrays=initial, train_config=train_config,
                            num_rounds=int(cfg["num-server-rounds"]))
    out = Path(str(cfg["out"]) or ".")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
    metrics = {"train": {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
               "evaluate": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}}
    (out / "rounds.json").write_text(json.dumps(metrics, indent=1))
