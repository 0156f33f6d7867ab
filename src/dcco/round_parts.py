"""A round's parts over a user's own model, framework-free: phase 1 and phase 2 on a client
(``statistics``, ``local_update``, and the kept-forward pair), the server's merge, aggregate
and step (``merge_statistics``, ``aggregate_updates``, ``apply_update``), a method with loss
settings of one's own and the server optimiser. ``dcco.api`` re-exports them for users; dcco's
own Flower app and ``dcco.flower.answer`` import them from here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dcco.config import USER, LossConfig
from dcco.core.client import ClientUpdate, client_update, sgd_delta, trainable_parameters
from dcco.core.optim import apply_pseudo_gradient
from dcco.core.server import (
    ReplyError,
    ReplyTally,
    accept_valid,
    pooled_update,
    validate_statistics,
    validate_update,
)
from dcco.core.stats import EncodingStats, Moments, encoding_stats, merge
from dcco.errors import ArgumentError, MissingNameError, ModelInputError, arguments_of
from dcco.methods.base import Method
from dcco.methods.registry import METHODS, build_method
from dcco.models import DualEncoder
from dcco.models.dual import buffers_kept
from dcco.models.dual_views import dual_view

Model = nn.Module
"""A ``DualEncoder`` or a plain encoder module shared by both views."""


def _encodings_checked(f: Tensor, g: Tensor, n: int) -> None:
    for name, t in (("F", f), ("G", g)):
        if not isinstance(t, Tensor) or t.ndim != 2 or t.shape[0] != n:
            raise ArgumentError(
                f"the model must map a batch of {n} inputs to ({n}, d) encodings; its {name} "
                f"is {tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")


def method(name: str = "dcco", **loss: Any) -> Method:
    """A method to give the round's parts (``statistics``, ``local_update``,
    ``merge_statistics``) with loss settings of your own, e.g. the paper's λ::

        paper = dcco.method("dcco", lambd=20.0)
        reply = dcco.statistics(model, x1, x2, paper)
        update = dcco.local_update(model, x1, x2, shared.aggregate, paper)

    A method named by its string alone takes the defaults for a user's model: λ = 5
    (``dcco.config.USER``, as ``dcco.fit``'s and ``dcco.flower.DCCOStrategy``'s) and ε = 1e-5.

    Parameters
    ----------
    name : str (default: 'dcco')
        The method (``dcco``, ``dvicreg``, ``cco_fedavg``, ...).
    **loss : Any, keyword arguments
        Any key of the ``[loss]`` section (``lambd``, ``eps``, ``temperature``,
        ``vicreg``, ...; docs/config.md).

    Raises
    ------
    dcco.ConfigError
        An unknown method or loss key, or a bad value.
    """
    from dcco.config import ConfigError

    if name not in METHODS:
        raise ConfigError(f"method: unknown method {name!r}; choose one of "
                          f"{', '.join(sorted(METHODS))}")
    values = {"lambd": USER.lambd} | loss
    known = {f.name for f in fields(LossConfig)}
    if unknown := sorted(set(values) - known):
        raise ConfigError(f"method: unknown loss setting {unknown[0]!r}; the [loss] keys are "
                          f"{', '.join(sorted(known))}")
    with arguments_of("method", {f"loss.{k}": k for k in known}, kind=ConfigError):
        return build_method(name, LossConfig(**values))


def _method(given: str | Method, statistics: bool = False) -> Method:
    m = method(given) if isinstance(given, str) else given
    if statistics and m.stats is None:
        shared = sorted(k for k, v in METHODS.items() if getattr(v, "stats", None) is not None)
        raise ArgumentError(f"{m.name} shares no statistics; the statistics methods are "
                            f"{', '.join(shared)}")
    return m


# ------------------------------------------------------------------------------ clients


def statistics(model: Model, x1: Tensor, x2: Tensor,
               method: str | Method = "dcco", chunk: int | None = None) -> EncodingStats:
    """Phase 1 on a client: its sample count and the method's additive sums of its encodings
    (float64), e.g. ``count``, ``sum_f``, ``sum_ff``, ``sum_g``, ``sum_gg``, ``sum_fg`` for
    ``dcco``. They are what the client sends; ``dict(result.items())`` gives plain tensors.

    Parameters
    ----------
    model : Model
        The global model the server sent.
    x1, x2 : Tensor
        The two views (or the two modalities) of the client's samples, (N_k, ...).
    method : str | Method (default: 'dcco')
        A statistics method's name (``dcco``, ``dvicreg``) or object.
    chunk : int | None (default: None)
        Forward the samples in chunks of this many (the same encodings, to float
        rounding, for a model without batch norm, and faster on a CPU); None: in one
        batch. A model holding batch norm is always forwarded in one batch.
    """
    m = _method(method, statistics=True)
    with torch.no_grad():
        f, g, _ = _phase1_forward(model, x1, x2, chunk)
    return encoding_stats(f, g, m.stats)


def _views_checked(model: Model, x1: Tensor, x2: Tensor, call: str) -> None:
    """``ArgumentError`` of ``call`` for views that cannot be a client's: as many rows in
    ``x1`` as in ``x2`` (a sample's two views share a row), and alike samples where one
    tower encodes both (anything but a two-tower ``DualEncoder``)."""
    if x1.shape[:1] != x2.shape[:1]:
        raise ArgumentError(f"{call}: x1 holds {x1.shape[0]} samples and x2 "
                            f"{x2.shape[0]}; a sample's two views share a row")
    one_tower = not isinstance(model, DualEncoder) or model.shared
    if one_tower and x1.shape[1:] != x2.shape[1:]:
        raise ArgumentError(f"{call}: x2's samples are {tuple(x2.shape[1:])} but x1's are "
                            f"{tuple(x1.shape[1:])}; one tower encodes both views, so they "
                            f"must be alike")


@contextmanager
def _model_reads(call: str, x1: Tensor, x2: Tensor) -> Iterator[None]:
    """torch's ``RuntimeError`` from the model on the views (a width or shape it cannot
    take) as a ``ModelInputError`` of ``call`` naming the views, the model's error chained;
    running out of memory stays what it is."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        if isinstance(e, ModelInputError):
            raise
        raise ModelInputError(f"{call}: the model failed on the views x1 {tuple(x1.shape)} "
                              f"and x2 {tuple(x2.shape)}: {str(e).splitlines()[0]}") from e


