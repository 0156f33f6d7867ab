"""The partitioner's invariants (Hsu, Qi & Brown 2019) and natural partitions."""

import numpy as np
import pytest
import torch

from dcco.data.partition import dirichlet_partition, natural_partition

LABELS = torch.arange(1200) % 10  # 120 samples per class


@pytest.mark.parametrize("alpha", [0.0, 0.1, 1.0, 1000.0])
@pytest.mark.parametrize("size", [1, 4, 7])
def test_dirichlet_partition__equal_sizes_and_no_sample_twice(alpha, size):
    p = dirichlet_partition(LABELS, size, alpha, seed=3, num_clients=100)
    assert p.num_clients == 100 and torch.all(p.sizes == size)
    assert p.indices.unique().numel() == p.indices.numel()  # each sample at most once
    assert int(p.indices.min()) >= 0 and int(p.indices.max()) < 1200


def test_dirichlet_partition__alpha_zero_gives_exactly_one_class_per_client():
    p = dirichlet_partition(LABELS, 4, 0.0, seed=0)
    assert p.num_clients == 300  # all data used: 120 / 4 per class
    for k in range(p.num_clients):
        assert LABELS[p.client(k)].unique().numel() == 1
    assert p.summary(LABELS).max_classes == 1


def test_dirichlet_partition__alpha_1000_is_close_to_iid():
    s = dirichlet_partition(LABELS, 8, 1000.0, seed=0).summary(LABELS)
    assert s.mean_classes > 5.0  # IID draws of 8 from 10 classes average ≈ 5.7 classes


def test_dirichlet_partition__seeded_and_reproducible():
    a = dirichlet_partition(LABELS, 4, 0.5, seed=1)
    b = dirichlet_partition(LABELS, 4, 0.5, seed=1)
    c = dirichlet_partition(LABELS, 4, 0.5, seed=2)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.offsets, b.offsets)
    assert not torch.equal(a.indices, c.indices)


def test_dirichlet_partition__rejects_impossible_requests():
    with pytest.raises(ValueError, match="at most 300"):
        dirichlet_partition(LABELS, 4, 0.0, seed=0, num_clients=301)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(LABELS, 4, -1.0, seed=0)
    with pytest.raises(ValueError, match="samples_per_client"):
        dirichlet_partition(LABELS, 0, 1.0, seed=0)


def test_partition_gather__ids_and_segments_in_client_order():
    p = dirichlet_partition(LABELS, 3, 1.0, seed=0, num_clients=50)
    clients = torch.tensor([7, 2, 40])
    ids, seg = p.gather(clients)
    assert torch.equal(ids, torch.cat([p.client(7), p.client(2), p.client(40)]))
    assert seg.tolist() == [0] * 3 + [1] * 3 + [2] * 3


def test_natural_partition__groups_by_case_id():
    cases = np.array([5, 2, 5, 9, 2, 5])
    p = natural_partition(cases)
    assert p.keys == (2, 5, 9)
    assert [p.client(k).tolist() for k in range(3)] == [[1, 4], [0, 2, 5], [3]]
    ids, seg = p.gather(torch.tensor([2, 0]))
    assert ids.tolist() == [3, 1, 4] and seg.tolist() == [0, 1, 1]


def test_partition_summary__hand_made_case():
    labels = torch.tensor([0, 1, 1, 2, 2, 2])
    s = natural_partition([0, 0, 1, 1, 1, 2]).summary(labels)
    assert (s.num_clients, s.num_samples, s.min_size, s.max_size) == (3, 6, 1, 3)
    assert (s.min_classes, s.max_classes) == (1, 2) and s.mean_classes == pytest.approx(5 / 3)
    assert "3 clients" in str(s)
