"""The partitioner's invariants (Hsu, Qi & Brown 2019) and natural partitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.counting import LINES_WITHOUT_A_SAMPLE_LOOP, python_lines

from dcco.data.partition import Partition, dirichlet_partition, natural_partition

LABELS = torch.arange(1200) % 10  # 120 samples per class


def _assert_valid(p: Partition, n_samples: int, size: int, clients: int) -> None:
    assert p.num_clients == clients and p.indices.dtype == torch.int64
    assert torch.equal(p.offsets, torch.arange(clients + 1) * size)  # all of size `size`
    assert int(torch.bincount(p.indices).max()) == 1  # no sample twice
    assert int(p.indices.min()) >= 0 and int(p.indices.max()) < n_samples


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.1, 1.0, 1000.0])
@pytest.mark.parametrize("size", [1, 4, 7])
def test_dirichlet_partition__equal_sizes_and_no_sample_twice(alpha, size):
    p = dirichlet_partition(LABELS, size, alpha, seed=3, num_clients=100)
    _assert_valid(p, 1200, size, 100)


@pytest.mark.parametrize("alpha", [0.05, 1.0, 1000.0])
def test_dirichlet_partition__default_uses_all_the_data(alpha):
    labels = np.repeat(np.arange(5), [500, 300, 150, 40, 10])  # imbalanced: classes run out
    p = dirichlet_partition(labels, 5, alpha, seed=0)
    _assert_valid(p, 1000, 5, 200)
    assert sorted(p.indices.tolist()) == list(range(1000))


def test_dirichlet_partition__alpha_zero_gives_exactly_one_class_per_client():
    p = dirichlet_partition(LABELS, 4, 0.0, seed=0)
    assert p.num_clients == 300  # all data used: 120 / 4 per class
    for k in range(p.num_clients):
        assert LABELS[p.client(k)].unique().numel() == 1
    assert p.summary(LABELS).max_classes == 1
    uneven = np.repeat(np.arange(3), [10, 7, 5])  # 2 + 1 + 1 whole clients of 4
    q = dirichlet_partition(uneven, 4, 0.0, seed=1)
    assert q.num_clients == 4 and q.summary(uneven).max_classes == 1
    assert sorted(np.bincount(uneven[q.indices.numpy()], minlength=3).tolist()) == [4, 4, 8]


def test_dirichlet_partition__small_alpha_is_nearly_one_class_per_client():
    s = dirichlet_partition(LABELS, 8, 0.01, seed=0, num_clients=100).summary(LABELS)
    assert s.mean_classes < 1.5


def test_dirichlet_partition__alpha_1000_is_close_to_iid():
    s = dirichlet_partition(LABELS, 8, 1000.0, seed=0, num_clients=100).summary(LABELS)
    # IID draws of 8 from 10 equal classes average 10·(1 − 0.9⁸) ≈ 5.7 distinct classes.
    assert 5.2 < s.mean_classes < 6.2 and s.min_classes >= 3


def _reference_counts(labels: np.ndarray, n: int, alpha: float, clients: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Hsu et al. sample by sample: each sample's class from q renormalised over what is left."""
    left = np.bincount(labels).astype(np.int64)
    counts = np.zeros((clients, left.size), dtype=np.int64)
    for j, q in enumerate(rng.dirichlet(alpha * left / left.sum(), size=clients)):
        for _ in range(n):
            w = np.where(left > 0, q, 0.0)
            w = w if w.sum() > 0 else left.astype(float)
            c = rng.choice(left.size, p=w / w.sum())
            counts[j, c] += 1
            left[c] -= 1
    return counts


def test_dirichlet_partition__matches_sample_by_sample_process_in_distribution():
    """Same law as the slow transcription, also for the last clients, which meet empty classes.

    Both sides use fixed seeds, so the test is deterministic; 0.05 is about twice the sampling
    noise, and ignoring q once a client meets an empty class shifts the statistic by 0.11.
    """
    labels = np.repeat(np.arange(4), [40, 40, 20, 20])
    n, alpha, clients, seeds = 6, 0.3, 20, 100  # all 120 samples are used
    ours = np.zeros((seeds, clients, 4))
    for s in range(seeds):
        p = dirichlet_partition(labels, n, alpha, seed=s)
        np.add.at(ours[s], (np.repeat(np.arange(clients), n), labels[p.indices.numpy()]), 1)
    rng = np.random.default_rng(5)
    ref = np.stack([_reference_counts(labels, n, alpha, clients, rng) for _ in range(seeds)])
    for stat in (lambda c: (c > 0).sum(-1)[:, -7:].mean(),  # distinct classes, last third
                 lambda c: (c > 0).sum(-1).mean(),  # distinct classes, all clients
                 lambda c: (c.max(-1) == n).mean()):  # share of single-class clients
        assert abs(stat(ours) - stat(ref)) < 0.05, (stat(ours), stat(ref))


def test_dirichlet_partition__seeded_and_reproducible():
    a = dirichlet_partition(LABELS, 4, 0.5, seed=1)
    b = dirichlet_partition(LABELS, 4, 0.5, seed=1)
    c = dirichlet_partition(LABELS, 4, 0.5, seed=2)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.offsets, b.offsets)
    assert not torch.equal(a.indices, c.indices)
    d = dirichlet_partition(LABELS.numpy(), 4, 0.0, seed=1)
    e = dirichlet_partition(LABELS, 4, 0.0, seed=1)
    assert torch.equal(d.indices, e.indices)  # numpy or torch labels alike
    assert not torch.equal(d.indices, dirichlet_partition(LABELS, 4, 0.0, seed=2).indices)


