"""The k-NN monitor: weighted k-NN (Wu et al. 2018) in a space that tracks the probe."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config import EvalConfig
from dcco.config.eval_config import KNN_FEATURES, KnnFeatures
from dcco.core.seeding import generator
from dcco.data.paired import Dataset
from dcco.evaluate.features import extract_features


def knn_space(bank: Tensor, queries: Tensor, features: KnnFeatures = "standardized"
              ) -> tuple[Tensor, Tensor]:
    """Bank and queries mapped into the k-NN monitor's space and L2-normalised (float32).

    ``centered`` subtracts the bank's per-dimension mean from both; ``standardized`` also
    divides by the bank's per-dimension std (biased), so a constant shift of every feature, or
    a rescaled dimension, changes nothing. A dimension the bank holds constant (its spread
    under 1e-7 of its own magnitude: a dead unit, or float32 rounding) carries no neighbour
    information and is dropped rather than blown up.

    Args:
        bank: float (N, D) reference features.
        queries: float (M, D), on the bank's device.
        features: see ``KNN_FEATURES``.

    Returns:
        float32 (N, D) and (M, D), unit rows (rows of all zeros stay zero).
    """
    if features not in KNN_FEATURES:
        raise ValueError(f"k-NN features must be one of {', '.join(KNN_FEATURES)}, "
                         f"got {features!r}")
    bank, queries = bank.double(), queries.double()
    if features != "raw":
        mean = bank.mean(0)
        bank, queries = bank - mean, queries - mean
    if features == "standardized":
        std = bank.std(0, correction=0)
        constant = std <= 1e-7 * (bank + mean).abs().amax(0)
        scale = torch.where(constant, torch.zeros_like(std), 1 / std.clamp_min(1e-300))
        bank, queries = bank * scale, queries * scale
    return F.normalize(bank, dim=1).float(), F.normalize(queries, dim=1).float()


def knn_predict(bank: Tensor, bank_labels: Tensor, queries: Tensor, num_classes: int, k: int,
                temperature: float, chunk: int = 1024,
                features: KnnFeatures = "standardized") -> Tensor:
    """Weighted k-NN classification (Wu et al. 2018) in the space ``features`` names
    (``knn_space``; Wu et al. compare raw features, ``raw`` here).

    Each query's k most cosine-similar bank features vote for their labels with weight
    exp(s / τ); the class with the largest vote wins.

    Args:
        bank: float (N, D) reference features.
        bank_labels: int64 (N,) their labels.
        queries: float (M, D), on the bank's device.
        num_classes: number of classes.
        k: neighbours (at most N are used).
        temperature: τ > 0.
        chunk: queries per similarity block, bounding memory to chunk × N.
        features: see ``KNN_FEATURES``.

    Returns:
        int64 (M,) predicted labels, on the queries' device.
    """
    bank, queries = knn_space(bank, queries, features)
    bank_labels = bank_labels.to(bank.device)
    preds = []
    for q in queries.split(chunk):
        sims, idx = (q @ bank.T).topk(min(k, bank.shape[0]), dim=1)
        # subtracting each query's top similarity changes no argmax and keeps exp finite
        weights = torch.exp((sims - sims[:, :1]) / temperature)
        votes = torch.zeros(q.shape[0], num_classes, device=q.device)
        preds.append(votes.scatter_add_(1, bank_labels[idx], weights).argmax(1))
    return torch.cat(preds)


def knn_accuracy(model: nn.Module, train_set: Dataset, test_set: Dataset, k: int,
                 temperature: float, bank_size: int | None, num_queries: int | None, seed: int,
                 device: torch.device, batch_size: int = 1024,
                 features: KnnFeatures = "standardized") -> float:
    """Weighted k-NN top-1 accuracy of the encoder's features: the pretraining monitor.

    The bank (training images) and the queries (test images) are random subsets drawn from
    the stream ``(seed, "knn")``, the same ones at every call, so successive values during a
    run are comparable.

    Args:
        model: a ``DualEncoder`` or a backbone, on ``device``; its mode is restored.
        train_set, test_set: the splits.
        k, temperature: see ``knn_predict``.
        bank_size, num_queries: subset sizes; None (or more than the split holds): all.
        seed: the run seed.
        device: where features are computed.
        batch_size: images per forward pass.
        features: see ``KNN_FEATURES``.

    Returns:
        Accuracy in [0, 1] on the queried test images.
    """
    if k < 1 or not temperature > 0:
        raise ValueError(f"k-NN needs k >= 1 and temperature > 0, got k={k}, "
                         f"temperature={temperature}")
    gen = generator(seed, "knn")
    bank_ids = torch.randperm(len(train_set), generator=gen)[:bank_size or len(train_set)]
    query_ids = torch.randperm(len(test_set), generator=gen)[:num_queries or len(test_set)]
    bank = extract_features(model, train_set.inputs(0)[bank_ids], batch_size, device)
    queries = extract_features(model, test_set.inputs(0)[query_ids], batch_size, device)
    pred = knn_predict(bank, train_set.labels[bank_ids], queries, train_set.num_classes, k,
                       temperature, features=features)
    return float((pred == test_set.labels[query_ids].to(pred.device)).double().mean())


def knn_description(ecfg: EvalConfig, bank: int | None = None, queries: int | None = None
                    ) -> str:
    """What a k-NN figure made under ``ecfg`` is, for tables, plots and the end-of-run line,
    e.g. "standardized k-NN (k 200, bank 10,000, 2,000 queries)"; ``bank`` and ``queries``:
    the sizes used where the split was smaller than asked."""
    bank = bank or ecfg.knn_bank
    queries = queries or ecfg.knn_queries
    sizes = (f"bank {'all' if bank is None else f'{bank:,}'}, "
             f"{'all' if queries is None else f'{queries:,}'} queries")
    return f"{ecfg.knn_features} k-NN (k {ecfg.knn_k}, {sizes})"
