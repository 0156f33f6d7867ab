"""Your ClientApp's side of the ``dcco.flower.DCCOStrategy`` strategy: ``answer`` turns a ``train``
message into the node's reply, for both exchanges of a round.

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return dcco.flower.answer(msg, context, MyEncoder(), my_samples, augment=my_augment)

Phase ``stats``: the node loads the global model, makes two views of its samples and replies
with its count and the method's sums of their encodings (``dcco.statistics``); it keeps the
model and the views in ``context.state`` for phase 2. Phase ``update``: it takes S_A and the
same two views (kept, or made again from the round's seed, which the server sends) and
replies with its update
(``dcco.local_update``: a delta per trained parameter, its count and its loss). A FedAvg
method's ``update`` message brings the model itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from dcco.config import LossConfig
from dcco.config.toml import from_dict
from dcco.core.aggregation import AGGREGATIONS, ldawa_update
from dcco.core.algorithm import Algorithm
from dcco.core.client import ClientUpdate
from dcco.core.client_state import kept_by_clients, restored, stored, with_kept
from dcco.core.seeding import derive_seed
from dcco.core.stats import Moments
from dcco.data.image_views import looks_channels_last
from dcco.data.samples import refuse_non_finite
from dcco.errors import ArgumentError, ModelInputError, refusals_of
from dcco.flower import codec, secagg
from dcco.flower.error_reports import first_line
from dcco.flower.forward_cache import KEPT_BYTES, ForwardCache
from dcco.flower.node_states import FolderStates
from dcco.flower.userwire import (
    AGGREGATION,
    LAMBDA,
    LOCAL_LR,
    LOSS,
    METHOD,
    PHASE,
    ROUND,
    STATES_KEY,
    TARGET_DECAY,
    VIEWS_SEED,
    moments_of,
)
from dcco.methods.base import Method
from dcco.methods.predictive import head_mismatch
from dcco.methods.registry import build_method
from dcco.models import DualEncoder
from dcco.models.dual_views import CHUNK, dual_view
from dcco.round_parts import (
    KeptForward,
    local_update,
    statistics,
    statistics_kept,
    update_from_kept,
)

KEPT_MODEL, KEPT_ROUND = "dcco.user-model", "dcco.user-round"
KEPT_VIEWS, KEPT_VIEWS_ROUND = "dcco.user-views", "dcco.user-views-round"
"""What a node keeps in ``context.state`` from phase ``stats`` to phase ``update``: the
round's model, and its two views (the same the round's seed would make again, without the
augmentation's cost)."""
FORWARDS = ForwardCache(KEPT_BYTES)
"""This process's kept phase-1 forwards (``dcco.flower.forward_cache``): each node's last,
by (node id, run id, round, views seed), for its phase 2 if it reaches the same process (an
in-process or single-worker simulation, a node process that answers both phases), at most
``KEPT_BYTES`` together, the oldest dropped first; set ``FORWARDS.max_bytes`` (0: none kept)
or ``FORWARDS.evict`` to change them."""


