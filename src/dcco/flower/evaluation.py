"""What an ``@app.evaluate`` handler replies for an encoder: ``evaluate_encoder``.

FedAvg's quickstart scores a classifier: its accuracy on the node's test split. A DCCO model
is an encoder, whose outputs are not classes, so that accuracy stays at chance however well
it trains. What can be measured on a node instead:

- ``cco-loss``: the CCO loss (paper eq. 1, at the strategy's λ) of the encodings of two views
  of the node's held-out samples. The views are seeded by the node alone, the same in every
  round, so the loss of one round is comparable with the next;
- ``eff-rank`` and ``dead-dims``: the collapse figures (``dcco.core.collapse``) of those
  encodings, the node's own (the strategy's train metrics hold those of S_A);
- ``knn-acc`` (when the node has labels): the k-NN accuracy (Wu et al. 2018, as dcco's k-NN
  monitor) of the held-out samples' encodings against the node's training samples', by
  label: how well the encoder separates what the labels separate, without training anything.

The strategy averages each metric over the nodes, weighted by ``num-examples``, and logs it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from dcco.config import USER, EvalConfig
from dcco.core.collapse import encoding_figures
from dcco.core.losses import cco_loss
from dcco.core.seeding import derive_seed
from dcco.core.stats import encoding_stats
from dcco.flower import codec
from dcco.flower.userapp import LABEL_KEYS, default_augment, load_weights, samples_and_labels
from dcco.flower.userwire import LAMBDA
from dcco.models import DualEncoder

KNN_K, KNN_TEMPERATURE = 20, EvalConfig().knn_temperature
"""The k-NN's neighbours and temperature: the monitor's temperature (``EvalConfig``), and
20 neighbours where the monitor takes 200 of a bank of 10,000: a node holds hundreds."""

Samples = Tensor | DataLoader | TorchDataset


def evaluate_encoder(msg: Message, context: Context, model: nn.Module, test: Samples,
                     train: Samples | None = None, *,
                     augment: Callable[[Tensor], Tensor] | None = None,
                     views_key: int | None = None) -> Message:
    """The node's reply to one of the strategy's ``evaluate`` messages (module docstring).

    Args:
        msg, context: what your ``@app.evaluate()`` handler received.
        model: a fresh instance of the model the server trains; its weights come from the
            message. A ``dcco.dual_encoder`` is evaluated on its projections (not on its
            predictor's outputs, nor its target network's).
        test: the node's held-out samples, as ``answer`` takes them (a tensor, a
            ``DataLoader`` or a ``Dataset``).
        train: the node's training samples, with labels, for ``knn-acc``; None, or samples
            without labels: no ``knn-acc``.
        augment: one view of a batch (as ``answer``'s); None: ``dcco.ImageViews()`` for
            images.
        views_key: seeds the views (as ``answer``'s); None: the node's Flower id.

    Returns:
        A reply whose ``MetricRecord`` holds ``cco-loss``, ``eff-rank``, ``dead-dims``,
        ``num-examples`` and, with labelled ``train`` and ``test``, ``knn-acc``.

    Raises:
        ValueError: a message without the model's arrays, or test samples fewer than 2.
    """
    config = msg.content.config_records.get("config")
    arrays = next(iter(msg.content.array_records.values()), None)
    if arrays is None:
        raise ValueError("an evaluate message without the model's arrays: evaluate_encoder "
                         "answers dcco.flower.DCCOStrategy's configure_evaluate")
    load_weights(model, codec.tensors_of(arrays))
    x, test_y = samples_and_labels(test)
    if x.shape[0] < 2:
        raise ValueError(f"this node holds {x.shape[0]} test sample(s); the loss and the "
                         f"collapse figures need at least 2")
    lambd = float(config[LAMBDA]) if config is not None and LAMBDA in config else USER.lambd
    key = context.node_id if views_key is None else int(views_key)
    views = augment if augment is not None else default_augment(x)
    dtype = next(model.parameters()).dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(0, "evaluate-views", key) % (1 << 62))
        x1, x2 = views(x).to(dtype), views(x).to(dtype)
    model.eval()
    encode = model.encode if isinstance(model, DualEncoder) else model  # not its predictor's
    with torch.no_grad():
        f, g = encode(x1), encode(x2)
        metrics: dict[str, float] = {
            "cco-loss": float(cco_loss(encoding_stats(f, g).moments(), lambd)),
            "num-examples": int(x.shape[0]),
        }
        figures = encoding_figures(f, g)
        metrics |= {"eff-rank": float(figures["eff_rank"]),
                    "dead-dims": float(figures["dead_dims"])}
        if train is not None and test_y is not None:
            train_x, train_y = samples_and_labels(train)
            if train_y is not None:
                metrics["knn-acc"] = _knn_accuracy(encode, train_x, x, train_y, test_y, dtype)
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def _knn_accuracy(encode: Callable[[Tensor], Tensor], train_x: Tensor, test_x: Tensor,
                  train_y: Tensor, test_y: Tensor, dtype: torch.dtype) -> float:
    """The share of test samples whose weighted k-NN vote among the training samples'
    encodings (dcco's k-NN monitor's space and settings) gives their label."""
    from dcco.evaluate.knn import knn_predict

    bank, queries = encode(train_x.to(dtype)), encode(test_x.to(dtype))
    if bank.shape[0] != train_y.shape[0] or queries.shape[0] != test_y.shape[0]:
        raise ValueError(f"labels do not match the samples: {train_y.shape[0]} labels for "
                         f"{bank.shape[0]} training samples, {test_y.shape[0]} for "
                         f"{queries.shape[0]} test samples")
    classes = int(max(train_y.max(), test_y.max())) + 1
    predicted = knn_predict(bank.float(), train_y, queries.float(), classes, KNN_K,
                            KNN_TEMPERATURE)
    return float((predicted == test_y).double().mean())


__all__ = ["KNN_K", "KNN_TEMPERATURE", "LABEL_KEYS", "evaluate_encoder", "samples_and_labels"]
