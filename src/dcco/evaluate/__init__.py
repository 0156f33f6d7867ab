"""Evaluation protocols of the paper (§4, appendix B); the projector is discarded in all of them.

- linear probe (``probe``): the encoder frozen, a linear classifier trained with LARS on its
  features, which are computed once and cached (no augmentation, so every step would
  recompute them);
- full finetuning and supervised from scratch (``finetune``): a copy of the backbone (or the
  same backbone freshly initialised) plus a linear head trained with Adam, flips only;
- case-level probe and finetuning (``cases``): the image encodings of a case average-pooled
  before the linear classifier, scored per case (the paper's DERM protocol, §4 "Networks");
- k-NN monitor (``knn``): weighted k-NN in the bank's standardised feature space, cheap
  enough to run during pretraining;
- cross-modal retrieval (``retrieval``) between the two towers of paired data.

Every classifier trains on a labelled subset of the training split (``labelled_subset``:
class-balanced images; cases for the case protocols) and reports top-1 accuracy on the full
test split. Nothing here prints or touches the disk; results are ``EvalResult`` values that
the caller records. Settings and results live in ``settings``, shared pieces in ``features``.
"""

from dcco.config.eval_config import KNN_FEATURES, KnnFeatures
from dcco.evaluate.cases import (
    case_features,
    case_labels,
    finetune_cases,
    labelled_cases,
    linear_probe_cases,
)
from dcco.evaluate.features import StepCallback, extract_features, labelled_subset
from dcco.evaluate.finetune import Classifier, finetune, supervised_from_scratch
from dcco.evaluate.knn import knn_accuracy, knn_description, knn_predict, knn_space
from dcco.evaluate.probe import linear_probe, linear_probe_features, train_linear_classifier
from dcco.evaluate.retrieval import RETRIEVAL_KS, Similarity, comparable, retrieval, retrieval_ranks
from dcco.evaluate.settings import PROTOCOL_REVISION, EvalResult, is_current

__all__ = [
    "KNN_FEATURES",
    "PROTOCOL_REVISION",
    "RETRIEVAL_KS",
    "Classifier",
    "EvalResult",
    "KnnFeatures",
    "Similarity",
    "StepCallback",
    "case_features",
    "case_labels",
    "comparable",
    "extract_features",
    "finetune",
    "finetune_cases",
    "is_current",
    "knn_accuracy",
    "knn_description",
    "knn_predict",
    "knn_space",
    "labelled_cases",
    "labelled_subset",
    "linear_probe",
    "linear_probe_cases",
    "linear_probe_features",
    "retrieval",
    "retrieval_ranks",
    "supervised_from_scratch",
    "train_linear_classifier",
]
