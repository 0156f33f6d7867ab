"""Evaluation protocols on tiny synthetic data: labelled subsets, linear probe, finetuning,
supervised from scratch, case pooling and the k-NN monitor."""

import pytest
import torch
from torch import nn

from dcco.config import EvalConfig, ModelConfig
from dcco.data.datasets import ImageDataset
from dcco.evaluate import (
    PROTOCOL_REVISION,
    case_features,
    case_labels,
    extract_features,
    finetune,
    is_current,
    knn_accuracy,
    knn_predict,
    knn_space,
    labelled_subset,
    linear_probe,
    linear_probe_cases,
    supervised_from_scratch,
    train_linear_classifier,
)
from dcco.models import build_dual_encoder

TINY = ModelConfig(widths=(4, 8, 8))
FAST = EvalConfig(labels=80, probe_steps=100, probe_batch=32, finetune_steps=4,
                  finetune_batch=16, scratch_epochs=8, scratch_batch=32, knn_k=5,
                  feature_batch=64)
CPU = torch.device("cpu")
CLASSES = 4


def textures(labels: torch.Tensor, seed: int, size: int = 12) -> torch.Tensor:
    """uint8 (N, 1, size, size) images: class 0 horizontal stripes, 1 vertical stripes,
    2 a checkerboard (3-pixel squares), 3 a disc, plus uniform noise. Textures survive global
    pooling and group norm, so even a random encoder separates them well."""
    r = torch.arange(size)
    rows, cols = r[:, None].expand(size, size), r[None, :].expand(size, size)
    disc = (rows - size / 2) ** 2 + (cols - size / 2) ** 2 < 12
    patterns = torch.stack([(rows // 3) % 2, (cols // 3) % 2, (rows // 3 + cols // 3) % 2,
                            disc.long()]).float()
    noise = torch.rand(labels.numel(), size, size, generator=torch.Generator().manual_seed(seed))
    images = 180 * patterns[labels] + 40 * noise
    return images.round().to(torch.uint8)[:, None]


def dataset(n: int, seed: int) -> ImageDataset:
    labels = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) % CLASSES
    return ImageDataset("textures", textures(labels, seed), labels, CLASSES,
                        tuple(f"c{i}" for i in range(CLASSES)))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: several threads only add overhead, badly so on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def splits() -> tuple[ImageDataset, ImageDataset]:
    return dataset(200, seed=1), dataset(100, seed=2)


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def same_state(module: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    state = module.state_dict()
    return state.keys() == before.keys() and all(torch.equal(state[k], before[k]) for k in state)


def test_labelled_subset__class_balanced_and_reproducible():
    labels = torch.arange(1000) % 10
    ids = labelled_subset(labels, 105, 10, seed=0)
    assert ids.dtype == torch.int64 and torch.equal(ids, ids.sort().values)
    assert ids.unique().numel() == 105
    assert labels[ids].bincount(minlength=10).tolist() == [11] * 5 + [10] * 5
    assert torch.equal(ids, labelled_subset(labels, 105, 10, seed=0))
    assert not torch.equal(ids, labelled_subset(labels, 105, 10, seed=1))
    small = labelled_subset(labels, 50, 10, seed=0)  # per-class picks are permutation heads
    assert set(small.tolist()) <= set(ids.tolist())


def test_labelled_subset__errors_name_the_problem():
    labels = torch.arange(100) % 4
    uneven = torch.cat([torch.zeros(10, dtype=torch.int64), torch.ones(90, dtype=torch.int64)])
    with pytest.raises(ValueError, match="needs 20 samples of class 0.*has 10"):
        labelled_subset(uneven, 40, 2, seed=0)
    # as many labels as the split holds, or more: all of it (every protocol's rule)
    assert torch.equal(labelled_subset(labels, 200, 4, seed=0), torch.arange(100))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        labelled_subset(labels, 12, 3, seed=0)
    with pytest.raises(ValueError, match="n >= 1"):
        labelled_subset(labels, 0, 4, seed=0)


def test_extract_features__batch_invariant_and_mode_restored(splits):
    train, _ = splits
    model = build_dual_encoder(TINY, 1, (16, 8), seed=0).train()
    whole = extract_features(model, train.images[:50], 64, CPU)
    pieces = extract_features(model, train.images[:50], 7, CPU)
    assert whole.shape == (50, model.feature_dim) and whole.dtype == torch.float32
    torch.testing.assert_close(whole, pieces, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(whole, extract_features(model.backbone, train.images[:50], 64, CPU))
    assert model.training


def test_train_linear_classifier__learns_separable_features_at_any_scale():
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(200) % 4
    x = torch.nn.functional.one_hot(y, 4).float() * 3 + 0.3 * torch.randn(200, 4, generator=gen)
    x = 50 * x + torch.tensor([100.0, -7.0, 0.0, 3.0])  # the folded standardisation undoes this
    head = train_linear_classifier(x, y, 4, steps=100, batch=64, lr=2.0, momentum=0.9, seed=0)
    assert (head(x).argmax(1) == y).all()


def test_linear_probe__leaves_encoder_untouched_and_beats_chance(splits):
    train, test = splits
    model = build_dual_encoder(TINY, 1, (16, 8), seed=0)
    before = snapshot(model)
    ids = labelled_subset(train.labels, 80, CLASSES, seed=0)
    result = linear_probe(model, train, test, ids, FAST, 0, CPU)
    assert same_state(model, before)
    assert all(p.grad is None for p in model.parameters())
    assert (result.protocol, result.num_labels, result.num_test, result.steps) == (
        "linear", 80, 100, 100)
    assert result.accuracy > 0.6 and result.train_accuracy > 0.6  # chance: 0.25


def test_finetune__changes_the_returned_copy_not_the_model(splits):
    train, test = splits
    model = build_dual_encoder(TINY, 1, (16, 8), seed=0)
    before = snapshot(model)
    ids = labelled_subset(train.labels, 80, CLASSES, seed=0)
    result, net = finetune(model, train, test, ids, FAST, 0, CPU)
    assert same_state(model, before)
    assert not same_state(net.backbone, snapshot(model.backbone))
    assert net.head.out_features == CLASSES
    assert (result.protocol, result.steps, result.num_labels) == ("finetune", 4, 80)
    assert 0.0 <= result.accuracy <= 1.0
    again, _ = finetune(model, train, test, ids, FAST, 0, CPU)
    assert again.accuracy == result.accuracy  # seeded: batches, flips and head


class Scaled(nn.Module):
    """A backbone whose features are multiplied by a constant."""

    def __init__(self, backbone: nn.Module, factor: float) -> None:
        super().__init__()
        self.backbone, self.factor = backbone, factor
        self.feature_dim = backbone.feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.factor * self.backbone(x)


def test_finetune__does_not_depend_on_the_scale_of_the_features(splits):
    """Encoders pretrained with LARS can have features of norm ~10³; the head's batch norm
    makes finetuning see the same problem as at unit scale (revision 2 of the protocol)."""
    train, test = splits
    backbone = build_dual_encoder(TINY, 1, (16, 8), seed=0).backbone
    ids = labelled_subset(train.labels, 80, CLASSES, seed=0)
    plain, _ = finetune(Scaled(backbone, 1.0), train, test, ids, FAST, 0, CPU)
    large, _ = finetune(Scaled(backbone, 1000.0), train, test, ids, FAST, 0, CPU)
    assert abs(plain.accuracy - large.accuracy) <= 0.02
    assert plain.revision == large.revision == PROTOCOL_REVISION["finetune"] == 2


def test_is_current__older_revisions_and_unrevisioned_entries():
    assert is_current({"protocol": "linear", "accuracy": 0.5})  # revision 1 is current
    assert not is_current({"protocol": "finetune", "accuracy": 0.5})  # predates revision 2
    assert is_current({"protocol": "finetune", "revision": 2})
    assert not is_current({"protocol": "supervised", "revision": 1})


def test_supervised_from_scratch__beats_chance(splits):
    train, test = splits
    ids = labelled_subset(train.labels, 80, CLASSES, seed=0)
    result = supervised_from_scratch(TINY, 1, train, test, ids, FAST, 0, CPU)
    assert (result.protocol, result.steps) == ("supervised", 8 * 3)  # 8 epochs of ⌈80/32⌉
    assert result.accuracy > 0.5  # chance: 0.25


def test_case_features__average_pools_by_case_id_in_any_order():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [10.0, 10.0], [5.0, 4.0]])
    cases = torch.tensor([7, 7, 2, 7])
    keys, pooled = case_features(feats, cases)
    assert keys.tolist() == [2, 7]
    torch.testing.assert_close(pooled, torch.tensor([[10.0, 10.0], [3.0, 2.0]]))
    perm = torch.tensor([3, 1, 0, 2])
    keys2, pooled2 = case_features(feats[perm], cases[perm])
    assert torch.equal(keys, keys2)
    torch.testing.assert_close(pooled, pooled2)


