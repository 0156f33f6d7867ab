"""The FedAvg-style app switched to DCCO (examples/flower-quickstart): its `Net`, which has no
normalisation, trains under the strategy's defaults without collapsing, and the app's
`@app.evaluate` (``dcco.flower.evaluate_encoder``) runs after every round."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _experiment():
    """experiments/quickstart_loss.py: the app on dcco's in-process grid, and its scores."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import quickstart_loss
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return quickstart_loss


def test_quickstart_net__trains_under_dcco_defaults_and_evaluates_every_round(tmp_path,
                                                                             caplog):
    """Four nodes of the quickstart's IID partition (800 Fashion-MNIST images, 32 × 32 RGB),
    six rounds of `DCCOStrategy()` with its defaults, every node a round: the collapse figures of a
    live encoder (no dead dimension, C's effective rank above 2; the watch itself starts at
    round 20, after twice the warm-up), the app's evaluation each round (the encoder's CCO
    loss, collapse figures and k-NN accuracy on each node's held-out images; round 0's of
    the untrained encoder), and the final
    model's CCO loss on the nodes' seeded test views below the untrained model's. The margin
    is the committed records' worst ratio over seeds 0-2 and one or two threads
    (experiments/results/collapse/quickstart_loss-*.json, 0.72-0.83 here) plus 0.05 for
    another CPU, as experiments/quickstart_loss.py runs and scores it."""
    quickstart_loss = _experiment()
    worst, runs = quickstart_loss.worst_ratio(6)
    assert runs >= 6 and worst < 0.9, (worst, runs)  # the records themselves show learning
    with caplog.at_level("WARNING", logger="flwr.dcco"):
        run = quickstart_loss.run(6, 800, tmp_path)
    assert "collapse" not in caplog.text
    rounds = run["record"]
    # round 0: the untrained encoder's evaluation, the baseline of the others
    assert sorted(rounds["evaluate"], key=int) == [str(r) for r in range(7)]
    evaluation = rounds["evaluate"]["6"]
    assert {"cco-loss", "eff-rank", "dead-dims", "knn-acc"} <= set(evaluation)
    assert evaluation["knn-acc"] > 2 / 10  # 10 classes: an encoder's features, not chance
    last = rounds["train"]["6"]
    assert last["update-accepted"] == 4 and last["dead_dims"] == 0 and last["eff_rank"] > 2
    # the final model's CCO loss on the nodes' seeded test views, against the initial model's
    assert run["trained"] < (worst + 0.05) * run["untrained"], (run, worst)


def test_quickstart_contrastive__its_nt_xent_is_simclrs_and_a_round_trains_the_encoder():
    """The example's contrastive FedAvg (the like-for-like app of
    benchmarks/quickstart_speed.py): its own NT-Xent equals dcco's (SimCLR's loss, written
    independently in dcco.core.losses) on the same pairs, and one FedAvg round of its nodes
    (an epoch of NT-Xent on two ``ImageViews`` views of each batch) moves the model with a
    finite loss."""
    import math

    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    from dcco.core.losses import nt_xent
    from dcco.flower.testing.inprocess import InProcessGrid

    sys.path.insert(0, str(ROOT / "examples" / "flower-quickstart"))
    try:
        from quickstart_dcco import client_app, task
    finally:
        sys.path.remove(str(ROOT / "examples" / "flower-quickstart"))
    gen = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    assert abs(float(task.nt_xent(z1, z2, 0.1)) - float(nt_xent(z1, z2, 0.1))) < 1e-5
    config = {"strategy": "contrastive", "batch-size": 32, "images": 400, "local-epochs": 1,
              "lr": 0.01}
    grid = InProcessGrid(client_app.app, [{"partition-id": i, "num-partitions": 2}
                                          for i in range(2)], config)
    torch.manual_seed(0)
    start = task.Net().state_dict()
    result = FedAvg(fraction_train=1.0, fraction_evaluate=0.0).start(
        grid=grid, initial_arrays=ArrayRecord(start), num_rounds=1,
        train_config=ConfigRecord({"lr": 0.01}))
    trained = result.arrays.to_torch_state_dict()
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    assert math.isfinite(float(result.train_metrics_clientapp[1]["train_loss"]))
