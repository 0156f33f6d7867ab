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
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from dcco.config import USER, EvalConfig
from dcco.core.collapse import encoding_figures
from dcco.core.losses import cco_loss
from dcco.core.seeding import derive_seed
from dcco.core.stats import encoding_stats
from dcco.data.datasets import DataError
from dcco.data.image_views import looks_channels_last, looks_like_images
from dcco.data.samples import refuse_non_finite
from dcco.errors import ArgumentError, refusals_of
from dcco.flower import codec
from dcco.flower.error_reports import first_line
from dcco.flower.userapp import LABEL_KEYS, default_augment, load_weights, samples_and_labels
from dcco.flower.userwire import LAMBDA
from dcco.models import DualEncoder

KNN_K, KNN_TEMPERATURE = 20, EvalConfig().knn_temperature
"""The k-NN's neighbours and temperature: the monitor's temperature (``EvalConfig``), and
20 neighbours where the monitor takes 200 of a bank of 10,000: a node holds hundreds."""

Samples = Tensor | DataLoader | TorchDataset


def check_samples(x: Tensor, what: str, images: bool) -> None:
    """Refuse samples ``evaluate_encoder`` cannot score, naming them (``what``): NaN or an
    infinity, and, where the default views are made (``images``), samples that are not
    images (N, C, H, W) with 1 or 3 channels, channels-last ones named as such.

    Raises:
        DataError: naming ``what`` and what to change.
    """
    if not (x.is_floating_point() or x.dtype == torch.uint8):
        raise DataError(f"{what} are {x.dtype}; the encoder takes floating-point or uint8 "
                        f"samples")
    refuse_non_finite(x, what)
    if not images or looks_like_images(x):
        return
    shape = tuple(x.shape)
    if looks_channels_last(x):
        raise DataError(f"{what} are channels-last, {shape} (N, H, W, C); the default views "
                        f"take (N, C, H, W): pass x.permute(0, 3, 1, 2)")
    raise DataError(f"{what} have shape {shape}; the default views take images (N, C, H, W) "
                    f"with 1 or 3 channels of at least 8 × 8 pixels: pass "
                    f"augment=your_function (one view of a batch of samples)")


def evaluate_encoder(msg: Message, context: Context, model: nn.Module, test: Samples,
                     train: Samples | None = None, *,
                     augment: Callable[[Tensor], Tensor] | None = None,
                     views_key: int | None = None) -> Message:
    """The node's reply to one of the strategy's ``evaluate`` messages (module docstring).

    Parameters
    ----------
    msg : Message
        What your ``@app.evaluate()`` handler received.
    context : Context
        Its context (the node's id).
    model : nn.Module
        A fresh instance of the model the server trains; its weights come from the
        message. A ``dcco.dual_encoder`` is evaluated on its projections (not on its
        predictor's outputs, nor its target network's).
    test : Samples
        The node's held-out samples, as ``answer`` takes them (a tensor, a
        ``DataLoader`` or a ``Dataset``).
    train : Samples | None (default: None)
        The node's training samples, with labels, for ``knn-acc``; None, or samples
        without labels: no ``knn-acc``.
    augment : Callable[[Tensor], Tensor] | None (default: None)
        One view of a batch (as ``answer``'s); None: ``dcco.ImageViews()`` for
        images.
    views_key : int | None (default: None)
        Seeds the views (as ``answer``'s); None: the node's Flower id.

    Returns
    -------
    Message
        A reply whose ``MetricRecord`` holds ``cco-loss``, ``eff-rank``, ``dead-dims``,
        ``num-examples`` and, with labelled ``train`` and ``test``, ``knn-acc``.

    Raises
    ------
    dcco.ArgumentError
        A ``msg`` without the model's arrays; labels of another count
        than their samples.
    dcco.DataError
        Samples the encoder cannot be scored on, named by node and split: fewer
        than 2 test samples, a sample holding NaN or an infinity, samples that are not
        images (N, C, H, W) with 1 or 3 channels when ``augment`` is None (channels-last
        images are named as such), training samples of another shape than the test
        samples, or samples the model cannot read (its error follows).
    """
    with refusals_of("evaluate_encoder"):
        config = msg.content.config_records.get("config")
        arrays = next(iter(msg.content.array_records.values()), None)
        if arrays is None:
            raise ArgumentError("msg: an evaluate message without the model's arrays: "
                                "evaluate_encoder answers dcco.flower.DCCOStrategy's "
                                "configure_evaluate")
        load_weights(model, codec.tensors_of(arrays))
        node = f"node {context.node_id}"
        x, test_y = samples_and_labels(test)
        if x.shape[0] < 2:
            raise DataError(f"{node} holds {x.shape[0]} test sample(s); the loss and the collapse "
                            f"figures need at least 2")
        check_samples(x, f"{node}'s test samples", augment is None)
        train_x = train_y = None
        if train is not None and test_y is not None:
            train_x, train_y = samples_and_labels(train)
            check_samples(train_x, f"{node}'s training samples", augment is None)
            if train_x.shape[1:] != x.shape[1:]:
                raise DataError(f"{node}'s training samples are {tuple(train_x.shape[1:])} each "
                                f"and its test samples {tuple(x.shape[1:])}: the k-NN compares "
                                f"samples of one shape")
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
            try:
                f, g = encode(x1), encode(x2)
            except (RuntimeError, ValueError) as e:  # torch's own: a layer that cannot read them
                raise DataError(f"the model cannot read {node}'s test samples, "
                                f"{tuple(x1.shape)} {x1.dtype} as views: {first_line(e)}") from e
            metrics: dict[str, float] = {
                "cco-loss": float(cco_loss(encoding_stats(f, g).moments(), lambd)),
                "num-examples": int(x.shape[0]),
            }
            figures = encoding_figures(f, g)
            metrics |= {"eff-rank": float(figures["eff_rank"]),
                        "dead-dims": float(figures["dead_dims"])}
            if train_x is not None and train_y is not None:
                metrics["knn-acc"] = _knn_accuracy(encode, train_x, x, train_y, test_y, dtype)
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def _knn_accuracy(encode: Callable[[Tensor], Tensor], train_x: Tensor, test_x: Tensor,
                  train_y: Tensor, test_y: Tensor, dtype: torch.dtype) -> float:
    """The share of test samples whose weighted k-NN vote among the training samples'
    encodings (dcco's k-NN monitor's space and settings) gives their label."""
    from dcco.evaluate.knn import knn_predict

    bank, queries = encode(_as_views(train_x, dtype)), encode(_as_views(test_x, dtype))
    if bank.shape[0] != train_y.shape[0] or queries.shape[0] != test_y.shape[0]:
        raise ArgumentError(f"train, test: labels do not match the samples: {train_y.shape[0]} "
                            f"labels for {bank.shape[0]} training samples, {test_y.shape[0]} "
                            f"for {queries.shape[0]} test samples")
    classes = int(max(train_y.max(), test_y.max())) + 1
    predicted = knn_predict(bank.float(), train_y, queries.float(), classes, KNN_K,
                            KNN_TEMPERATURE)
    return float((predicted == test_y).double().mean())


