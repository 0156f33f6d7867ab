"""The ServerApp: Flower's FedAvg swapped for dcco's DCCO strategy."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from dcco.flower import DCCOStrategy, SecAgg
from dcco_flower_example.task import SmallCNN, augment, server_photos

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    torch.manual_seed(0)
    model = SmallCNN()
    secagg = (SecAgg(model=SmallCNN(), samples=server_photos(), augment=augment,
                     max_samples=int(cfg["secagg-max-photos"])) if cfg["secagg"] else None)
    # fraction_evaluate=0: the ClientApp has no @app.evaluate
    strategy = DCCOStrategy.from_run_config(  # dcco.lr, dcco.warmup-rounds, ... over these
        cfg, fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0,
        min_train_nodes=2, min_available_nodes=2, seed=int(cfg["seed"]), secagg=secagg)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=int(cfg["num-server-rounds"]))
    if cfg["compare-fedavg"]:
        compare_with_fedavg(grid, cfg)
    if cfg["out"]:
        out = Path(str(cfg["out"]))
        out.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), out / "model.pt")
        rounds = {r: dict(m) for r, m in result.train_metrics_clientapp.items()}
        (out / "rounds.json").write_text(json.dumps(rounds, indent=1))


def compare_with_fedavg(grid: Grid, cfg) -> None:
    """Seconds per round of Flower's FedAvg and of DCCO on this app, in alternating blocks of
    ``num-server-rounds`` rounds (``benchmarks/flower_strategy.py`` reads ``timings.json``)."""
    rounds, seconds = int(cfg["num-server-rounds"]), {"fedavg": [], "dcco": []}
    for _ in range(int(cfg["blocks"])):
        for name in ("fedavg", "dcco"):
            stamps: list[float] = []
            torch.manual_seed(0)
            initial = ArrayRecord(SmallCNN().state_dict())
            if name == "fedavg":
                strategy = FedAvg(fraction_train=float(cfg["fraction-train"]),
                                  fraction_evaluate=0.0, min_train_nodes=2,
                                  min_evaluate_nodes=0, min_available_nodes=2)
            else:
                strategy = DCCOStrategy(fraction_train=float(cfg["fraction-train"]),
                                        fraction_evaluate=0.0, min_train_nodes=2,
                                        min_available_nodes=2, lr=float(cfg["dcco.lr"]))
            strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                           evaluate_fn=lambda r, arrays, s=stamps: s.append(time.perf_counter()))
            seconds[name] += [b - a for a, b in itertools.pairwise(stamps)]
    out = Path(str(cfg["out"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "timings.json").write_text(json.dumps(seconds, indent=1))