def _phase1_forward(model: Model, x1: Tensor, x2: Tensor, chunk: int | None
                    ) -> tuple[Tensor, Tensor, tuple[nn.Module, Callable[[str], str]]]:
    """A client's encodings of its two views at the global model (its buffers left as they
    were), checked, with the model as (x1, x2) → (F, G) and its names' way back."""
    _views_checked(model, x1, x2, "statistics")
    dual, back = dual_view(model, chunk)
    n = int(x1.shape[0])
    if n == 0:
        raise ArgumentError("a client with no samples has no statistics; leave it out of the "
                            "round")
    with buffers_kept(dual), _model_reads("statistics", x1, x2):
        f, g = dual(x1, x2)
    _encodings_checked(f, g, n)
    return f, g, (dual, back)


@dataclass(frozen=True)
class KeptForward:
    """A client's phase-1 forward with its graph, for phase 2 to differentiate instead of
    encoding the views again (``statistics_kept``, ``update_from_kept``). It holds the
    activations of both views until then: ``saved_bytes`` says how much."""

    dual: nn.Module
    back: Callable[[str], str]
    f: Tensor
    g: Tensor
    saved_bytes: int


def statistics_kept(model: Model, x1: Tensor, x2: Tensor, method: str | Method = "dcco",
                    chunk: int | None = None) -> tuple[EncodingStats, KeptForward]:
    """``statistics``, from a forward whose graph is kept for ``update_from_kept``: phase 2
    then costs a backward pass alone. The statistics are ``statistics``' to the bit at the
    same ``chunk`` (the same forward, with gradients recorded). In chunks, each chunk's
    backward runs on its own, cache-sized activations: on the quickstart's CNN, forward and
    backward of 1,600 images in chunks of 256 take about 0.7 of one batch's CPU time."""
    m = _method(method, statistics=True)
    saved: dict[int, int] = {}  # the activations' storages, each once: their bytes

    def pack(t: Tensor) -> Tensor:  # the activations, not the weights the graph also holds
        if not (t.is_leaf and t.requires_grad):
            storage = t.untyped_storage()
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    # the hook also spares the saved tensors the version check that the buffers restored
    # after the forward (batch norm's running statistics) would fail in the backward
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f, g, (dual, back) = _phase1_forward(model, x1, x2, chunk)
    return encoding_stats(f.detach(), g.detach(), m.stats), KeptForward(
        dual, back, f, g, sum(saved.values()))


