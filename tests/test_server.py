"""Server-side checks of client replies and aggregation with dropouts (framework-free)."""

import math

import pytest
import torch

from dcco.core.client import ClientUpdate
from dcco.core.server import (
    ReplyError,
    aggregate_updates,
    check_count,
    validate_statistics,
    validate_update,
)
from dcco.core.stats import encoding_stats

D = 3


def _stats_reply():
    gen = torch.Generator().manual_seed(0)
    s = encoding_stats(torch.randn(4, D, generator=gen), torch.randn(4, D, generator=gen))
    reply = {k: v for k, v in s.as_dict().items() if k != "count"}
    return reply | {"count": 4}


BAD_STATS = {
    "shape": lambda r: r | {"sum_fg": torch.zeros(D, D + 1, dtype=torch.float64)},
    "dtype": lambda r: r | {"sum_f": torch.zeros(D, dtype=torch.int64)},
    "nonfinite": lambda r: r | {"sum_g": torch.tensor([0.0, math.nan, 1.0])},
    "count": lambda r: r | {"count": 0},
    "missing_key": lambda r: {k: v for k, v in r.items() if k != "sum_ff"},
    "magnitude": lambda r: r | {"sum_gg": torch.full((D,), 1e30)},
}


@pytest.mark.parametrize("kind", sorted(BAD_STATS))
def test_validate_statistics__rejects_each_kind_of_bad_reply(kind):
    with pytest.raises(ReplyError) as err:
        validate_statistics(BAD_STATS[kind](_stats_reply()), D, D)
    assert err.value.kind == kind


def test_validate_statistics__accepts_a_good_reply_as_float64():
    stats = validate_statistics(_stats_reply(), D, D)
    assert stats.count.item() == 4.0 and stats.sum_fg.dtype == torch.float64


@pytest.mark.parametrize("count", [0, -3, 2.5, math.inf, math.nan, "4", True, None])
def test_check_count__rejects_non_positive_or_non_integer(count):
    with pytest.raises(ReplyError) as err:
        check_count(count)
    assert err.value.kind == "count"


def test_check_count__accepts_integral_values():
    assert check_count(3) == 3 and check_count(3.0) == 3 and check_count(torch.tensor(5)) == 5


SHAPES = {"w": (2, 2), "b": (2,)}


@pytest.mark.parametrize(
    ("reply", "count", "kind"),
    [
        ({"w": torch.zeros(2, 2)}, 1, "missing_key"),
        ({"w": torch.zeros(2, 3), "b": torch.zeros(2)}, 1, "shape"),
        ({"w": torch.zeros(2, 2), "b": torch.tensor([1.0, math.inf])}, 1, "nonfinite"),
        ({"w": torch.zeros(2, 2), "b": torch.zeros(2)}, -1, "count"),
        ({"w": torch.full((2, 2), 1e15), "b": torch.zeros(2)}, 1, "magnitude"),
    ],
)
def test_validate_update__rejects_each_kind_of_bad_reply(reply, count, kind):
    with pytest.raises(ReplyError) as err:
        validate_update(reply, count, SHAPES)
    assert err.value.kind == kind


def test_aggregate_updates__weights_survivors_by_their_counts():
    params = {"w": torch.zeros(2)}
    a = ClientUpdate({"w": torch.tensor([1.0, 0.0])}, num_samples=1, loss=0.0)
    b = ClientUpdate({"w": torch.tensor([0.0, 4.0])}, num_samples=3, loss=0.0)
    pseudo = aggregate_updates([a, b], params)
    torch.testing.assert_close(pseudo["w"], -torch.tensor([0.25, 3.0]))
    # a dropout: only b survives phase 2; its update alone is the average
    torch.testing.assert_close(aggregate_updates([b], params)["w"], -torch.tensor([0.0, 4.0]))