def answer(msg: Message, context: Context, model: nn.Module,
           samples: Tensor | DataLoader | TorchDataset,
           augment: Callable[[Tensor], Tensor] | None = None,
           views_key: int | None = None, reuse_forward: bool = True,
           state_dir: str | Path | None = None, chunk: int | None = CHUNK) -> Message:
    """The node's reply to one of the strategy's ``train`` messages: your ClientApp's train
    handler returns it (``InProcessGrid`` runs the nodes in this process here, as ``flwr run``
    would on SuperNodes; ``DCCOStrategy``'s example runs a longer one):

    >>> import torch
    >>> from flwr.app import ArrayRecord
    >>> from flwr.clientapp import ClientApp
    >>> from dcco.flower import DCCOStrategy, answer
    >>> from dcco.flower.testing.inprocess import InProcessGrid
    >>> app = ClientApp()
    >>> @app.train()
    ... def train(msg, context):                 # your model, this node's samples
    ...     x = torch.randn(8, 6, generator=torch.Generator().manual_seed(context.node_id))
    ...     return answer(msg, context, torch.nn.Linear(6, 8), x, views_key=context.node_id,
    ...                   augment=lambda v: v + 0.1 * torch.randn_like(v))
    >>> nodes = InProcessGrid(app, [{}, {}, {}], {})
    >>> result = DCCOStrategy(fraction_evaluate=0.0).start(
    ...     nodes, ArrayRecord(torch.nn.Linear(6, 8).state_dict()), num_rounds=1)
    >>> result.train_metrics_clientapp[1]["num-examples"]
    24

    Under SecAgg+ (``DCCOStrategy(secagg=SecAgg(...))``) the handler needs
    ``mods=[dcco.flower.secure_aggregation_mod]``; the reply is then the masked form.

    Parameters
    ----------
    msg : Message
        What your ``@app.train()`` handler received.
    context : Context
        Its context (the node's id and state).
    model : nn.Module
        A fresh instance of the model the server trains (your encoder, or a
        ``dcco.dual_encoder``); its weights come from the message.
    samples : Tensor | DataLoader | TorchDataset
        This node's samples: a tensor (n, ...), one row each, or the
        ``DataLoader`` or ``Dataset`` your FedAvg handler trained on (``node_samples``
        takes its inputs, the labels left out).
    augment : Callable[[Tensor], Tensor] | None (default: None)
        One view of a batch of samples (called twice, for the two views, with
        torch's random state seeded by the round); None: for images (N, C, H, W),
        ``dcco.ImageViews()``; other samples need yours (two identical views teach the
        encoder nothing, so they are refused).
    views_key : int | None (default: None)
        What seeds this node's views, with the round's seed (the strategy's
        ``seed``). None: the node's Flower id, which a deployment keeps but Flower's
        simulation draws at random in every run, so no two simulated runs train on the
        same views. Your partition id (``context.node_config["partition-id"]``) makes a
        simulated run repeat (at the same CPU and thread count).
    reuse_forward : bool (default: True)
        Keep phase ``stats``' forward, with its graph, in this process's
        memory until phase ``update``, which is then a backward pass alone (the same
        update to the bit); it holds both views' activations between the phases (303
        MiB for the quickstart's 1,600 images of 32 × 32: ``benchmarks/quickstart_speed.py``
        measures them; at most ``KEPT_BYTES``, 1 GiB, in a process). False, phase
        ``update`` answered by another process, or a forward over that bound: the views
        are encoded again.
    state_dir : str | Path | None (default: None)
        For FedU, FedEMA and MoCo, a folder on this node's disk that keeps its
        state between rounds (``dcco.flower.node_states``: under the run's key, which a
        resumed run keeps, the state of the last round it trained and of the one before,
        a file each), so that a run the strategy resumes from its ``checkpoint`` gives
        the node the state it had there. The folder is this node's alone and the same in
        every run: name it by something the node keeps, such as its
        ``context.node_config["partition-id"]``, not its Flower node id, which Flower's
        simulation draws anew in every run. None: in ``context.state``, which lasts one
        Flower run. Other methods keep no state.
    chunk : int | None (default: 256)
        The model forwards and backpropagates the node's samples in chunks of this
        many (default ``CHUNK``, 256), faster on a CPU than one batch (each chunk's
        activations stay cache-sized) and the same update to float rounding, since the
        loss's gradient in each sample's encodings depends only on the round's S_A.
        A model holding batch norm goes in one batch whatever ``chunk`` says (its
        statistics are of the whole batch). None: one batch, for a model with another
        layer that mixes the samples of a batch. FedU's, FedEMA's and MoCo's steps go
        in one batch.

    Raises
    ------
    dcco.ArgumentError
        A ``msg`` without the strategy's config, a phase ``update``
        whose model this node did not receive in phase ``stats``, a ``model`` without
        the head the method trains or with weights the server's lack, ``samples`` of
        no kind it reads, or (SecAgg+) more of them than the strategy's
        ``SecAgg.max_samples``; ``augment=None`` for samples that are not images.
    dcco.DataError
        A sample holding NaN or an infinity (named: which of the node's
        samples, and the value). Each is a ``dcco.UserError`` (a ``ValueError``) whose
        message starts "answer: " and names the argument; Flower reports it to the
        server, which counts the node as failed.

    """
    with refusals_of("answer"):
        ask = _asked(msg.content, model)
        _check_head(ask.method, model)
        _check_secure_limit(ask, samples)
        weights = _round_model(ask, context)
        # FedU's, FedEMA's and MoCo's clients are not sent the target network they keep
        load_weights(model, with_kept(model, weights, kept_by_clients(model, ask.method)))
        x1, x2 = _round_views(ask, context, samples, augment, views_key, model)
        if ask.phase == "stats":
            return _statistics_reply(msg, context, ask, model, x1, x2, reuse_forward, chunk)
        update = _node_update(ask, context, model, x1, x2, chunk, state_dir)
        if ask.aggregation == "ldawa":  # the server's rule, on the model this node was sent
            update = ldawa_update(update, weights)
        _forget_round(context)
        return _update_reply(msg, ask, model, x1, x2, update)


