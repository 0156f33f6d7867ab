"""Evaluation settings: section ``[eval]`` (``dcco.evaluate`` runs the protocols)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

KnnFeatures = Literal["standardized", "centered", "raw"]
KNN_FEATURES: tuple[str, ...] = ("standardized", "centered", "raw")
"""How the k-NN monitor maps features before the cosine (``dcco.evaluate.knn.knn_space``).

``standardized`` is the default, chosen by measurement (``experiments/monitor_check.py`` over
37 encoders of committed cells, docs/results/knn-monitor.md). Pretrained features
share one dominant direction (mean pairwise cosine 0.82–1.00, most above 0.99), so the raw
cosine (``raw``, Wu et al.'s and this monitor's before) is decided by small differences on
top of it: its rank correlation with the 5,000-label probe is 0.84, and it read encoders of
64–74 % probes at 35–45 %. Centring and standardising by the bank's moments both fix most of
it: Spearman 0.945 (centred) and 0.928 (standardised), a difference the measurement cannot
tell apart (bootstrap 95 % interval of standardised − centred: [−0.08, +0.03]). They differ
in what else they get right: the standardised monitor reads the probe's level (4.6 points
below it on average, 3 of 37 encoders more than 10 below) where the centred one does not
(9.6 points, 16 of 37 more than 10 below), and it shares the probe's invariance to the scale
of each dimension (the probe standardises its features too), so a few loud, uninformative
dimensions cannot decide it, as they decide the centred one (``tests/test_evaluate.py``).
``raw`` reproduces records written before the monitor named its space (``knn_features``
missing: ``raw``)."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings (section ``[eval]``); defaults are the paper's CIFAR-100 protocols
    with 5,000 labels (appendix B). ``for_labels(500)`` gives the 500-label probe."""

    labels: int = 5000
    """Labelled training samples, class-balanced."""
    probe_steps: int = 1000
    """Linear probe: LARS steps (paper: 1000 for 5K labels, 400 for 500)."""
    probe_batch: int = 512
    """Linear probe batch (paper: 512 for 5K labels, 128 for 500)."""
    probe_lr: float = 2.0
    """Linear probe initial learning rate, cosine-decayed (paper: 2.0 for 5K, 2.5 for 500)."""
    probe_momentum: float = 0.9
    """Linear probe: LARS momentum."""
    finetune_steps: int = 100
    """Full finetuning: Adam steps (paper: 100)."""
    finetune_batch: int = 256
    """Full finetuning: batch size."""
    finetune_lr: float = 5e-3
    """Full finetuning: Adam learning rate."""
    scratch_epochs: int = 100
    """Supervised from scratch: epochs over the labelled subset (paper: 100)."""
    scratch_batch: int = 256
    """Supervised from scratch: batch size."""
    scratch_lr: float = 0.01
    """Supervised from scratch: learning rate."""
    knn_k: int = 200
    """Neighbours voting in the k-NN monitor (Wu et al. 2018 use 200)."""
    knn_temperature: float = 0.1
    """τ in the vote weight exp(cos / τ)."""
    knn_bank: int | None = 10000
    """Training images in the k-NN bank; None: all."""
    knn_queries: int | None = 2000
    """Test images the k-NN monitor classifies; None: all."""
    knn_features: KnnFeatures = "standardized"
    """The space the k-NN monitor compares features in (``KNN_FEATURES``); ``raw`` is the
    monitor of records that do not name theirs."""
    feature_batch: int = 1024
    """Images per forward pass when computing features or test predictions."""

    def __post_init__(self) -> None:
        for name in ("labels", "probe_steps", "probe_batch", "finetune_steps", "finetune_batch",
                     "scratch_epochs", "scratch_batch", "knn_k", "feature_batch"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"eval.{name} must be an integer >= 1, got {value!r}")
        for name in ("probe_lr", "finetune_lr", "scratch_lr", "knn_temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"eval.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.probe_momentum < 1:
            raise ValueError(f"eval.probe_momentum must be in [0, 1), got {self.probe_momentum!r}")
        if self.knn_features not in KNN_FEATURES:
            raise ValueError(f"eval.knn_features must be one of {', '.join(KNN_FEATURES)}, "
                             f"got {self.knn_features!r}")
        for name in ("knn_bank", "knn_queries"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"eval.{name} must be an integer >= 1 or none, got {value!r}")

    @classmethod
    def for_labels(cls, labels: int, base: EvalConfig | None = None) -> EvalConfig:
        """``base`` (default: the paper's settings) with ``labels`` labelled samples.

        The paper gives probe settings for two label counts: 5,000 (the defaults) and 500
        (400 steps, batch 128, lr 2.5). Exactly 500 labels takes the latter; every other count
        keeps ``base``'s probe settings.
        """
        base = base or cls()
        if labels == 500:
            return replace(base, labels=500, probe_steps=400, probe_batch=128, probe_lr=2.5)
        return replace(base, labels=labels)