def _update_checked(method: str | Method, aggregate: Moments | None, n: int) -> Method:
    """The method of a phase-2 step, refused without the S_A it needs or with too few
    samples."""
    m = _method(method)
    if m.stats is not None and aggregate is None:
        raise ArgumentError(f"{m.name} needs the round's aggregate S_A (merge_statistics)")
    if n < m.min_client_samples:
        raise ArgumentError(f"{m.name} needs at least {m.min_client_samples} samples on a client, "
                            f"got {n}")
    return m


def update_from_kept(kept: KeptForward, aggregate: Moments | None,
                     method: str | Method = "dcco", lr: float = 1.0) -> ClientUpdate:
    """``local_update``'s one step (all samples, rate ``lr``) from phase 1's kept forward:
    the same delta to the bit (as ``local_update`` at the same ``chunk``), without the second
    forward. The graph is freed."""
    m = _update_checked(method, aggregate, int(kept.f.shape[0]))
    loss = m.client_loss(kept.f, kept.g, aggregate)
    delta = sgd_delta(trainable_parameters(kept.dual), loss, lr)
    return ClientUpdate(delta={kept.back(k): v for k, v in delta.items()},
                        num_samples=int(kept.f.shape[0]), loss=float(loss.detach()))


def local_update(model: Model, x1: Tensor, x2: Tensor, aggregate: Moments | None,
                 method: str | Method = "dcco", lr: float = 1.0, steps: int = 1,
                 batch: int | None = None, chunk: int | None = None) -> ClientUpdate:
    """Phase 2 on a client: ``steps`` SGD steps of rate ``lr`` on the method's client loss
    (DCCO: L(S_k + stopgrad(S_A − S_k))), returned as a model delta; ``model`` is left
    unchanged.

    Parameters
    ----------
    model : Model
        The global model.
    x1, x2 : Tensor
        The client's two views, as in phase 1.
    aggregate : Moments | None
        S_A, ``merge_statistics(...).aggregate`` (None for methods without
        statistics, the FedAvg baselines).
    method : str | Method (default: 'dcco')
        The method's name or object.
    lr : float (default: 1.0)
        The client learning rate (paper: 1.0).
    steps : int (default: 1)
        E local steps, with S_A held fixed (the paper's one step is exact; more are an
        approximation).
    batch : int | None (default: None)
        The minibatch of each local step, in samples (None: all).
    chunk : int | None (default: None)
        Forward the samples in chunks of this many (``statistics``' ``chunk``);
        None: in one batch.

    Returns
    -------
    ClientUpdate
        ``ClientUpdate``: ``delta`` (parameter name of ``model`` → θ_k − θ), ``num_samples``
        and the client's ``loss`` before its step.
    """
    m = _update_checked(method, aggregate, int(x1.shape[0]))
    _views_checked(model, x1, x2, "local_update")
    if steps < 1 or (batch is not None and batch < 1):
        raise ArgumentError(f"steps and batch must be >= 1, got steps = {steps}, batch = {batch}")
    dual, back = dual_view(model, chunk)
    with buffers_kept(dual):
        update = client_update(dual, m, x1, x2, aggregate, lr, steps, batch)
    return replace(update, delta={back(k): v for k, v in update.delta.items()})


# ------------------------------------------------------------------------------ the server


@dataclass(frozen=True)
class Merged:
    """The server's merge of phase 1.

    Attributes
    ----------
    aggregate : Moments | None
        S_A, the sample-weighted average of the valid replies (with their total
        count), to send to every client that gave valid statistics; None if none did.
    accepted : tuple[int, ...]
        The positions of the valid replies in the order given.
    tally : ReplyTally
        What became of the replies (accepted, rejected by kind).
    counts : tuple[int, ...] (default: ())
        The sample count of each valid reply, in the order of ``accepted``.
    """

    aggregate: Moments | None
    accepted: tuple[int, ...]
    tally: ReplyTally
    counts: tuple[int, ...] = ()