def _as_views(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Samples in the range the encoder trained on: uint8 images as ``ImageViews`` makes
    their views, (x/255 − 0.5)/0.5; other samples as they are."""
    if x.dtype == torch.uint8:
        return (x.to(dtype) / 255.0 - 0.5) / 0.5
    return x.to(dtype)


def knn_evaluation(model: nn.Module, train: Samples | tuple[Tensor, Tensor],
                   test: Samples | tuple[Tensor, Tensor]
                   ) -> Callable[[int, ArrayRecord], MetricRecord]:
    """A server-side ``evaluate_fn`` for ``DCCOStrategy.start``, where the server holds a
    labelled set (a classifier's ``evaluate_fn`` scores classes an encoder has not got):
    ``knn-acc``, the k-NN accuracy of ``test``'s encodings against ``train``'s, by label,
    as ``evaluate_encoder`` measures it on a node, and ``num-examples``, for each round's
    model (round 0: the initial one, the baseline).

    >>> import torch
    >>> from flwr.app import ArrayRecord
    >>> _ = torch.manual_seed(0)
    >>> x, y = torch.randn(40, 6), torch.arange(40) % 2
    >>> x[:, 0] += 4 * y  # two clusters, told apart by their first coordinate
    >>> evaluate = knn_evaluation(torch.nn.Linear(6, 8), (x[:30], y[:30]), (x[30:], y[30:]))
    >>> dict(evaluate(0, ArrayRecord(torch.nn.Linear(6, 8).state_dict())))
    {'knn-acc': 1.0, 'num-examples': 10}

    Parameters
    ----------
    model : nn.Module
        A fresh instance of the model the server trains (its weights come from each
        round's arrays); a ``dcco.dual_encoder`` is scored on its projections.
    train, test : Samples | tuple[Tensor, Tensor]
        Labelled samples: a ``(samples, labels)`` pair, or a ``DataLoader`` or
        ``Dataset`` of them (as ``evaluate_encoder`` takes them).

    Raises
    ------
    DataError
        Samples without labels, NaN or an infinity, fewer than 2 test samples, or
        training and test samples of different shapes.
    """
    (train_x, train_y), (test_x, test_y) = (
        pair if isinstance(pair, tuple) else samples_and_labels(pair) for pair in (train, test))
    if train_y is None or test_y is None:
        raise DataError("knn_evaluation needs labelled samples, train and test: (samples, "
                        "labels) pairs, or loaders whose items carry a label")
    for x, what in ((train_x, "the server's training samples"),
                    (test_x, "the server's test samples")):
        check_samples(x, what, images=False)
    if test_x.shape[0] < 2 or train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(f"knn_evaluation needs at least 2 test samples of the training "
                        f"samples' shape: got {tuple(test_x.shape)} test and "
                        f"{tuple(train_x.shape)} training samples")
    encode = model.encode if isinstance(model, DualEncoder) else model
    dtype = next(model.parameters()).dtype

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        load_weights(model, codec.tensors_of(arrays))
        model.eval()
        with torch.no_grad():
            accuracy = _knn_accuracy(encode, train_x, test_x, train_y, test_y, dtype)
        return MetricRecord({"knn-acc": accuracy, "num-examples": int(test_x.shape[0])})

    return evaluate


__all__ = ["KNN_K", "KNN_TEMPERATURE", "LABEL_KEYS", "evaluate_encoder", "knn_evaluation",
           "samples_and_labels"]