def test_case_labels__one_label_per_case_and_conflicts_rejected():
    keys, labels = case_labels(torch.tensor([1, 0, 1, 2]), torch.tensor([9, 4, 9, 5]))
    assert keys.tolist() == [4, 5, 9] and labels.tolist() == [0, 2, 1]
    with pytest.raises(ValueError, match="case 9"):
        case_labels(torch.tensor([1, 0, 2, 2]), torch.tensor([9, 4, 9, 5]))


def test_linear_probe_cases__classifies_pooled_cases(splits):
    train, test = splits
    model = build_dual_encoder(TINY, 1, (16, 8), seed=0)
    before = snapshot(model)
    # cases of 1 to 3 images of one class: images sorted by label, consecutive runs
    order = train.labels.argsort(stable=True)
    train_sorted = train.subset(order)
    train_cases = train_sorted.labels * 1000 + torch.arange(len(train)) // 3
    test_cases = test.labels * 1000 + torch.arange(len(test)) % 7  # scattered, any order
    result = linear_probe_cases(model, train_sorted, train_cases, test, test_cases, FAST, 0,
                                CPU)
    assert same_state(model, before)
    assert result.protocol == "case_linear"
    assert result.num_labels == train_cases.unique().numel()
    assert result.num_test == test_cases.unique().numel() < len(test)
    assert result.accuracy > 0.6