def _check_secure_limit(ask: _Asked, samples: Tensor | DataLoader | TorchDataset) -> None:
    """Under SecAgg+, a node over ``max_weight`` samples refuses: its masked sums would
    overflow."""
    if ask.secure is not None and (held := _count(samples)) > ask.secure.max_weight:
        raise ArgumentError(f"samples: this node holds {held}, more than the "
                         f"strategy's SecAgg.max_samples = {ask.secure.max_weight:g}; raise it")


def _round_model(ask: _Asked, context: Context) -> dict[str, Tensor]:
    """The round's global weights: the message's (kept in ``context.state`` by phase
    ``stats`` for its phase ``update``), or phase ``stats``' kept ones."""
    if ask.model is not None:
        if ask.phase == "stats":
            context.state[KEPT_MODEL] = codec.array_record(ask.model)
            context.state[KEPT_ROUND] = ConfigRecord({"round": ask.round})
        return ask.model
    if ask.phase == "stats":
        raise ArgumentError(f"msg: phase 'stats' of round {ask.round} carries no model (its "
                            f"'arrays' record)")
    kept = context.state.config_records.get(KEPT_ROUND)
    if kept is None or int(kept["round"]) != ask.round:
        raise ArgumentError(f"msg: phase 'update' of round {ask.round} needs the model of its "
                            f"phase "
                         f"'stats', but this node holds "
                         f"{'none' if kept is None else 'round ' + str(kept['round'])}")
    return codec.tensors_of(context.state.array_records[KEPT_MODEL])


def _round_views(ask: _Asked, context: Context, samples: Tensor | DataLoader | TorchDataset,
                 augment: Callable[[Tensor], Tensor] | None, views_key: int | None,
                 model: nn.Module) -> tuple[Tensor, Tensor]:
    """The round's two views: phase ``stats``' kept ones in phase ``update``, else made
    from the node's samples (read once a round; a data loader's, one pass) and the round's
    seed; phase ``stats`` keeps them."""
    kept = context.state.config_records.get(KEPT_VIEWS_ROUND)
    if (ask.phase == "update" and kept is not None and int(kept["round"]) == ask.round
            and int(kept["seed"]) == ask.seed):
        views = codec.tensors_of(context.state.array_records[KEPT_VIEWS])
        return views["x1"], views["x2"]
    samples = node_samples(samples)
    refuse_non_finite(samples, f"node {context.node_id}'s samples")
    x1, x2 = _views(samples, augment if augment is not None else default_augment(samples),
                    ask.seed, context.node_id if views_key is None else int(views_key),
                    next(model.parameters()).dtype)
    if ask.phase == "stats":
        context.state[KEPT_VIEWS] = codec.array_record({"x1": x1, "x2": x2})
        context.state[KEPT_VIEWS_ROUND] = ConfigRecord({"round": ask.round, "seed": ask.seed})
    return x1, x2


