"""One error family at the public entries (issue 100, item 3): a refusal is a
``dcco.UserError`` that names the call and the argument at fault, and still the builtin error
it was before (a ``ValueError``, a ``KeyError``, a ``TypeError``, a ``RuntimeError``), so that
old ``except`` clauses keep working. A ``ConfigError`` or ``DataError`` stays one. The
CLI's refusals (exit status 2, one line naming the key) are tested in test_cli."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

import dcco
from dcco.cli import main
from dcco.errors import ArgumentError, MissingNameError, ModelInputError, UserError
from dcco.flower import DCCOStrategy, answer, codec, evaluate_encoder
from dcco.flower.testing.inprocess import InProcessGrid


def _encoder() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8))


def _dual() -> torch.nn.Module:
    return dcco.dual_encoder(_encoder(), projector=(8,), sample=torch.zeros(1, 1, 4, 4))


def _images(n: int = 8, channels_last: bool = False) -> torch.Tensor:
    x = torch.randint(0, 255, (n, 1, 8, 8), dtype=torch.uint8)
    return x.permute(0, 2, 3, 1) if channels_last else x


def _message(kind: str, model: torch.nn.Module | None = None) -> tuple[Message, Context]:
    """A ``kind`` message (round 1's stats message for ``model``, or bare) and a node's
    context."""
    InProcessGrid(ClientApp(), [{}], {})  # stamps the run identity a new Message needs
    content = RecordDict() if model is None else RecordDict({
        "config": DCCOStrategy().node_config("stats", 1, {}),
        "arrays": codec.array_record(model.state_dict())})
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    return Message(content, dst_node_id=1, message_type=kind), context


def _answer(samples: object, augment: object = None, sent: torch.nn.Module | None = None):
    """``answer`` to round 1's stats message for ``sent`` (default: the node's own model)."""
    def call() -> None:
        model = _encoder()
        answer(*_message("train", sent or model), model, samples, augment=augment)
    return call


def _nan_samples() -> torch.Tensor:
    x = torch.rand(4, 16)
    x[2, 3] = float("nan")
    return x


CASES = [
    ("DCCOStrategy(lr=-1)", lambda: DCCOStrategy(lr=-1), ValueError,
     "DCCOStrategy: lr must be > 0, got -1"),
    ("DCCOStrategy(optimizer='x')", lambda: DCCOStrategy(optimizer="x"), ValueError,
     "DCCOStrategy: optimizer must be 'adam', 'lars' or 'sgd', got 'x'"),
    ("DCCOStrategy(aggregation='krum')", lambda: DCCOStrategy(aggregation="krum"),
     ValueError, "DCCOStrategy: aggregation must be one of fedavg, ldawa, got 'krum'"),
    ("DCCOStrategy(method='nope')", lambda: DCCOStrategy(method="nope"), ValueError,
     "DCCOStrategy: unknown method 'nope'"),
    ("server_optimizer(optimizer='x')",
     lambda: dcco.server_optimizer(torch.nn.Linear(2, 2), optimizer="x"), ValueError,
     "server_optimizer: optimizer must be 'adam', 'lars' or 'sgd', got 'x'"),
    ("server_optimizer(lr=0)", lambda: dcco.server_optimizer(torch.nn.Linear(2, 2), lr=0.0),
     ValueError, "server_optimizer: lr must be > 0"),
    ("server_optimizer(nesterov=...)",
     lambda: dcco.server_optimizer(torch.nn.Linear(2, 2), nesterov=True), TypeError,
     "server_optimizer: .*nesterov"),
    ("apply_update without a parameter",
     lambda: dcco.apply_update(torch.nn.Linear(2, 2), torch.optim.SGD(
         torch.nn.Linear(2, 2).parameters(), lr=1.0), {}), KeyError,
     "apply_update: pseudo_gradient lacks the model's parameter weight \\(and 1 more\\)"),
    ("statistics of views unlike each other",
     lambda: dcco.statistics(_dual(), torch.rand(4, 1, 4, 4), torch.rand(4, 1, 5, 5)),
     ValueError, "statistics: x2's samples are \\(1, 5, 5\\) but x1's are \\(1, 4, 4\\)"),
    ("statistics of views of other counts",
     lambda: dcco.statistics(_dual(), torch.rand(4, 1, 4, 4), torch.rand(3, 1, 4, 4)),
     ValueError, "statistics: x1 holds 4 samples and x2 3"),
    ("local_update of views unlike each other",
     lambda: dcco.local_update(_dual(), torch.rand(4, 1, 4, 4), torch.rand(4, 1, 5, 5), None,
                               "cco_fedavg"), ValueError, "local_update: x2's samples"),
    ("linear_probe with a label short",
     lambda: dcco.linear_probe(_encoder(), (torch.rand(10, 1, 4, 4), torch.arange(9) % 3),
                               (torch.rand(5, 1, 4, 4), torch.arange(5) % 3)), ValueError,
     "linear_probe: train's labels must be one int a sample, \\(10,\\), got shape \\(9,\\)"),
    ("linear_probe with a negative class",
     lambda: dcco.linear_probe(_encoder(), (torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 0, 1])),
                               (torch.rand(2, 1, 4, 4), torch.tensor([-1, 0]))), ValueError,
     "linear_probe: test's labels must be classes 0, 1, ..., got -1"),
    ("statistics of views the model cannot read",
     lambda: dcco.statistics(_dual(), torch.rand(4, 1, 5, 5), torch.rand(4, 1, 5, 5)),
     RuntimeError, "statistics: the model failed on the views x1 \\(4, 1, 5, 5\\)"),
    ("dual_encoder(projector=(0,))",
     lambda: dcco.dual_encoder(_encoder(), projector=(0,), sample=torch.zeros(1, 1, 4, 4)),
     TypeError, "dual_encoder: projector widths must be positive"),
    ("dual_encoder(method='x')",
     lambda: dcco.dual_encoder(_encoder(), method="x", sample=torch.zeros(1, 1, 4, 4)),
     TypeError, "method: unknown method 'x'"),
    ("method(eps=0)", lambda: dcco.method("dcco", eps=0.0), dcco.ConfigError,
     "method: eps must be > 0"),
    ("method('x')", lambda: dcco.method("x"), dcco.ConfigError, "method: unknown method 'x'"),
    ("fit(rounds=0)", lambda: dcco.fit(_encoder(), {0: _images()}, rounds=0, progress=False),
     dcco.ConfigError, "fit: rounds must be >= 1, got 0"),
    ("fit(clients_per_round=0)",
     lambda: dcco.fit(_encoder(), {0: _images()}, rounds=1, clients_per_round=0,
                      progress=False), dcco.ConfigError, "fit: clients_per_round must be >= 1"),
    ("fit(settings=optim.lr=-1)",
     lambda: dcco.fit(_encoder(), {0: _images()}, rounds=1, settings=["optim.lr=-1"],
                      progress=False), dcco.ConfigError, "fit: optim.lr must be > 0"),
    ("load_encoder(a missing path)", lambda: dcco.load_encoder("no/such/run"), ValueError,
     "no/such/run is neither a dcco run directory nor an encoder"),
    ("answer(a message not the strategy's)",
     lambda: answer(*_message("train"), _encoder(), torch.rand(4, 16)),
     TypeError, "answer: msg: not a message of dcco.flower.DCCOStrategy"),
    ("answer(samples of no kind)", _answer(object()), TypeError,
     "answer: samples must be a tensor, a torch DataLoader or a Dataset, got object"),
    ("answer(an empty data set)", _answer([]), ValueError,
     "answer: samples: this node's data set is empty"),
    ("answer(augment=None, not images)", _answer(torch.rand(4, 16)), ValueError,
     "answer: augment=None with samples of shape \\(4, 16\\)"),
    ("answer(channels-last images)", _answer(_images(channels_last=True)), ValueError,
     "answer: augment=None with channels-last images"),
    ("answer(a model other than the server's)",
     _answer(torch.rand(4, 16), augment=lambda v: v, sent=torch.nn.Linear(16, 8)), ValueError,
     "answer: model: the server's model lacks its 1.weight"),
    ("evaluate_encoder(a message without arrays)",
     lambda: evaluate_encoder(*_message("evaluate"), _encoder(),
                              torch.rand(4, 16)), TypeError,
     "evaluate_encoder: msg: an evaluate message without the model's arrays"),
]


@pytest.mark.parametrize("call,builtin,message", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_public_entry__refuses_bad_input_as_a_user_error_naming_the_argument(call, builtin,
                                                                            message):
    with pytest.raises(UserError, match=message) as caught:
        call()
    assert isinstance(caught.value, builtin)


def test_answer__keeps_a_data_error_a_data_error_naming_the_sample():
    with pytest.raises(dcco.DataError, match="answer: node 1's samples holds NaN in sample 2"):
        _answer(_nan_samples(), augment=lambda v: v)()


def test_statistics__a_model_failing_on_the_views_keeps_its_own_error_chained():
    with pytest.raises(ModelInputError) as caught:
        dcco.statistics(_dual(), torch.rand(4, 1, 5, 5), torch.rand(4, 1, 5, 5))
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "mat1 and mat2 shapes cannot be multiplied" in str(caught.value.__cause__)


def test_cli__a_refusal_is_one_line_and_exit_status_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope" in err and "is not a dcco run directory" in err and "\n" not in err


def test_missing_name_error__reads_as_written_and_is_a_key_error():
    e = MissingNameError("apply_update: pseudo_gradient lacks w")
    assert str(e) == "apply_update: pseudo_gradient lacks w"  # not KeyError's repr
    assert isinstance(e, KeyError) and isinstance(e, UserError)
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, ValueError)
