"""Evaluation settings (section ``[eval]``), results and protocol revisions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation (recorded as JSON in a run's summary)."""

    protocol: str
    """``linear``, ``linear_y``, ``finetune``, ``supervised``, ``case_linear``, ``retrieval``
    or ``knn``."""
    accuracy: float
    """Top-1 accuracy on the full test split, in [0, 1]."""
    num_labels: int
    """Labelled training samples (cases, for the case-level probe)."""
    steps: int
    """Optimiser steps taken."""
    seconds: float
    """Wall-clock time of the whole protocol, feature extraction and testing included."""
    num_test: int
    """Test samples (cases) scored."""
    train_accuracy: float | None = None
    """Top-1 accuracy on the labelled training samples, in [0, 1]: linear probes only, where
    the features are at hand (elsewhere it would cost another pass over the images)."""
    revision: int = 0
    """The protocol's revision (``PROTOCOL_REVISION``); 0 fills in the current one."""
    details: dict | None = None
    """What a protocol measures besides its headline accuracy (retrieval: recall@1 and @5 in
    both directions, and the similarity used)."""

    def __post_init__(self) -> None:
        if self.revision == 0:
            object.__setattr__(self, "revision", PROTOCOL_REVISION.get(self.protocol, 1))


PROTOCOL_REVISION = {"linear": 1, "linear_y": 1, "case_linear": 1, "finetune": 2,
                     "supervised": 2, "retrieval": 1, "knn": 1, "case_finetune": 1}
"""Bumped whenever a protocol changes what its accuracy means, and recorded with each result,
so that harnesses re-run evaluations recorded under an older revision. Revision 2 of finetune
and supervised: the head reads batch-normalised features (``Classifier``); revision 1 (results
without a ``revision`` field) fed raw features to the head, which broke finetuning of encoders
with large features."""


def is_current(entry: dict) -> bool:
    """Whether a recorded evaluation (a summary's ``evaluations`` entry) was made under its
    protocol's current revision."""
    return entry.get("revision", 1) == PROTOCOL_REVISION.get(entry.get("protocol", ""), 1)