def _statistics_reply(msg: Message, context: Context, ask: _Asked, model: nn.Module,
                      x1: Tensor, x2: Tensor, reuse_forward: bool,
                      chunk: int | None) -> Message:
    """Phase ``stats``: the node's count and sums (masked under SecAgg+), its forward kept
    in ``FORWARDS`` for phase ``update`` when ``reuse_forward``."""
    with _model_reads(x1, context.node_id):
        if reuse_forward:
            stats, kept = statistics_kept(model, x1, x2, ask.method, chunk)
            FORWARDS.put(_forward_key(context, ask.round, ask.seed), kept, x1, x2)
        else:
            stats = statistics(model, x1, x2, ask.method, chunk)
    if ask.secure is not None:
        return Message(secagg.secure_stats_reply(stats, ask.secure, ask.method.stats),
                       reply_to=msg)
    sums = {k: v for k, v in stats.items() if k != "count"}
    return Message(RecordDict({"statistics": codec.array_record(sums),
                               "metrics": MetricRecord({"num-examples": int(stats.count)})}),
                   reply_to=msg)


def _node_update(ask: _Asked, context: Context, model: nn.Module, x1: Tensor, x2: Tensor,
                 chunk: int | None, state_dir: str | Path | None) -> ClientUpdate:
    """Phase ``update``: the node's local step, from its kept state (FedU, FedEMA, MoCo),
    from phase ``stats``' kept forward (a backward alone), or from a new forward."""
    kept = _kept_forward(FORWARDS.pop(_forward_key(context, ask.round, ask.seed)), model, x1,
                         x2, chunk)
    with _model_reads(x1, context.node_id):
        if ask.method.stateful:
            return _stateful_update(model, x1, x2, context, ask, state_dir)
        if kept is not None:
            return update_from_kept(kept, ask.shared, ask.method, lr=ask.lr)
        return local_update(model, x1, x2, ask.shared, ask.method, lr=ask.lr, chunk=chunk)


def _forget_round(context: Context) -> None:
    """The round is answered: nothing of it is kept in ``context.state``."""
    for key in (KEPT_MODEL, KEPT_VIEWS):
        context.state.array_records.pop(key, None)
    for key in (KEPT_ROUND, KEPT_VIEWS_ROUND):
        context.state.config_records.pop(key, None)


def _update_reply(msg: Message, ask: _Asked, model: nn.Module, x1: Tensor, x2: Tensor,
                  update: ClientUpdate) -> Message:
    """Phase ``update``'s reply: the node's delta, count and loss (masked, positional, under
    SecAgg+), with batch norm's running statistics after its step to be averaged."""
    if ask.secure is not None:  # positional: the trained arrays in the model's own order
        ordered = {k: update.delta[k] for k in model.state_dict() if k in update.delta}
        return Message(secagg.secure_update_reply(replace(update, delta=ordered), ask.secure),
                       reply_to=msg)
    if not ask.method.stateful:  # a stateful client's step left its own running statistics
        _forward_for_buffers(model, x1, x2)
    reply = {"arrays": codec.array_record(update.delta),
             "metrics": MetricRecord({"num-examples": update.num_samples,
                                      "loss": float(update.loss)})}
    buffers = {k: v for k, v in model.state_dict().items()
               if v.is_floating_point() and k not in dict(model.named_parameters())}
    if buffers:
        reply["buffers"] = codec.array_record(buffers)
    return Message(RecordDict(reply), reply_to=msg)


def _forward_key(context: Context, r: int, seed: int) -> tuple[int, int, int, int]:
    return int(context.node_id), int(context.run_id), r, seed


def _kept_forward(entry: tuple[KeptForward, Tensor, Tensor] | None, model: nn.Module,
                  x1: Tensor, x2: Tensor, chunk: int | None) -> KeptForward | None:
    """Phase 1's kept forward if it was made from this model's weights and these views
    (another run in the same process may have left one under the same key), else None."""
    if entry is None:
        return None
    kept, k1, k2 = entry
    weights = dict(kept.dual.named_parameters())
    same = (k1.shape == x1.shape and k2.shape == x2.shape and torch.equal(k1, x1)
            and torch.equal(k2, x2) and all(
                name in weights and torch.equal(weights[name], p)
                for name, p in dual_view(model, chunk)[0].named_parameters()))
    return kept if same else None