def test_knn_predict__separable_is_perfect_and_random_labels_near_chance():
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(400) % 4
    x = torch.eye(8)[:4][y] * 5 + 0.1 * torch.randn(400, 8, generator=gen)
    assert torch.equal(knn_predict(x[:300], y[:300], x[300:], 4, 10, 0.1), y[300:])
    noise = torch.randn(2000, 16, generator=gen)
    random_y = torch.randint(0, 4, (2000,), generator=gen)
    pred = knn_predict(noise[:1500], random_y[:1500], noise[1500:], 4, 20, 0.1)
    assert 0.15 < (pred == random_y[1500:]).float().mean() < 0.35
    chunked = knn_predict(noise[:1500], random_y[:1500], noise[1500:], 4, 20, 0.1, chunk=7)
    assert torch.equal(pred, chunked)
    tiny_tau = knn_predict(x[:300], y[:300], x[300:], 4, 10, 1e-4)  # exp stays finite
    assert torch.equal(tiny_tau, y[300:])


def _clustered(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (n, 12) features of 4 classes (class means ±1 apart in 6 dimensions, unit
    noise) and their labels."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    means = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    return means[y] + 0.7 * torch.randn(n, 12, generator=gen, dtype=torch.float64), y


@pytest.mark.parametrize("features", ["standardized", "centered"])
def test_knn_predict__a_shift_of_every_feature_changes_nothing(features):
    x, y = _clustered(600, 1)
    shift = 1e3 * torch.randn(12, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    plain = knn_predict(x[:400], y[:400], x[400:], 4, 20, 0.1, features=features)
    shifted = knn_predict(x[:400] + shift, y[:400], x[400:] + shift, 4, 20, 0.1,
                          features=features)
    assert torch.equal(plain, shifted)
    # the raw monitor is not invariant: one shared direction decides it
    raw = knn_predict(x[:400] + shift, y[:400], x[400:] + shift, 4, 20, 0.1, features="raw")
    assert not torch.equal(raw, plain)


def test_knn_predict__standardized_ignores_the_scale_of_a_dimension():
    x, y = _clustered(600, 3)
    plain = knn_predict(x[:400], y[:400], x[400:], 4, 20, 0.1)
    for dim, factor in ((0, 1e4), (5, 1e-5), (11, 3.0)):
        scaled = x.clone()
        scaled[:, dim] *= factor
        assert torch.equal(knn_predict(scaled[:400], y[:400], scaled[400:], 4, 20, 0.1), plain)
    assert (plain == y[400:]).double().mean() > 0.8


def test_knn_predict__loud_uninformative_dimensions_fool_raw_not_standardized():
    """What the monitor got wrong: a few dimensions of large spread that carry no class
    decide the raw (and the centred) cosine, so a good encoder reads as broken."""
    x, y = _clustered(1200, 4)
    loud = torch.cat([x, 30 * torch.randn(1200, 4, generator=torch.Generator().manual_seed(5),
                                          dtype=x.dtype)], dim=1)
    acc = {f: float((knn_predict(loud[:900], y[:900], loud[900:], 4, 20, 0.1, features=f)
                     == y[900:]).double().mean()) for f in ("raw", "centered", "standardized")}
    assert acc["standardized"] > 0.8
    assert acc["raw"] < 0.45 and acc["centered"] < 0.45


def test_knn_space__a_constant_dimension_is_dropped_not_blown_up():
    x, y = _clustered(300, 6)
    with_dead = torch.cat([x, torch.zeros(300, 1, dtype=x.dtype),
                           torch.full((300, 1), 7.0, dtype=x.dtype)], dim=1)
    bank, queries = knn_space(with_dead[:200], with_dead[200:])
    assert torch.isfinite(bank).all() and torch.isfinite(queries).all()
    assert bank[:, 12:].abs().max() == 0 and queries[:, 12:].abs().max() == 0
    assert torch.equal(knn_predict(with_dead[:200], y[:200], with_dead[200:], 4, 20, 0.1),
                       knn_predict(x[:200], y[:200], x[200:], 4, 20, 0.1))
    with pytest.raises(ValueError, match="k-NN features"):
        knn_space(x, x, "whitened")


def test_knn_accuracy__perfect_on_separable_images_chance_on_random_labels(splits):
    train, test = splits
    pixels = nn.Flatten()  # raw pixels: the textures are their own nearest neighbours
    acc = knn_accuracy(pixels, train, test, k=5, temperature=0.1, bank_size=150, num_queries=40,
                       seed=0, device=CPU)
    assert acc == 1.0
    shuffled = ImageDataset("shuffled", train.images, torch.randint(
        0, CLASSES, (len(train),), generator=torch.Generator().manual_seed(3)), CLASSES,
        train.class_names)
    model = build_dual_encoder(TINY, 1, (16, 8), seed=0)
    chance = knn_accuracy(model, shuffled, test, k=20, temperature=0.1, bank_size=None,
                          num_queries=None, seed=0, device=CPU)
    assert 0.1 < chance < 0.45


def test_eval_config__validation_and_500_label_settings():
    with pytest.raises(ValueError, match="eval.probe_steps"):
        EvalConfig(probe_steps=0)
    with pytest.raises(ValueError, match="eval.knn_bank"):
        EvalConfig(knn_bank=0)
    with pytest.raises(ValueError, match="eval.probe_momentum"):
        EvalConfig(probe_momentum=1.0)
    cfg = EvalConfig.for_labels(500)
    assert (cfg.labels, cfg.probe_steps, cfg.probe_batch, cfg.probe_lr) == (500, 400, 128, 2.5)
    assert EvalConfig.for_labels(5000) == EvalConfig()
    assert EvalConfig.for_labels(1000, base=FAST) == EvalConfig(
        **{**FAST.__dict__, "labels": 1000})
