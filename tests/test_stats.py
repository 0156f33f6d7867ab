"""Statistics algebra: merging is the same as concatenating; float64 guards cancellation."""

import torch

from dcco.core.stats import EncodingStats, anchored, encoding_stats, merge


def _pair(n: int, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64), torch.randn(
        n, d, generator=gen, dtype=torch.float64
    )


def _assert_stats_close(a: EncodingStats, b: EncodingStats) -> None:
    for x, y in zip(a.tensors(), b.tensors()):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_encoding_stats__merge_equals_concatenation_with_uneven_and_single_splits():
    f, g = _pair(17)
    whole = encoding_stats(f, g)
    for sizes in ([1, 16], [5, 1, 11], [1] * 17, [8, 9]):
        parts = [encoding_stats(a, b) for a, b in zip(f.split(sizes), g.split(sizes))]
        _assert_stats_close(merge(parts), whole)


def test_encoding_stats__weighted_average_of_client_means_is_pooled_mean():
    f, g = _pair(12)
    sizes = [1, 3, 8]
    parts = [encoding_stats(a, b) for a, b in zip(f.split(sizes), g.split(sizes))]
    pooled = encoding_stats(f, g).moments()
    weighted = [sum(n / 12 * getattr(p.moments(), k) for n, p in zip(sizes, parts))
                for k in ("mean_f", "mean_g", "mean_ff", "mean_gg", "mean_fg")]
    for w, ref in zip(weighted, pooled.tensors()):
        torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)


def test_encoding_stats__hand_computed_values():
    f = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    g = torch.tensor([[0.5, 0.0], [1.0, 2.0]])
    s = encoding_stats(f, g)
    assert s.count.item() == 2.0
    assert s.sum_f.tolist() == [4.0, 1.0]
    assert s.sum_ff.tolist() == [10.0, 5.0]
    assert s.sum_gg.tolist() == [1.25, 4.0]
    assert s.sum_fg.tolist() == [[3.5, 6.0], [0.0, -2.0]]
    assert s.sum_f.dtype == torch.float64


def test_encoding_stats__float64_accumulation_survives_large_mean():
    """|mean| ≫ std: the variance ⟨F²⟩ − ⟨F⟩² must not cancel to garbage."""
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(4096, 3, generator=gen)
    f32 = (1000.0 + 0.01 * noise).float()  # std 1e-2 around 1e3: float32 sums lose it all
    m = encoding_stats(f32, f32).moments()
    var = m.mean_ff - m.mean_f**2
    ref = f32.double().var(0, unbiased=False)
    torch.testing.assert_close(var, ref, rtol=1e-4, atol=0)
    naive = (f32 * f32).mean(0) - f32.mean(0) ** 2  # the float32 version, for contrast
    assert ((naive - ref.float()).abs() / ref.float()).max() > 0.5  # ≥ 50% wrong


def test_anchored__value_is_aggregate_and_gradient_is_local():
    f, g = _pair(4)
    f.requires_grad_(True)
    local = encoding_stats(f[:2], g[:2]).moments()
    aggregate = encoding_stats(f.detach(), g).moments()
    combined = anchored(local, aggregate)
    for c, a in zip(combined.tensors(), aggregate.tensors()):
        torch.testing.assert_close(c, a)
    combined.mean_f.sum().backward()
    assert torch.all(f.grad[2:] == 0) and torch.allclose(f.grad[:2], torch.full((2, 5), 0.5,
                                                                               dtype=f.dtype))


def test_encoding_stats__dict_round_trip():
    s = encoding_stats(*_pair(3))
    _assert_stats_close(EncodingStats.from_dict(s.as_dict()), s)
