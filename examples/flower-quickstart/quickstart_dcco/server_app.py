"""The ServerApp: ``dcco.flower.DCCOStrategy`` where a FedAvg app starts ``FedAvg`` (``strategy`` in
the run config picks: ``dcco``, ``fedavg`` or ``contrastive``, FedAvg over contrastive nodes),
the final model and the rounds' metrics and wall seconds written to ``out``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from dcco.flower import DCCOStrategy
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
    if cfg["strategy"] == "dcco":  # its nodes step at its local rate, its server at dcco.lr
        strategy, train_config = DCCOStrategy.from_run_config(cfg, **fractions, seed=seed), None
    else:
        strategy, train_config = FedAvg(**fractions), ConfigRecord({"lr": float(cfg["lr"])})
    stamps = {0: time.perf_counter()}  # the server's evaluation after each round ends it

    def stamp(server_round: int, arrays: ArrayRecord) -> None:
        stamps[server_round] = time.perf_counter()

    result = strategy.start(grid=grid, initial_arrays=initial, train_config=train_config,
                            num_rounds=int(cfg["num-server-rounds"]), evaluate_fn=stamp)
    out = Path(str(cfg["out"]) or ".")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
    metrics = {"train": {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
               "evaluate": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()},
               "seconds": {r: stamps[r] - stamps[r - 1] for r in sorted(stamps)[1:]}}
    (out / "rounds.json").write_text(json.dumps(metrics, indent=1))
