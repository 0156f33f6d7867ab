"""quickstart-dcco: A Flower / PyTorch app, trained with DCCO."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from dcco.flower import DCCO
from quickstart_dcco.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_train: float = context.run_config["fraction-train"]
    fraction_evaluate: float = context.run_config["fraction-evaluate"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    # Load global model
    seed = int(context.run_config.get("seed", 0))
    torch.manual_seed(seed)
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize the strategy: DCCO where the quickstart starts FedAvg
    if context.run_config["strategy"] == "dcco":
        strategy = DCCO(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                        seed=seed)
        train_config = None  # DCCO's nodes step at its local rate, its server at its own
    else:
        strategy = FedAvg(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate)
        train_config = ConfigRecord({"lr": lr})

    # Start strategy, run for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=train_config,
        num_rounds=num_rounds,
    )

    # Save final model to disk
    print("\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    out = Path(str(context.run_config["out"]) or ".")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(state_dict, out / "final_model.pt")
    metrics = {"train": {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
               "evaluate": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}}
    (out / "rounds.json").write_text(json.dumps(metrics, indent=1))