@dataclass(frozen=True)
class _Asked:
    """One message of the strategy, read: plain, or in SecAgg+'s layout (``secure``: its
    ranges)."""

    phase: str
    round: int
    method: Method
    lr: float
    seed: int
    model: dict[str, Tensor] | None
    shared: Moments | None
    secure: secagg.SecureParams | None
    decay: float = 0.0
    """The round's τ for a client's own target network (FedU, FedEMA, MoCo)."""
    states_key: str = ""
    """The run's key for the node's state on its own disk."""
    aggregation: str = "fedavg"
    """The server's rule for combining updates ("ldawa": the node scales its own)."""


def _asked(content: RecordDict, model: nn.Module) -> _Asked:
    secure = secagg.is_secure(content)
    config = (content.config_records[secagg.FIT_CONFIG] if secure
              else content.config_records.get("config"))
    keys = ("phase", "round") if secure else (PHASE, ROUND)
    missing = [k for k in (*keys, METHOD, VIEWS_SEED) if config is None or k not in config]
    if missing:
        raise ArgumentError(f"msg: not a message of dcco.flower.DCCOStrategy (its config record "
                         f"lacks {', '.join(missing)})")
    loss = LossConfig(lambd=float(config.get(LAMBDA, LossConfig().lambd)))
    if LOSS in config:  # the method's other settings, which the strategy was given
        loss = from_dict(LossConfig, json.loads(str(config[LOSS])), "loss")
    method = build_method(str(config[METHOD]), loss)
    aggregation = str(config.get(AGGREGATION, "fedavg"))
    if aggregation not in AGGREGATIONS:
        raise ArgumentError(f"msg: the strategy asks for aggregation {aggregation!r}, which this "
                         f"node's dcco does not know (it knows {', '.join(AGGREGATIONS)})")
    head = (str(config[keys[0]]), int(config[keys[1]]), method,
            float(config.get(LOCAL_LR, 1.0)), int(config[VIEWS_SEED]))
    if secure:
        ins, params = secagg.decode_secure_instruction(content, list(model.state_dict()),
                                                       method.stats)
        return _Asked(*head, ins.model, ins.shared, params,
                      float(config.get(TARGET_DECAY, 0.0)), str(config.get(STATES_KEY, "")),
                      aggregation)
    arrays = content.array_records
    return _Asked(*head, codec.tensors_of(arrays["arrays"]) if "arrays" in arrays else None,
                  moments_of(arrays["statistics"]) if "statistics" in arrays else None, None,
                  float(config.get(TARGET_DECAY, 0.0)), str(config.get(STATES_KEY, "")),
                  aggregation)


def _check_head(method: Method, model: nn.Module) -> None:
    """A node's model holds what a predictive method trains with, and no head another
    method's would be (its loss would read predictions or targets that nothing trains)."""
    wrong = head_mismatch(method, getattr(model, "predictor", None) is not None,
                          getattr(model, "target", None) is not None)
    if wrong is not None:
        what, needed = wrong
        raise ArgumentError(f"model: {'has no' if needed else 'holds a'} {what}, "
                         f"which {method.name} {'trains with' if needed else 'has not'}: "
                         f"build it with dcco.dual_encoder(encoder, projector, "
                         f"method={method.name!r})")


CLIENT_STATE = "dcco.user-client-state"
"""A FedU, FedEMA or MoCo node's own state in ``context.state`` (its online network,
predictor and target network, or its queue), kept from one round it takes part in to the
next as the simulator's store holds it (``stored``: float32 tensors in the model's dtype,
a method's float64 scalars as they are)."""


