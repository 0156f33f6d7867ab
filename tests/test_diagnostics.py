"""The per-client gradient sums Σ_{n∈k} ∂L/∂z_n: equal to the gradient of a shift of the client's
encodings (an independent computation), zero over a round for the centred CCO loss and not for
the uncentred spectral loss, and 1 for a client of one sample."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dcco.core.stats import encoding_stats
from dcco.methods import Segments, build_method

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from diagnostics import encoding_gradient_sums

SIZES = [1, 4, 3, 6]


def _encodings(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    # clients sit apart (an offset each), as one-class clients do
    offsets = torch.cat([torch.full((s, 1), float(k)) for k, s in enumerate(SIZES)])
    f = torch.randn(n, 6, generator=gen, dtype=torch.float64) + offsets
    g = torch.randn(n, 6, generator=gen, dtype=torch.float64) - offsets
    return f, g


def test_gradient_sums__equal_the_gradient_of_shifting_the_clients_encodings():
    f, g = _encodings()
    segments = Segments.from_counts(SIZES)
    for name in ("dcco", "fedsc"):
        method = build_method(name)
        out = encoding_gradient_sums(method, f, g, segments)
        shifts = torch.zeros(len(SIZES), 12, dtype=torch.float64, requires_grad=True)
        client = torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))
        moved = shifts[client]
        loss = method.statistics_loss(encoding_stats(f + moved[:, :6], g + moved[:, 6:],
                                                     method.stats).moments())
        (expected,) = torch.autograd.grad(loss, shifts)
        torch.testing.assert_close(out.client_sums, expected, rtol=1e-10, atol=1e-14)
        assert out.coherence[0] == 1.0  # one sample: its gradient is its sum
        assert bool(((out.coherence >= 0) & (out.coherence <= 1 + 1e-12)).all())


def test_gradient_sums__vanish_over_the_round_for_the_centred_loss_only():
    f, g = _encodings(1)
    segments = Segments.from_counts(SIZES)
    cco = encoding_gradient_sums(build_method("dcco"), f, g, segments)
    spectral = encoding_gradient_sums(build_method("fedsc"), f, g, segments)
    assert cco.round_coherence <= 1e-12
    assert float(cco.client_sums.sum(0).norm()) <= 1e-12 * float(cco.client_sums.norm())
    assert spectral.round_coherence > 1e-2
