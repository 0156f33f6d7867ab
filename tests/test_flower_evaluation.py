"""``dcco.flower.evaluate_encoder``, what a user's ``@app.evaluate`` returns for an encoder, and
the strategy's log (``dcco.flower.roundlog``): each metric against a direct computation on
the same seeded views, the k-NN accuracy on samples whose labels it must find, labels read in
the loader's own pass, and the log's lines from a real run."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dcco
from dcco.config import USER
from dcco.core.collapse import encoding_figures
from dcco.core.losses import cco_loss
from dcco.core.seeding import derive_seed
from dcco.core.stats import encoding_stats
from dcco.flower import DCCOStrategy, answer, evaluate_encoder
from dcco.flower.evaluation import samples_and_labels
from dcco.flower.testing.inprocess import InProcessGrid

DIM, CLASSES, PER_CLASS = 6, 3, 12


def _noise(x: torch.Tensor) -> torch.Tensor:
    return x + 0.05 * torch.randn(x.shape, dtype=x.dtype)


def _clusters(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``CLASSES`` well-separated clusters of ``PER_CLASS`` points each, and their labels."""
    gen = torch.Generator().manual_seed(seed)
    centres = 5 * torch.eye(CLASSES, DIM, dtype=torch.float64)
    y = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    return centres[y] + 0.3 * torch.randn(len(y), DIM, generator=gen, dtype=torch.float64), y


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 8), nn.Tanh(), nn.Linear(8, 4)).double()


def _app(test, train=None, model=_model, **kw) -> ClientApp:
    app = ClientApp()

    @app.train()
    def fit(msg: Message, context: Context) -> Message:
        return answer(msg, context, model(), _clusters(context.node_id)[0], augment=_noise)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return evaluate_encoder(msg, context, model(), test(context.node_id),
                                None if train is None else train(context.node_id),
                                augment=_noise, **kw)

    return app


def _run(app: ClientApp, nodes: int = 2, rounds: int = 1, model=_model, **kw):
    strategy = DCCOStrategy(fraction_evaluate=1.0, min_available_nodes=nodes, min_train_nodes=nodes,
                            **kw)
    grid = InProcessGrid(app, [{}] * nodes, {})
    return strategy.start(grid=grid, initial_arrays=ArrayRecord(model().state_dict()),
                          num_rounds=rounds)


def _node_encodings(result, model: nn.Module, encoder) -> tuple[torch.Tensor, torch.Tensor]:
    """Node 1's two evaluation views (``views_key=7``) encoded here by the run's model."""
    model.load_state_dict(result.arrays.to_torch_state_dict())
    x = _clusters(1)[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(0, "evaluate-views", 7) % (1 << 62))
        x1, x2 = _noise(x), _noise(x)
    with torch.no_grad():
        return encoder(model)(x1), encoder(model)(x2)


def _byol_model() -> nn.Module:
    return dcco.dual_encoder(_model(), None, sample=torch.zeros(DIM),
                             method="byol_fedavg").double()


def test_evaluate_encoder__a_dual_encoder_with_a_head_is_evaluated_on_its_projections():
    def labelled(seed: int) -> DataLoader:
        return DataLoader(TensorDataset(*_clusters(seed)), batch_size=5)

    result = _run(_app(labelled, lambda node: labelled(50 + node),
                       model=_byol_model, views_key=7), nodes=1, model=_byol_model,
                  method="byol_fedavg")
    got = result.evaluate_metrics_clientapp[1]
    f, g = _node_encodings(result, _byol_model(), lambda m: m.encode)  # no predictions
    assert f.shape[1] == 4 and got["cco-loss"] == pytest.approx(
        float(cco_loss(encoding_stats(f, g).moments(), USER.lambd)), rel=1e-12)
    assert got["knn-acc"] == 1.0


def test_evaluate_encoder__metrics_equal_a_direct_computation_on_the_same_views():
    """One node: ``cco-loss`` at the strategy's λ (20 here, sent in the evaluate message),
    ``eff-rank`` and ``dead-dims`` of the encodings of two views seeded by the node alone,
    each equal to the same computation done here with the round's model."""
    result = _run(_app(lambda node: _clusters(node)[0], views_key=7), nodes=1, lambd=20.0)
    got = result.evaluate_metrics_clientapp[1]
    f, g = _node_encodings(result, _model(), lambda m: m)
    assert got["cco-loss"] == pytest.approx(float(cco_loss(encoding_stats(f, g).moments(),
                                                           20.0)), rel=1e-12)
    figures = encoding_figures(f, g)
    assert got["eff-rank"] == pytest.approx(float(figures["eff_rank"]), rel=1e-12)
    assert got["dead-dims"] == float(figures["dead_dims"])
    assert "knn-acc" not in got  # no labels given