def _stateful_update(model: nn.Module, x1: Tensor, x2: Tensor, context: Context,
                     ask: _Asked, state_dir: str | Path | None) -> ClientUpdate:
    """The node's round as one client that keeps state (``Algorithm.stateful_updates``, the
    simulator's): from what it kept (a node never seen starts from the global model), its
    new state kept in ``context.state``, or in ``state_dir`` (the strategy checkpoints after
    every round)."""
    probe = next(iter(model.parameters()))
    if state_dir is not None:
        # the strategy's rounds count from 1, a folder's from 0
        folder = FolderStates(Path(state_dir), ask.states_key, ask.round - 1, 1, probe.dtype)
        return Algorithm(ask.method, local_lr=ask.lr).stateful_updates(
            model, [(0, x1, x2)], lambda k: folder.get(k, probe.device, probe.dtype),
            folder.put, ask.decay, ask.round - 1)[0]

    def load(_: int) -> dict[str, Tensor] | None:
        record = context.state.array_records.get(CLIENT_STATE)
        return None if record is None else restored(codec.tensors_of(record), probe.dtype,
                                                     probe.device, probe.dtype)

    def save(_: int, new: dict[str, Tensor]) -> None:
        context.state[CLIENT_STATE] = codec.array_record(stored(new, probe.dtype))

    return Algorithm(ask.method, local_lr=ask.lr).stateful_updates(
        model, [(0, x1, x2)], load, save, ask.decay, ask.round - 1)[0]


INPUT_KEYS = ("img", "image", "images", "pixel_values", "x", "input", "inputs")
"""The keys a data loader's dict batches hold their inputs under, tried in this order."""


def node_samples(samples: Tensor | DataLoader | TorchDataset) -> Tensor:
    """A node's samples as one tensor (n, ...): a tensor as it is; a ``DataLoader`` or a
    ``Dataset`` (PyTorch's, or a Hugging Face one with a torch format) read item by item,
    each item's input taken (a tuple's or list's first element, a dict's entry under one of
    ``INPUT_KEYS``, or its only tensor), the labels left out.

    Raises:
        TypeError: samples of another kind, or items whose input cannot be told.
    """
    if isinstance(samples, Tensor):
        return samples
    items, join = _items(samples)
    return join([_input_of(item) for item in items])


def samples_and_labels(samples: Tensor | DataLoader | TorchDataset
                       ) -> tuple[Tensor, Tensor | None]:
    """A node's samples as ``node_samples`` reads them, and their labels as one int64
    tensor read in the same pass (a shuffling loader's order is new every pass): a tuple's
    second element, or a dict's entry under one of ``LABEL_KEYS``. The labels are None when
    the samples carry none (a tensor, or items without labels)."""
    if isinstance(samples, Tensor):
        return samples, None
    items, join = _items(samples)
    x = join([_input_of(item) for item in items])
    labels = [_label_of(item) for item in items]
    if any(y is None for y in labels):
        return x, None
    return x, torch.cat([torch.as_tensor(y).reshape(-1) for y in labels]).long()


LABEL_KEYS = ("label", "labels", "fine_label", "y", "target", "targets")
"""The keys a data loader's dict batches hold their labels under, tried in this order."""


def _items(samples: DataLoader | TorchDataset) -> tuple[list, Callable[[list], Tensor]]:
    """A loader's batches (joined by ``torch.cat``) or a data set's items (by
    ``torch.stack``), read once.

    Raises:
        ValueError: an empty data set.
        TypeError: samples of another kind.
    """
    if isinstance(samples, DataLoader):
        items, join = list(samples), torch.cat
    elif hasattr(samples, "__getitem__") and hasattr(samples, "__len__"):
        items, join = [samples[i] for i in range(len(samples))], torch.stack
    else:
        raise ArgumentError(f"samples must be a tensor, a torch DataLoader or a Dataset, got "
                        f"{type(samples).__name__}")
    if not items:
        raise ArgumentError("samples: this node's data set is empty; a node needs samples")
    return items, join


def _label_of(item: object) -> object | None:
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[1]
    if isinstance(item, dict):
        return next((item[k] for k in LABEL_KEYS if k in item), None)
    return None


