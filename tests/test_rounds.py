"""One federated round, three ways: the paper's appendix A equivalence as a test.

Fixture: unequal non-IID clients (each client's images share a class-like pattern), including
1-sample clients, in float64. We compare the aggregated update before the server optimiser
(the pseudo-gradient), not parameters after Adam: Adam's first step divides by |g| and so
amplifies rounding noise in near-zero gradients.
"""

import pytest
import torch

from dcco.config import AugmentConfig, ModelConfig
from dcco.core.simulator import run_round
from dcco.data.augment import augment_pair
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder

SIZES = [1, 3, 1, 5, 2, 4]
SIZES_FEDAVG = [2, 3, 5, 2, 4]  # within-client losses need two samples


def _model(projector=(24, 24, 16)):
    cfg = ModelConfig(arch="resnet14", widths=(4, 8, 8))
    return build_dual_encoder(cfg, in_channels=1, projector_dims=projector, seed=7).double()


def _round_views(sizes, seed=0, round_index=5):
    """Non-IID clients: each client's images are noisy copies of its own base pattern."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(len(sizes), 1, 12, 12, generator=gen)
    imgs = torch.cat([
        (255 * (0.7 * base[k] + 0.3 * torch.rand(n, 1, 12, 12, generator=gen))).to(torch.uint8)
        for k, n in enumerate(sizes)
    ])
    ids = torch.arange(imgs.shape[0]) + 1000
    return augment_pair(imgs, ids, seed=3, round_index=round_index, cfg=AugmentConfig.byol(),
                        dtype=torch.float64)


def _flat(result):
    return torch.cat([v.flatten() for v in result.pseudo_gradient.values()])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _centralized(model, x1, x2):
    return run_round(model, build_method("centralized_cco"), x1, x2,
                     Segments.from_counts([x1.shape[0]]), "batched")


def test_dcco_round__batched_equals_reference_equals_centralized_step():
    model, (x1, x2) = _model(), _round_views(SIZES)
    segments = Segments.from_counts(SIZES)
    dcco = build_method("dcco")
    batched = run_round(model, dcco, x1, x2, segments, "batched")
    reference = run_round(model, dcco, x1, x2, segments, "reference")
    central = _centralized(model, x1, x2)
    assert _flat(central).norm() > 0
    assert _rel(_flat(batched), _flat(central)) <= 1e-9
    assert _rel(_flat(reference), _flat(central)) <= 1e-9
    assert abs(reference.loss - central.loss) <= 1e-9 * abs(central.loss)
    assert (batched.num_clients, batched.num_samples) == (len(SIZES), sum(SIZES))


@pytest.mark.parametrize("method", ["cco_fedavg", "contrastive_fedavg"])
def test_fedavg_round__batched_equals_reference(method):
    m = build_method(method)
    model = _model()
    x1, x2 = _round_views(SIZES_FEDAVG, seed=1)
    segments = Segments.from_counts(SIZES_FEDAVG)
    batched = run_round(model, m, x1, x2, segments, "batched")
    reference = run_round(model, m, x1, x2, segments, "reference")
    assert _flat(reference).norm() > 0
    assert _rel(_flat(batched), _flat(reference)) <= 1e-9
    assert abs(batched.loss - reference.loss) <= 1e-9 * abs(reference.loss)


def test_cco_fedavg_round__differs_from_centralized_step():
    """Negative control: averaging within-client losses is not the large-batch loss."""
    model, (x1, x2) = _model(), _round_views(SIZES_FEDAVG, seed=1)
    fedavg = run_round(model, build_method("cco_fedavg"), x1, x2,
                       Segments.from_counts(SIZES_FEDAVG), "batched")
    central = _centralized(model, x1, x2)
    assert _rel(_flat(fedavg), _flat(central)) > 0.1


def test_dcco_round__local_lr_scales_the_update():
    model, (x1, x2) = _model(), _round_views(SIZES)
    segments = Segments.from_counts(SIZES)
    one = run_round(model, build_method("dcco"), x1, x2, segments, "reference", local_lr=1.0)
    half = run_round(model, build_method("dcco"), x1, x2, segments, "reference", local_lr=0.5)
    assert _rel(0.5 * _flat(one), _flat(half)) <= 1e-12


def test_run_round__rejects_clients_too_small_for_within_client_loss():
    model, (x1, x2) = _model(), _round_views([1, 3])
    with pytest.raises(ValueError, match="at least 2 samples per client"):
        run_round(model, build_method("cco_fedavg"), x1, x2, Segments.from_counts([1, 3]))


def test_run_round__leaves_the_model_unchanged():
    model, (x1, x2) = _model(), _round_views(SIZES)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for backend in ("batched", "reference"):
        run_round(model, build_method("dcco"), x1, x2, Segments.from_counts(SIZES), backend)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("method", ["dcco", "dvicreg", "fedsc", "cco_fedavg",
                                    "contrastive_fedavg", "vicreg_fedavg", "spectral_fedavg"])
def test_batched_round_in_client_groups__equals_the_round_in_one_forward(method):
    """``train.max_batch``: the clients in groups of at most 6 samples ([2, 3], [5], [2, 4]:
    a larger client alone), one forward and backward a group, give the same round: the
    pseudo-gradient, the loss, the statistics (merged, per client, and the fresh ones sent
    with the updates), in float64."""
    from dcco.core.algorithm import Algorithm
    from dcco.core.simulator import BatchedExecutor, client_groups

    m = build_method(method)
    model, (x1, x2) = _model(), _round_views(SIZES_FEDAVG, seed=2)
    segments = Segments.from_counts(SIZES_FEDAVG)
    assert [g.counts.tolist() for _, g in client_groups(segments, 6)] == [[2, 3], [5], [2, 4]]
    assert client_groups(segments, 16) is None and client_groups(segments, None) is None
    whole = run_round(model, m, x1, x2, segments, "batched")
    grouped = run_round(model, m, x1, x2, segments, "batched", chunk=6)
    assert _flat(whole).norm() > 0
    assert _rel(_flat(grouped), _flat(whole)) <= 1e-12
    assert abs(float(grouped.loss) - float(whole.loss)) <= 1e-12 * abs(float(whole.loss))
    if m.stats is None:
        return
    assert all(torch.allclose(a, b, rtol=1e-12, atol=0) for a, b in
               zip(grouped.shared.tensors(), whole.shared.tensors(), strict=True))
    one, groups = (BatchedExecutor(model, x1, x2, segments, c) for c in (None, 6))
    for a, b in zip(groups.each_statistics(m.stats), one.each_statistics(m.stats), strict=True):
        assert all(torch.allclose(a[k], b[k], rtol=1e-12, atol=1e-15) for k, _ in b.items())
    shared = whole.shared
    fresh = [e.updates(Algorithm(m, 1.0), shared, m.stats).stats for e in (groups, one)]
    assert all(torch.allclose(fresh[0][k], fresh[1][k], rtol=1e-12, atol=1e-15)
               for k, _ in fresh[1].items())


@pytest.mark.parametrize("method", ["dcco", "fedsc", "contrastive_fedavg"])
def test_client_groups_keeping_their_graphs__the_same_round_bit_for_bit_one_forward_each(
        method):
    """``keep_graphs`` (``train.max_batch = "auto"`` on a CPU): each group forwarded once,
    its graph kept from the statistics to its backward: the grouped round's pseudo-gradient,
    loss and statistics exactly, with one forward a group instead of two (statistics
    methods)."""
    m = build_method(method)
    model, (x1, x2) = _model(), _round_views(SIZES_FEDAVG, seed=2)
    segments = Segments.from_counts(SIZES_FEDAVG)
    forwards = []
    hook = model.register_forward_hook(lambda *_: forwards.append(1))
    twice = run_round(model, m, x1, x2, segments, "batched", chunk=6)
    n_twice, forwards[:] = len(forwards), []
    once = run_round(model, m, x1, x2, segments, "batched", chunk=6, keep_graphs=True)
    hook.remove()
    assert len(forwards) == 3 and n_twice == (6 if m.stats is not None else 3)
    assert torch.equal(_flat(once), _flat(twice)) and _flat(once).norm() > 0
    assert torch.equal(once.loss, twice.loss)
    if m.stats is not None:
        assert all(torch.equal(a, b) for a, b in
                   zip(once.shared.tensors(), twice.shared.tensors(), strict=True))


def test_keep_graphs__only_under_auto_on_a_cpu():
    from dcco.run.device_plan import keeps_graphs

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert keeps_graphs("auto", cpu) and not keeps_graphs("auto", cuda)
    assert not keeps_graphs(256, cpu) and not keeps_graphs(None, cpu)
