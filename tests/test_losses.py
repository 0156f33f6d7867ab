"""The CCO loss from statistics against the Barlow Twins formula, and NT-Xent checks."""

import math

import torch
import torch.nn.functional as F

from dcco.core.losses import (
    cco_loss,
    cco_loss_per_segment,
    cross_correlation,
    nt_xent,
    nt_xent_per_anchor,
)
from dcco.core.stats import encoding_stats, merge


def barlow_twins_reference(z1, z2, lambd=20.0):
    """facebookresearch/barlowtwins main.py, with the paper's λ/(d−1) off-diagonal scaling."""
    n, d = z1.shape
    bn = torch.nn.BatchNorm1d(d, affine=False, dtype=z1.dtype)  # training mode: biased var
    c = bn(z1).T @ bn(z2)
    c.div_(n)
    on_diag = torch.diagonal(c).add_(-1).pow_(2).sum()
    off_diag = c.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten().pow_(2).sum()
    return on_diag + lambd / (d - 1) * off_diag


def _pair(n, d, seed=0, shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(n, d, generator=gen, dtype=torch.float64) + shift
    g = 0.5 * f + torch.randn(n, d, generator=gen, dtype=torch.float64)
    return f, g


def test_cco_loss__from_merged_stats_equals_barlow_twins_formula():
    f, g = _pair(23, 7, shift=3.0)
    sizes = [1, 4, 1, 9, 8]
    merged = merge([encoding_stats(a, b) for a, b in zip(f.split(sizes), g.split(sizes))])
    ours = cco_loss(merged.moments())
    torch.testing.assert_close(ours, barlow_twins_reference(f, g), rtol=1e-10, atol=0)


def test_cco_loss__gradient_matches_barlow_twins_formula():
    f, g = _pair(16, 6)
    f1, g1 = f.clone().requires_grad_(), g.clone().requires_grad_()
    f2, g2 = f.clone().requires_grad_(), g.clone().requires_grad_()
    cco_loss(encoding_stats(f1, g1).moments()).backward()
    barlow_twins_reference(f2, g2).backward()
    torch.testing.assert_close(f1.grad, f2.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g1.grad, g2.grad, rtol=1e-9, atol=1e-12)


def test_cco_loss__closed_form_cases():
    d = 4
    f, _ = _pair(64, d)
    # identical encodings: C_ii = var/(var+eps) ≈ 1, off-diagonals are the sample correlations
    c = cross_correlation(encoding_stats(f, f).moments())
    torch.testing.assert_close(torch.diagonal(c), torch.ones(d, dtype=c.dtype), atol=1e-4, rtol=0)
    # perfectly anti-correlated encodings: every C_ii ≈ −1, so the invariance term is ≈ 4d
    loss = cco_loss(encoding_stats(f, -f).moments(), lambd=0.0)
    assert math.isclose(loss.item(), 4 * d, rel_tol=1e-3)
    # λ scales only the redundancy term, by λ/(d−1)
    l0, l1 = (cco_loss(encoding_stats(*_pair(32, d)).moments(), lambd=x) for x in (0.0, 1.0))
    c = cross_correlation(encoding_stats(*_pair(32, d)).moments())
    off = (c**2).sum() - (torch.diagonal(c) ** 2).sum()
    torch.testing.assert_close(l1 - l0, off / (d - 1))


def test_cco_loss_per_segment__equals_loss_of_each_segment():
    f, g = _pair(19, 6, shift=2.0)
    sizes = [2, 5, 3, 9]
    ids = torch.repeat_interleave(torch.arange(4), torch.tensor(sizes))
    perm = torch.randperm(19, generator=torch.Generator().manual_seed(3))  # segments interleaved
    per = cco_loss_per_segment(f[perm], g[perm], ids[perm], 4)
    expected = torch.stack([
        cco_loss(encoding_stats(f[perm][ids[perm] == k], g[perm][ids[perm] == k]).moments())
        for k in range(4)
    ])
    torch.testing.assert_close(per, expected, rtol=1e-10, atol=1e-10)


def simclr_reference(z1, z2, tau):
    """Slow loop transcription of NT-Xent (SimCLR eq. 1)."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n2 = z.shape[0]
    n = n2 // 2
    total = 0.0
    for i in range(n2):
        j = (i + n) % n2
        denom = sum(math.exp(float(z[i] @ z[k]) / tau) for k in range(n2) if k != i)
        total += -math.log(math.exp(float(z[i] @ z[j]) / tau) / denom)
    return total / n2


def test_nt_xent__equals_loop_transcription():
    z1, z2 = _pair(5, 3)
    assert math.isclose(nt_xent(z1, z2, 0.1).item(), simclr_reference(z1, z2, 0.1), rel_tol=1e-10)


def test_nt_xent_per_anchor__groups_contrast_only_within_client():
    z1, z2 = _pair(7, 4)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    per = nt_xent_per_anchor(z1, z2, 0.1, groups)
    for k in range(3):
        sel = groups == k
        alone = nt_xent_per_anchor(z1[sel], z2[sel], 0.1)
        torch.testing.assert_close(torch.cat([per[:7][sel], per[7:][sel]]), alone)