def _count(samples: Tensor | DataLoader | TorchDataset) -> int:
    """How many samples a node holds, without reading them."""
    if isinstance(samples, Tensor):
        return int(samples.shape[0])
    if isinstance(samples, DataLoader):
        return len(samples.dataset)
    return len(samples)


def _input_of(item: object) -> Tensor:
    """An item's (or a batch's) input: see ``node_samples``."""
    if isinstance(item, Tensor):
        return item
    if isinstance(item, (tuple, list)) and item:
        return _input_of(item[0])
    if isinstance(item, dict):
        for key in INPUT_KEYS:
            if key in item:
                return _input_of(item[key])
        tensors = [v for v in item.values() if isinstance(v, Tensor)
                   and v.is_floating_point()]
        if len(tensors) == 1:
            return tensors[0]
        raise ArgumentError(f"samples: a data item of keys {sorted(item)}: its input is not "
                            f"under one of "
                        f"{', '.join(INPUT_KEYS)}; pass the input tensor as samples")
    if hasattr(item, "__array__"):  # a numpy array or a PIL image
        import numpy as np

        return torch.from_numpy(np.asarray(item))
    raise ArgumentError(f"samples: a data item of type {type(item).__name__} has no tensor "
                        f"input; pass "
                    f"the input tensor as samples")


def default_augment(samples: Tensor) -> Callable[[Tensor], Tensor]:
    """``ImageViews()`` for image samples (N, C, H, W); for any other samples, refused."""
    from dcco.data.image_views import ImageViews, looks_like_images

    if looks_like_images(samples):
        return ImageViews()
    if looks_channels_last(samples):
        raise ArgumentError(f"augment=None with channels-last images "
                         f"{tuple(samples.shape)} (N, H, W, C); dcco's views take (N, C, H, W): "
                         f"pass x.permute(0, 3, 1, 2)")
    raise ArgumentError(f"augment=None with samples of shape {tuple(samples.shape)} "
                     f"({samples.dtype}): the two views would be identical, and identical "
                     f"views teach the encoder nothing; pass augment=your_function (one view "
                     f"of a batch of samples)")


@contextmanager
def _model_reads(views: Tensor, node: int) -> Iterator[None]:
    """Where the model encodes the views: an error of the model's own (torch's ``RuntimeError``,
    or ``statistics``' ``ModelInputError`` around it) names the samples and the model's
    error, with the fix when the views look channels-last (N, H, W, C); any other error is
    left as it is."""
    try:
        yield
    except RuntimeError as e:
        channels_last = looks_channels_last(views)
        if isinstance(e, ModelInputError) and e.__cause__ is not None:
            e = e.__cause__  # the model's own error, which statistics named
        elif not channels_last:
            raise
        fix = (", which look channels-last (N, H, W, C): pass x.permute(0, 3, 1, 2) as "
               "samples" if channels_last else "")
        raise ArgumentError(f"samples: node {node}'s model cannot read its views "
                            f"{tuple(views.shape)}{fix} (the model's error: {first_line(e)})"
                            ) from e


def _forward_for_buffers(model: nn.Module, x1: Tensor, x2: Tensor) -> None:
    """One training-mode forward of the round's views without gradients, for the running
    statistics a local step would leave (``dcco.local_update`` leaves the model as it was)."""
    if not any(True for _ in model.buffers()):
        return
    with torch.no_grad():
        if isinstance(model, DualEncoder):
            model(x1, x2)
        else:
            model(x1)
            model(x2)


def load_weights(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """The server's weights into ``model``, each in the model's own dtype."""
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    if missing:
        raise ArgumentError(f"model: the server's model lacks its {missing[0]}; do "
                         f"server and nodes build one model?")
    model.load_state_dict({k: weights[k].to(own[k].dtype) for k in own})


def _views(samples: Tensor, augment: Callable[[Tensor], Tensor], seed: int, node: int,
           dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The round's two views of this node's samples: the same in both phases of a round."""
    from dcco.run.views import user_views

    return user_views(augment, samples, derive_seed(seed, "node", node), 0, dtype)


__all__ = ["LABEL_KEYS", "answer", "default_augment", "node_samples", "samples_and_labels"]
