"""The strategy's settings from Flower's run config (``DCCOStrategy.from_run_config``) and its
metrics file (``metrics_file=``): the keys an app declares, changed as ``flwr run
--run-config`` changes them, reach the server's step; a key or value the strategy cannot take
is refused by name; the file holds one line a round from round 0, across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from dcco.config import ConfigError
from dcco.flower import DCCOStrategy
from dcco.flower.testing.inprocess import InProcessGrid, vector_app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [ROOT / "examples" / "flower-quickstart", ROOT / "examples" / "flower-app"]


def _initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(torch.nn.Linear(6, 8).double().state_dict())


def _one_round(strategy: DCCOStrategy) -> dict[str, torch.Tensor]:
    """The change one round makes to the initial weights, on two in-process nodes."""
    initial = _initial()
    result = strategy.start(InProcessGrid(vector_app(), [{}, {}], {}), initial, num_rounds=1)
    after, before = result.arrays.to_torch_state_dict(), initial.to_torch_state_dict()
    return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("project", EXAMPLES, ids=lambda p: p.name)
def test_from_run_config__flwr_run_run_config_changes_the_rate_of_the_servers_step(project):
    """Each example's ``pyproject.toml`` declares ``dcco.lr`` and ``dcco.warmup-rounds``;
    Flower's own reading of the app's config with ``--run-config`` overrides (the functions
    ``flwr run`` calls) gives a strategy at the new rate; an undeclared key is refused by
    Flower itself. With SGD at a constant rate, halving ``dcco.lr`` halves the round's
    step (its pseudo-gradient is the nodes' average update, the same at both rates)."""
    defaults = get_fused_config_from_dir(project, {})
    assert {"dcco.lr", "dcco.warmup-rounds", "dcco.metrics-file"} <= set(defaults)
    assert DCCOStrategy.from_run_config(defaults).optim.lr == defaults["dcco.lr"] == 1e-3
    fused = get_fused_config_from_dir(project, parse_config_args(
        ["dcco.lr=0.25 dcco.warmup-rounds=0"]))
    strategy = DCCOStrategy.from_run_config(fused, optimizer="sgd", lr=1.0, warmup_rounds=3)
    assert (strategy.optim.lr, strategy.optim.warmup_rounds) == (0.25, 0)
    with pytest.raises(ValueError, match="dcco.learning-rate"):
        get_fused_config_from_dir(project, parse_config_args(["dcco.learning-rate=0.1"]))

    common = {"optimizer": "sgd", "weight_decay": 0.0, "schedule": "constant",
              "fraction_evaluate": 0.0, "dcco.warmup-rounds": 0}
    steps = {}
    for lr in (0.5, 0.25):
        config = common | {"dcco.lr": lr}
        kw = {k: v for k, v in config.items() if not k.startswith("dcco.")}
        steps[lr] = _one_round(DCCOStrategy.from_run_config(config, **kw))
    assert any(float(v.abs().max()) > 1e-6 for v in steps[0.5].values())
    for k, step in steps[0.5].items():
        torch.testing.assert_close(steps[0.25][k], 0.5 * step, rtol=1e-9, atol=1e-15)


def test_from_run_config__refuses_an_unknown_key_and_a_wrong_type_by_name():
    """A ``dcco.`` key that names no setting is refused with the closest one; a value of the
    wrong type with the key and what it takes; the app's own keys are left alone; an empty
    path is none; ``dcco.loss.<key>`` goes to the loss's settings (and a bad one is named
    by the loss's own check)."""
    with pytest.raises(ConfigError, match="'dcco.warmup' .*did you mean 'dcco.warmup-rounds'"):
        DCCOStrategy.from_run_config({"dcco.warmup": 3})
    with pytest.raises(ConfigError, match="'dcco.lr' = 'fast': expected a number"):
        DCCOStrategy.from_run_config({"dcco.lr": "fast"})
    with pytest.raises(ConfigError, match="'dcco.warmup-rounds' = 2.5: expected an integer"):
        DCCOStrategy.from_run_config({"dcco.warmup-rounds": 2.5})
    with pytest.raises(ConfigError, match="'dcco.seed' = True"):
        DCCOStrategy.from_run_config({"dcco.seed": True})
    strategy = DCCOStrategy.from_run_config(
        {"lr": 0.01, "dcco.lr": 2, "dcco.warmup-rounds": 4.0, "dcco.checkpoint": "",
         "dcco.method": "contrastive_fedavg", "dcco.loss.temperature": 0.3},
        loss={"temperature": 0.1})
    assert (strategy.optim.lr, strategy.optim.warmup_rounds) == (2.0, 4)
    assert strategy.checkpoint is None and strategy.method.name == "contrastive_fedavg"
    assert strategy.method.loss.temperature == 0.3
    with pytest.raises(ValueError, match="temprature"):
        DCCOStrategy.from_run_config({"dcco.loss.temprature": 0.3})


def test_metrics_file__a_line_a_round_from_round_0_and_none_twice_after_a_resume(tmp_path):
    """``metrics_file``: round 0 holds the initial model's server evaluation, each trained
    round its train metrics, the server's scheduled rate and its evaluation, equal to the
    ``Result``'s. A run stopped after round 2's line but resumed from a checkpoint of round
    2 with a stray line after it (a round written after the checkpoint) rewrites the file,
    so each round appears once."""
    path, checkpoint = tmp_path / "m" / "metrics.jsonl", tmp_path / "c.pt"
    seen: list[int] = []

    def evaluate(r: int, arrays: ArrayRecord) -> MetricRecord:
        seen.append(r)
        weight = arrays.to_torch_state_dict()["weight"]
        return MetricRecord({"norm": float(weight.norm()), "round": r})

    kw = {"fraction_evaluate": 0.0, "warmup_rounds": 1, "lr": 0.01,
          "metrics_file": path, "checkpoint": checkpoint}
    grid = InProcessGrid(vector_app(), [{}, {}], {})
    result = DCCOStrategy(**kw).start(grid, _initial(), num_rounds=2, evaluate_fn=evaluate)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["round"] for x in lines] == [0, 1, 2] and "train" not in lines[0]
    assert lines[0]["server-evaluation"]["round"] == 0
    model = DCCOStrategy(**kw).model
    model.begin(_initial(), 2)
    for x in lines[1:]:
        r = x["round"]
        assert x["train"] == dict(result.train_metrics_clientapp[r])
        assert x["server-evaluation"] == dict(result.evaluate_metrics_serverapp[r])
        assert x["server-lr"] == model.lr_of(r)
    assert lines[1]["server-lr"] == 0.01  # its warm-up round: 0.01 · 1/1
    with path.open("a") as f:
        f.write(json.dumps({"round": 3, "stray": True}) + "\n")
    seen.clear()
    DCCOStrategy(**kw).start(grid, _initial(), num_rounds=3, evaluate_fn=evaluate)
    assert seen == [3]  # the resumed run evaluates only its own round
    again = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["round"] for x in again] == [0, 1, 2, 3] and "stray" not in again[3]
    assert again[:3] == lines