def test_evaluate_encoder__knn_accuracy_finds_separable_labels_and_not_shuffled_ones():
    """With labelled loaders, ``knn-acc``: 1.0 on clusters whose labels are the clusters
    (held-out points of the same clusters), near chance when the labels are shuffled."""
    def loader(seed: int, shuffle_labels: bool = False) -> DataLoader:
        x, y = _clusters(seed)
        if shuffle_labels:
            y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))]
        return DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True)

    right = _run(_app(lambda n: loader(50 + n), lambda n: loader(n))).evaluate_metrics_clientapp
    assert right[1]["knn-acc"] == 1.0
    wrong = _run(_app(lambda n: loader(50 + n, True), lambda n: loader(n, True)))
    assert wrong.evaluate_metrics_clientapp[1]["knn-acc"] < 0.7


def test_samples_and_labels__one_pass_of_a_shuffling_loader_keeps_each_label_with_its_input():
    x = torch.arange(40, dtype=torch.float64).reshape(20, 2)
    y = torch.arange(20)
    batches = DataLoader([{"img": x[i], "label": y[i]} for i in range(20)], batch_size=3,
                         shuffle=True)
    got_x, got_y = samples_and_labels(batches)
    assert torch.equal(got_x[:, 0], 2 * got_y.double())  # each label with its own input
    assert sorted(got_y.tolist()) == list(range(20))
    assert samples_and_labels(x)[1] is None
    assert samples_and_labels(TensorDataset(x))[1] is None  # items without labels


def test_evaluate_encoder__refuses_a_node_of_one_sample_and_a_message_without_arrays():
    one = _run(_app(lambda n: _clusters(n)[0][:1]), nodes=1)
    assert 1 not in one.evaluate_metrics_clientapp  # the node's error, logged and left out
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    InProcessGrid(ClientApp(), [{}], {})  # sets Flower's task identity for a new Message
    bare = Message(RecordDict(), dst_node_id=1, message_type="evaluate")
    with pytest.raises(ValueError, match="without the model's arrays"):
        evaluate_encoder(bare, context, _model(), _clusters(1)[0])


def test_strategy_log__a_line_a_round_its_evaluation_and_the_run(caplog):
    with caplog.at_level("INFO", logger="flwr"):
        _run(_app(lambda n: _clusters(50 + n)[0]), rounds=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DCCO")]
    assert any(x.startswith("DCCO round 2/2: loss ") and "replies stats 2/2, update 2/2" in x
               and "S_A effective rank" in x for x in lines), lines
    assert any(x.startswith("DCCO round 0/2 (the initial model), federated evaluation on 2 "
                            "nodes (") and "cco-loss " in x for x in lines), lines
    assert any(x.startswith("DCCO round 2/2, federated evaluation on 2 nodes (")
               and "cco-loss " in x for x in lines), lines
    by_round = lines.index("DCCO federated evaluation by round:")
    assert [x.split(":")[0] for x in lines[by_round + 1:by_round + 4]] == [
        f"DCCO   round {r}" for r in range(3)]
    summary = [x for x in lines if x.startswith("DCCO: 2 of 2 rounds trained in ")]
    assert len(summary) == 1 and "(round 1) → " in summary[0], lines
    assert "federated evaluation at round 2: cco-loss" in summary[0]


def test_evaluate_encoder__refuses_bad_samples_by_node_and_split_with_a_data_error():
    """NaN, channels-last images, images the model cannot read and training samples of
    another shape are each refused before any metric, with a ``DataError`` (a ``UserError``)
    that names the node, the split and what to change; good images are scored."""
    from flwr.app import ConfigRecord

    from dcco.data.datasets import DataError

    def cnn() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                             nn.Linear(16, 8))

    InProcessGrid(ClientApp(), [{}], {})  # sets Flower's task identity for a new Message
    msg = Message(RecordDict({"arrays": ArrayRecord(cnn().state_dict()),
                              "config": ConfigRecord({})}), dst_node_id=1,
                  message_type="evaluate")
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    images = torch.rand(6, 3, 16, 16)
    labels = torch.arange(6) % 2
    good = evaluate_encoder(msg, context, cnn(), TensorDataset(images, labels),
                            TensorDataset(images, labels))
    assert {"cco-loss", "knn-acc"} <= set(good.content["metrics"])
    nan = images.clone()
    nan[2, 0, 5, 5] = float("nan")
    bad = {
        "node 1's test samples.*sample 2": (nan, None),
        "channels-last, \\(6, 16, 16, 3\\).*permute\\(0, 3, 1, 2\\)":
            (images.permute(0, 2, 3, 1), None),
        "the model cannot read node 1's test samples, \\(6, 1, 16, 16\\)":
            (images[:, :1], None),
        "node 1's training samples.*sample 2": (images, nan),
        "training samples are \\(3, 8, 8\\) each and its test samples \\(3, 16, 16\\)":
            (images, images[:, :, :8, :8]),
    }
    for pattern, (test, train) in bad.items():
        with pytest.raises(DataError, match=pattern) as refused:
            evaluate_encoder(msg, context, cnn(), TensorDataset(test, labels),
                             None if train is None else TensorDataset(train, labels))
        assert isinstance(refused.value, dcco.UserError)