def test_dirichlet_partition__classes_missing_from_labels_are_fine():
    labels = np.array([0, 0, 3, 3, 7, 7] * 10)
    p = dirichlet_partition(labels, 3, 1.0, seed=0)
    _assert_valid(p, 60, 3, 20)


def test_dirichlet_partition__rejects_impossible_requests():
    with pytest.raises(ValueError, match="at most 300"):
        dirichlet_partition(LABELS, 4, 0.0, seed=0, num_clients=301)
    with pytest.raises(ValueError, match="need 1204 samples"):
        dirichlet_partition(LABELS, 4, 0.3, seed=0, num_clients=301)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(LABELS, 4, -1.0, seed=0)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(LABELS, 4, float("nan"), seed=0)
    with pytest.raises(ValueError, match="samples_per_client"):
        dirichlet_partition(LABELS, 0, 1.0, seed=0)
    with pytest.raises(ValueError, match="num_clients"):
        dirichlet_partition(LABELS, 4, 1.0, seed=0, num_clients=0)
    with pytest.raises(ValueError, match="labels"):
        dirichlet_partition(np.array([0.5, 1.5]), 1, 1.0, seed=0)
    with pytest.raises(ValueError, match="labels must be >= 0"):
        dirichlet_partition(np.array([0, -1]), 1, 1.0, seed=0)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 1000.0])
def test_dirichlet_partition__fast_for_60000_one_sample_clients(alpha):
    labels = np.random.default_rng(0).integers(0, 10, size=60_000)
    p, lines = python_lines(dirichlet_partition, labels, 1, alpha, seed=0)
    _assert_valid(p, 60_000, 1, 60_000)
    # vectorised: the sample-by-sample loop it replaced ran lines for each of the 60,000
    assert lines < LINES_WITHOUT_A_SAMPLE_LOOP, lines


def test_partition_gather__ids_and_segments_in_client_order():
    p = dirichlet_partition(LABELS, 3, 1.0, seed=0, num_clients=50)
    clients = torch.tensor([7, 2, 40, 2])
    ids, seg = p.gather(clients)
    assert torch.equal(ids, torch.cat([p.client(7), p.client(2), p.client(40), p.client(2)]))
    assert seg.tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    empty_ids, empty_seg = p.gather(torch.tensor([], dtype=torch.int64))
    assert empty_ids.numel() == 0 and empty_seg.numel() == 0
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        p.gather(torch.tensor([3, 50]))
    with pytest.raises(IndexError):
        p.gather(torch.tensor([-1]))


def test_partition_gather__uneven_clients():
    p = Partition(torch.tensor([9, 8, 7, 6, 5, 4]), torch.tensor([0, 1, 1, 4, 6]))
    ids, seg = p.gather(torch.tensor([2, 1, 0, 3]))
    assert ids.tolist() == [8, 7, 6, 9, 5, 4] and seg.tolist() == [0, 0, 0, 2, 3, 3]
    assert p.sizes.tolist() == [1, 0, 3, 2]


def test_partition__rejects_inconsistent_csr():
    with pytest.raises(ValueError, match="end at len"):
        Partition(torch.tensor([1, 2, 3]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="nondecreasing"):
        Partition(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1, 3]))
    with pytest.raises(ValueError, match="int64"):
        Partition(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 2]))


def test_natural_partition__groups_by_case_id():
    cases = np.array([5, 2, 5, 9, 2, 5])
    p = natural_partition(cases)
    assert p.keys == (2, 5, 9)
    assert [p.client(k).tolist() for k in range(3)] == [[1, 4], [0, 2, 5], [3]]
    ids, seg = p.gather(torch.tensor([2, 0]))
    assert ids.tolist() == [3, 1, 4] and seg.tolist() == [0, 1, 1]
    named = natural_partition(["b", "a", "b"])
    assert named.keys == ("a", "b") and named.client(1).tolist() == [0, 2]
    assert natural_partition(torch.tensor([3, 3])).keys == (3,)


def test_partition_summary__hand_made_case():
    labels = torch.tensor([0, 1, 1, 2, 2, 2])
    s = natural_partition([0, 0, 1, 1, 1, 2]).summary(labels)
    assert (s.num_clients, s.num_samples, s.min_size, s.max_size) == (3, 6, 1, 3)
    assert s.mean_size == pytest.approx(2.0)
    assert (s.min_classes, s.max_classes) == (1, 2) and s.mean_classes == pytest.approx(5 / 3)
    assert str(s) == s.format()
    assert s.format() == ("3 clients, 6 samples; samples per client 1–3 (mean 2.00); distinct "
                          "classes per client 1–2 (mean 1.67).")


def test_clients_of_at_least__keeps_the_clients_large_enough_in_order():
    from dcco.data.partition import clients_of_at_least, natural_partition

    p = natural_partition(["b", "a", "c", "a", "c", "c", "d"])  # a: 2, b: 1, c: 3, d: 1
    kept = clients_of_at_least(p, 2)
    assert kept.keys == ("a", "c") and kept.sizes.tolist() == [2, 3]
    assert sorted(kept.client(0).tolist()) == [1, 3] and sorted(kept.client(1).tolist()) == [
        2, 4, 5]
    assert clients_of_at_least(p, 1) is p
    assert clients_of_at_least(p, 4).num_clients == 0