def _width(model: Model | int) -> int:
    if isinstance(model, int):
        return model
    if isinstance(model, DualEncoder):
        return model.projection_dim
    raise ArgumentError("give the encoding width d (an int) or a DualEncoder to check the "
                        "replies' shapes against")


def merge_statistics(replies: Iterable[EncodingStats | Mapping[str, Any]], model: Model | int,
                     method: str | Method = "dcco") -> Merged:
    """Phase 1 on the server: the valid clients' statistics merged into S_A.

    Each reply is checked as dcco's Flower app checks it: every sum of the method present,
    of the right shape and a floating dtype, finite and of sane magnitude, a positive
    integer count, sums of squares not negative. A malformed reply is left out and counted
    in ``tally.rejected`` by kind; the round goes on with the others.

    Parameters
    ----------
    replies : Iterable[EncodingStats | Mapping[str, Any]]
        What the clients sent (``statistics``' results, or mappings of the same
        names to tensors or arrays).
    model : Model | int
        The encoding width d, or the ``DualEncoder`` (its projection width).
    method : str | Method (default: 'dcco')
        The statistics method.
    """
    m = _method(method, statistics=True)
    d = _width(model)
    tally = ReplyTally()
    replies = list(replies)
    tally.sent = len(replies)
    def check(reply: Any) -> EncodingStats:
        if not isinstance(reply, (Mapping, EncodingStats)):
            raise ReplyError("dtype", f"a statistics reply must map names to sums, got "
                                      f"{type(reply).__name__}")
        return validate_statistics({k: _tensor(v) for k, v in dict(reply.items()).items()},
                                   d, d, spec=m.stats)

    valid = accept_valid(replies, check, tally)
    aggregate = merge([s for _, s in valid]).moments() if valid else None
    return Merged(aggregate, tuple(i for i, _ in valid), tally,
                  tuple(int(s.count) for _, s in valid))


def _tensor(value: Any) -> Any:
    """A reply's value as a tensor where it is an array (numpy, or nested lists, read as
    float64 like the sums they stand for), else as it is (the checks name what is wrong)."""
    if isinstance(value, (Tensor, int, float)):
        return value
    if isinstance(value, np.integer):
        return int(value)
    try:
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            return value
        return torch.from_numpy(array.astype(np.float64) if array.dtype.kind == "f" or
                                isinstance(value, list) else array)
    except (TypeError, ValueError, RuntimeError):
        return value


@dataclass(frozen=True)
class Aggregated:
    """The server's aggregate of phase 2.

    Attributes
    ----------
    pseudo_gradient : dict[str, Tensor] | None
        −Σ_k (N_k/N)·Δ_k over the valid updates, by parameter name (what
        ``apply_update`` gives the server optimiser); None if no update was valid.
    loss : float
        The valid clients' sample-weighted loss.
    num_samples : int
        N, their samples.
    accepted : tuple[int, ...]
        The positions of the valid updates.
    tally : ReplyTally (default: <factory>)
        What became of the updates.
    """

    pseudo_gradient: dict[str, Tensor] | None
    loss: float
    num_samples: int
    accepted: tuple[int, ...]
    tally: ReplyTally = field(default_factory=ReplyTally)


def aggregate_updates(updates: Iterable[ClientUpdate], model: nn.Module) -> Aggregated:
    """Phase 2 on the server: the sample-weighted average of the valid updates.

    An update is valid when it holds a delta for every trainable parameter of ``model`` (by
    name), of its shape, floating, finite and of sane magnitude, with a positive integer
    count and a finite loss; others are left out and counted by kind.

    Parameters
    ----------
    updates : Iterable[ClientUpdate]
        ``local_update``'s results (or ``ClientUpdate``s rebuilt from messages).
    model : nn.Module
        The global model (names, shapes, dtypes and device of the result).
    """
    params = dict(trainable_parameters(model))
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    tally = ReplyTally()
    updates = list(updates)
    tally.sent = len(updates)

    def check(u: Any) -> ClientUpdate:
        if not isinstance(u, ClientUpdate):
            raise ReplyError("dtype", f"an update must be a ClientUpdate, got "
                                      f"{type(u).__name__}")
        if not isinstance(u.delta, Mapping):
            raise ReplyError("dtype", "an update's delta must map parameter names to arrays")
        if u.loss is None:
            raise ReplyError("missing_key", "the update reports no loss")
        return validate_update({k: _tensor(v) for k, v in u.delta.items()},
                               _tensor(u.num_samples), shapes, loss=_tensor(u.loss))

    valid = accept_valid(updates, check, tally)
    if not valid:
        return Aggregated(None, float("nan"), 0, (), tally)
    pooled = pooled_update([u for _, u in valid], params)
    return Aggregated({k: -v for k, v in pooled.delta.items()}, pooled.loss,
                      pooled.num_samples, tuple(i for i, _ in valid), tally)


