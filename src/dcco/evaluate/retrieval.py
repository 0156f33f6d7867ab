"""Cross-modal retrieval between the two towers of paired data."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.core.seeding import generator
from dcco.data.paired import PairedDataset
from dcco.errors import UserError
from dcco.evaluate.features import StepCallback, _batched, _default_dtype
from dcco.evaluate.settings import EvalResult

RETRIEVAL_KS = (1, 5)
Similarity = str
"""How retrieval compares encodings: "standardized", each projection dimension z-scored over
the gallery, then cosine (the space the CCO loss correlates: its encodings are batch-
standardised); "cosine", cosine of the projections as they are (the space a contrastive loss
compares in)."""


def retrieval_ranks(queries: Tensor, gallery: Tensor, chunk: int = 1024) -> Tensor:
    """The rank of each query's own partner among all of the gallery: query i's partner is
    gallery row i; rank 0 is best. Ties count in the query's favour (strictly more similar
    rows only).

    Args:
        queries, gallery: float (M, d), L2-normalised, on one device.
        chunk: queries per similarity block (memory chunk × M).

    Returns:
        int64 (M,) ranks.
    """
    if queries.shape != gallery.shape:
        raise ValueError(f"retrieval needs one partner per query, got {tuple(queries.shape)} "
                         f"queries and {tuple(gallery.shape)} gallery rows")
    ranks = []
    for start in range(0, queries.shape[0], chunk):
        q = queries[start:start + chunk]
        sims = q @ gallery.T
        own = sims[torch.arange(q.shape[0]), torch.arange(start, start + q.shape[0])]
        ranks.append((sims > own[:, None]).sum(1))
    return torch.cat(ranks)


def comparable(encodings: Tensor, similarity: Similarity) -> Tensor:
    """Encodings (M, d) mapped into ``similarity``'s space, L2-normalised (float64)."""
    z = encodings.double()
    if similarity == "standardized":
        z = (z - z.mean(0)) / (z.std(0, correction=0) + 1e-12)
    elif similarity != "cosine":
        raise ValueError(f"similarity must be 'standardized' or 'cosine', got {similarity!r}")
    return F.normalize(z, dim=1)


def retrieval(model: nn.Module, test_set: PairedDataset, gallery: int, seed: int,
              device: torch.device, similarity: Similarity = "standardized",
              batch_size: int = 1024, progress: StepCallback | None = None) -> EvalResult:
    """Cross-modal retrieval: each X of a gallery of test pairs finds its Y among the
    gallery's Ys, and each Y its X, by the similarity of their projections (the encodings the
    loss saw: tower 0 on X, tower 1 on Y).

    Args:
        model: a two-tower ``DualEncoder`` on ``device``.
        test_set: the test pairs.
        gallery: pairs in the gallery, drawn from the stream ``(seed, "retrieval")`` (all
            when at least the split's size).
        seed: the run seed.
        device: where the encodings are computed.
        similarity: see ``Similarity``.

    Returns:
        ``accuracy``: the mean of recall@1 X→Y and Y→X; ``details``: recall@1 and @5 of each
        direction and the similarity.
    """
    if not getattr(test_set, "paired", False):
        raise UserError("retrieval pairs two modalities; this data set holds images (use a "
                        "paired data set, e.g. data.dataset = 'fashion_mnist_halves')")
    start = time.perf_counter()
    n = min(gallery, len(test_set))
    ids = torch.randperm(len(test_set), generator=generator(seed, "retrieval"))[:n]
    f, g = (_batched(lambda x, t=t: model.encode(x, t), model, test_set.inputs(t)[ids],
                     batch_size, device, _default_dtype(model), progress) for t in (0, 1))
    f, g = comparable(f, similarity), comparable(g, similarity)
    details: dict = {"similarity": similarity, "gallery": n}
    for name, (q, r) in {"x_to_y": (f, g), "y_to_x": (g, f)}.items():
        ranks = retrieval_ranks(q, r)
        details[name] = {f"recall@{k}": float((ranks < k).double().mean()) for k in RETRIEVAL_KS}
    accuracy = (details["x_to_y"]["recall@1"] + details["y_to_x"]["recall@1"]) / 2
    return EvalResult(protocol="retrieval", accuracy=accuracy, num_labels=0, steps=0,
                      seconds=time.perf_counter() - start, num_test=n, details=details)