def test_knn_evaluation__a_server_evaluate_fn_scores_round_0_and_each_round_by_label():
    """``dcco.flower.knn_evaluation`` as ``evaluate_fn``: the initial model (round 0) and each
    round's are scored; labels that are the clusters give 1.0, shuffled labels near chance;
    uint8 images are scored in the range of their views; a set without labels is refused."""
    from dcco.data.datasets import DataError
    from dcco.flower import knn_evaluation
    from dcco.flower.evaluation import _as_views

    gen = torch.Generator().manual_seed(3)
    y = torch.arange(60) % 3
    x = torch.randn(60, 6, generator=gen, dtype=torch.float64) + 5 * torch.nn.functional.one_hot(
        y, 6).double()
    evaluate = knn_evaluation(torch.nn.Linear(6, 8).double(), (x[:45], y[:45]), (x[45:], y[45:]))
    result = DCCOStrategy(fraction_evaluate=0.0).start(
        InProcessGrid(vector_app(), [{}, {}], {}), _initial(), num_rounds=2,
        evaluate_fn=evaluate)
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]
    assert all(m["knn-acc"] == 1.0 and m["num-examples"] == 15
               for m in result.evaluate_metrics_serverapp.values())
    shuffled = y[torch.randperm(60, generator=gen)]
    chance = knn_evaluation(torch.nn.Linear(6, 8).double(), (x[:45], shuffled[:45]),
                            (x[45:], shuffled[45:]))(0, _initial())
    assert chance["knn-acc"] < 0.7
    images = torch.tensor([[0, 255]], dtype=torch.uint8).expand(2, 2)
    assert _as_views(images, torch.float32).tolist() == [[-1.0, 1.0], [-1.0, 1.0]]
    with pytest.raises(DataError, match="needs labelled samples"):
        knn_evaluation(torch.nn.Linear(6, 8), x[:45].float(), x[45:].float())