def apply_update(model: nn.Module, optimizer: torch.optim.Optimizer,
                 pseudo_gradient: Mapping[str, Tensor]) -> None:
    """One step of the server's optimiser (any ``torch.optim`` optimiser over ``model``'s
    parameters, e.g. ``dcco.server_optimizer``) with the pseudo-gradient as the gradient.

    Parameters
    ----------
    model : nn.Module
        The global model, stepped in place.
    optimizer : torch.optim.Optimizer
        The server's optimiser over ``model``'s parameters.
    pseudo_gradient : Mapping[str, Tensor]
        Parameter name → the server's gradient, ``aggregate_updates(...).pseudo_gradient``
        (minus the clients' mean update); one for every trainable parameter.

    Raises
    ------
    dcco.errors.MissingNameError
        ``pseudo_gradient`` lacks one of ``model``'s trainable parameters (a ``KeyError``).
    """
    named = trainable_parameters(model)
    missing = [n for n, _ in named if n not in pseudo_gradient]
    if missing:
        raise MissingNameError(
            f"apply_update: pseudo_gradient lacks the model's parameter {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    apply_pseudo_gradient(optimizer, [p for _, p in named], [pseudo_gradient[n] for n, _ in named])


def server_optimizer(model: nn.Module, optimizer: str = USER.optim.optimizer,
                     lr: float = USER.optim.lr,
                     weight_decay: float = USER.optim.weight_decay,
                     **settings: Any) -> torch.optim.Optimizer:
    """dcco's server optimiser over ``model``: Adam(W) (by default, ``dcco.config.USER``'s rate),
    LARS (1-D parameters excluded from adaptation and weight decay) or SGD, as ``[optim]``
    configures it (``dcco.config.OptimConfig``'s fields as keywords). Its rate stays ``lr``:
    call ``dcco.core.optim.set_lr`` for a schedule and warm-up.

    Parameters
    ----------
    model : nn.Module
        The global model whose parameters it steps.
    optimizer : str (default: 'adam')
        ``adam``, ``lars`` or ``sgd``.
    lr : float (default: 0.001)
        The server's rate.
    weight_decay : float (default: 0.0)
        Weight decay (decoupled under Adam; LARS leaves 1-D parameters out).
    **settings : Any, keyword arguments
        Any other field of ``dcco.config.OptimConfig`` (``momentum``, ``trust_coefficient``,
        ``vector_lr_scale``, ``betas``, ...).

    Raises
    ------
    dcco.ArgumentError
        An unknown optimiser, a rate not > 0, or a keyword that is not an ``[optim]`` field;
        the message starts "server_optimizer: " and names the argument.
    """
    from dcco.config import OptimConfig
    from dcco.core.optim import build_optimizer

    if "name" in settings:  # its old name
        warnings.warn("server_optimizer(name=...) is now server_optimizer(optimizer=...)",
                      DeprecationWarning, stacklevel=2)
        optimizer = settings.pop("name")
    with arguments_of("server_optimizer", {f"optim.{k}": k for k in
                                           ("optimizer", "lr", "weight_decay", *settings)}):
        try:
            config = OptimConfig(optimizer=optimizer, lr=lr, weight_decay=weight_decay,
                                 **settings)
        except TypeError as e:  # a keyword OptimConfig has no field for
            raise ArgumentError(f"server_optimizer: {e}") from None
    return build_optimizer(trainable_parameters(model), config)


__all__ = ["Aggregated", "KeptForward", "Merged", "Model", "aggregate_updates", "apply_update",
           "local_update", "merge_statistics", "method", "server_optimizer", "statistics",
           "statistics_kept", "update_from_kept"]
