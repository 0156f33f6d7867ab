"""One error family at the public entries (issue 100, item 3, begun): a refusal is a
``dcco.UserError`` that names the argument at fault, and still the builtin error it was
before (a ``ValueError``, a ``KeyError``, a ``TypeError``), so that old ``except`` clauses
keep working."""

from __future__ import annotations

import pytest
import torch

import dcco
from dcco.errors import ArgumentError, MissingNameError, UserError
from dcco.flower import DCCOStrategy


def _encoder() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8))


def _dual() -> torch.nn.Module:
    return dcco.dual_encoder(_encoder(), projector=(8,), sample=torch.zeros(1, 1, 4, 4))


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
]


@pytest.mark.parametrize("call,builtin,message", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_public_entry__refuses_bad_input_as_a_user_error_naming_the_argument(call, builtin,
                                                                            message):
    with pytest.raises(UserError, match=message) as caught:
        call()
    assert isinstance(caught.value, builtin)


def test_missing_name_error__reads_as_written_and_is_a_key_error():
    e = MissingNameError("apply_update: pseudo_gradient lacks w")
    assert str(e) == "apply_update: pseudo_gradient lacks w"  # not KeyError's repr
    assert isinstance(e, KeyError) and isinstance(e, UserError)
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, ValueError)
