"""Evaluation protocols on tiny data: subsets, probe, finetuning, scratch, case pooling, k-NN."""

import pytest
import torch
from conftest import make_fashion_mnist

from dcco.data.datasets import load_dataset
from dcco.evaluate import (
    EvalConfig,
    case_features,
    finetune,
    knn_accuracy,
    knn_predict,
    labelled_subset,
    linear_probe,
    supervised_from_scratch,
    train_linear_classifier,
)
from dcco.models import ModelConfig, build_dual_encoder

TINY = ModelConfig(widths=(4, 8, 8))
SMALL = ModelConfig(widths=(8, 16, 32))
FAST = EvalConfig(labels=60, probe_steps=200, probe_batch=32, finetune_steps=6, finetune_batch=16,
                  scratch_epochs=2, scratch_batch=16, knn_k=5, feature_batch=64)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    folder = make_fashion_mnist(tmp_path_factory.mktemp("fm"), n_train=300, n_test=100)
    return (load_dataset("fashion_mnist", "train", folder, download=False),
            load_dataset("fashion_mnist", "test", folder, download=False))


def test_labelled_subset__class_balanced_and_reproducible():
    labels = torch.arange(1000) % 10
    ids = labelled_subset(labels, 105, 10, seed=0)
    counts = labels[ids].bincount(minlength=10).tolist()
    assert counts == [11] * 5 + [10] * 5 and ids.unique().numel() == 105
    assert torch.equal(ids, labelled_subset(labels, 105, 10, seed=0))
    assert not torch.equal(ids, labelled_subset(labels, 105, 10, seed=1))
    with pytest.raises(ValueError, match="class 0"):
        labelled_subset(labels, 2000, 10, seed=0)


def test_linear_probe__leaves_encoder_untouched_and_learns(splits):
    train, test = splits
    model = build_dual_encoder(SMALL, 1, (16, 16, 8), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = linear_probe(model, train, test, labelled_subset(train.labels, 60, 10, 0), FAST, 0,
                          CPU)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert result.protocol == "linear" and result.num_labels == 60
    assert result.accuracy > 0.25  # 10 classes with distinct patterns: chance is 0.1


def test_train_linear_classifier__separable_features_are_learned():
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(200) % 4
    x = torch.nn.functional.one_hot(y, 4).float() * 3 + 0.3 * torch.randn(200, 4, generator=gen)
    head = train_linear_classifier(x, y, 4, steps=100, batch=64, lr=2.0, momentum=0.9, seed=0)
    assert (head(x).argmax(1) == y).float().mean() == 1.0


def test_finetune__changes_a_copy_not_the_model(splits):
    train, test = splits
    model = build_dual_encoder(TINY, 1, (16, 16, 8), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result, net = finetune(model, train, test, labelled_subset(train.labels, 60, 10, 0), FAST, 0,
                           CPU)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    changed = [not torch.equal(p, model.backbone.state_dict()[k])
               for k, p in net.backbone.state_dict().items()]
    assert any(changed) and 0 <= result.accuracy <= 1


def test_supervised_from_scratch__beats_chance(splits):
    train, test = splits
    cfg = EvalConfig(labels=100, scratch_epochs=15, scratch_batch=32, scratch_lr=0.01)
    result = supervised_from_scratch(SMALL, 1, train, test, labelled_subset(train.labels, 100, 10,
                                                                           0), cfg, 0, CPU)
    assert result.protocol == "supervised" and result.accuracy > 0.25


def test_case_features__average_pools_by_case_id_in_any_order():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [10.0, 10.0], [5.0, 4.0]])
    cases = torch.tensor([7, 7, 2, 7])
    keys, pooled = case_features(feats, cases)
    assert keys.tolist() == [2, 7]
    torch.testing.assert_close(pooled, torch.tensor([[10.0, 10.0], [3.0, 2.0]]))
    perm = torch.tensor([3, 1, 0, 2])
    keys2, pooled2 = case_features(feats[perm], cases[perm])
    assert torch.equal(keys, keys2) and torch.allclose(pooled, pooled2)


def test_knn_predict__separable_is_perfect_and_random_labels_near_chance():
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(400) % 4
    centres = torch.eye(8)[:4] * 5
    x = centres[y] + 0.1 * torch.randn(400, 8, generator=gen)
    assert torch.equal(knn_predict(x[:300], y[:300], x[300:], 4, 10, 0.1), y[300:])
    noise = torch.randn(2000, 16, generator=gen)
    random_y = torch.randint(0, 4, (2000,), generator=gen)
    acc = (knn_predict(noise[:1500], random_y[:1500], noise[1500:], 4, 20, 0.1)
           == random_y[1500:]).float().mean()
    assert 0.15 < acc < 0.35


def test_knn_accuracy__runs_on_a_dual_encoder(splits):
    train, test = splits
    model = build_dual_encoder(TINY, 1, (16, 16, 8), seed=0)
    acc = knn_accuracy(model, train, test, k=5, temperature=0.1, bank_size=200, num_queries=50,
                       seed=0, device=CPU)
    assert 0.0 <= acc <= 1.0


def test_eval_config__validation_and_500_label_settings():
    with pytest.raises(ValueError, match="eval.probe_steps"):
        EvalConfig(probe_steps=0)
    cfg = EvalConfig.for_labels(500)
    assert (cfg.labels, cfg.probe_steps, cfg.probe_batch, cfg.probe_lr) == (500, 400, 128, 2.5)
