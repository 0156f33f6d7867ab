"""DCCO in your own code: a round's parts over your own PyTorch model, and a simulator that
trains it over your own clients (docs/own_code.md). Everything here is re-exported from
``dcco``.

A round of a statistics method (``dcco``, ``dvicreg``), with K clients::

    replies = [dcco.statistics(model, x1_k, x2_k) for each client]         # phase 1, clients
    shared = dcco.merge_statistics(replies, model)                          # server
    updates = [dcco.local_update(model, x1_k, x2_k, shared.aggregate) ...]  # phase 2, clients
    step = dcco.aggregate_updates(updates, model)                           # server
    dcco.apply_update(model, optimizer, step.pseudo_gradient)               # server

One such round is one centralized step on the pooled batch (``tests/test_api.py`` checks it
against dcco's reference round to 1e-12 in float64). The server's functions validate every
reply as dcco's Flower app does: a malformed one is left out and counted by kind
(``ReplyTally``), never used. ``dcco.fit`` runs whole trainings in the batched simulator.

A model is either a ``DualEncoder`` (``dual_encoder(...)``: your encoder or two towers, and a
projector) or a plain ``nn.Module`` that maps a batch of one view to (N, d) encodings; the
latter is the shared encoder of both views, and updates are keyed by its own parameter names.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dcco.client import ClientUpdate, client_update, trainable_parameters
from dcco.config import ConfigError, RunConfig, load_config
from dcco.data.datasets import DataError
from dcco.data.samples import Samples, samples_of_clients
from dcco.methods.base import LossConfig, Method
from dcco.methods.registry import METHODS, build_method
from dcco.models import DualEncoder, build_projector
from dcco.models.dual import buffers_kept
from dcco.optim import USER_RECIPE, apply_pseudo_gradient
from dcco.rundir import RunDir
from dcco.server import (
    ReplyError,
    ReplyTally,
    accept_valid,
    pooled_update,
    validate_statistics,
    validate_update,
)
from dcco.stats import EncodingStats, Moments, encoding_stats, merge

Model = nn.Module
"""A ``DualEncoder`` or a plain encoder module shared by both views."""


# ------------------------------------------------------------------------------ models


class IdentityProjector(nn.Identity):
    """No projector: the encoder's output is the encoding (``projector=None``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.in_dim = self.out_dim = dim


def feature_dim(encoder: nn.Module, sample: Tensor | None) -> int:
    """The width of ``encoder``'s output: its ``feature_dim`` attribute, or measured by one
    forward of ``sample`` (one input, without its batch dimension) in eval mode, without
    gradients; the module's train/eval mode is restored."""
    width = getattr(encoder, "feature_dim", None)
    if isinstance(width, int):
        return width
    if sample is None:
        raise ValueError(f"{type(encoder).__name__} has no feature_dim attribute; give a "
                         f"sample input to measure its output width")
    was_training = encoder.training
    first = next(encoder.parameters(), None)
    if first is not None:  # the sample as the encoder's weights are: dtype and device
        sample = sample.to(first.device)
        if sample.is_floating_point():
            sample = sample.to(first.dtype)
    encoder.eval()
    try:
        with torch.no_grad():
            out = encoder(sample[None])
    except Exception as e:
        raise ValueError(f"{type(encoder).__name__} failed on one sample of shape "
                         f"{tuple(sample.shape)} (measuring its output width): "
                         f"{type(e).__name__}: {e}") from e
    finally:
        encoder.train(was_training)
    if not isinstance(out, Tensor) or out.ndim != 2:
        raise ValueError(f"{type(encoder).__name__} must map a batch to (N, d) encodings; "
                         f"one sample of shape {tuple(sample.shape)} gave "
                         f"{tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
    return int(out.shape[1])


def dual_encoder(encoder: nn.Module, projector: Iterable[int] | None = (128, 128, 128), *,
                 second: nn.Module | None = None, sample: Tensor | None = None,
                 sample_y: Tensor | None = None, seed: int = 0) -> DualEncoder:
    """Your encoder (or two towers) with dcco's projector, as a ``DualEncoder``.

    Args:
        encoder: maps a batch of inputs to (N, feature_dim) features; it keeps its own
            weights (the projector is initialised from ``seed``).
        projector: the projector's widths (dcco's MLP with group norm and weight
            standardisation, paper §4), or None for none (the encoder's output is the
            encoding).
        second: a second tower for the second input (two modalities); None: ``encoder``
            encodes both views.
        sample, sample_y: one input of each tower (no batch dimension), to measure an
            encoder's output width when it has no ``feature_dim`` attribute.
        seed: the projectors' initialisation.
    """
    from dcco.models import ModelConfig

    dims = None if projector is None else tuple(int(d) for d in projector)
    heads = []
    for tower, (module, x) in enumerate(((encoder, sample), (second, sample_y))[: 1 + (
            second is not None)]):
        width = feature_dim(module, x)
        if not hasattr(module, "feature_dim"):
            module.feature_dim = width
        heads.append(IdentityProjector(width) if dims is None else
                     build_projector(ModelConfig(), width, dims, seed, tower))
    if len(heads) == 2 and heads[0].out_dim != heads[1].out_dim:
        raise ValueError(f"the two towers must encode to one width: {heads[0].out_dim} and "
                         f"{heads[1].out_dim} (give projector widths, or encoders of equal "
                         f"output)")
    second_tower = (second, heads[1]) if second is not None else None
    return DualEncoder(encoder, heads[0], second=second_tower)


class _Shared(nn.Module):
    """A plain encoder as a shared dual encoder: (x1, x2) → (encoder(x1), encoder(x2)), in
    one forward over both views (the encoder must have no cross-sample terms to give each
    view its own encodings; batch norm has them)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        return self.encoder(x1), self.encoder(x2)


def dual_view(model: Model) -> tuple[nn.Module, Callable[[str], str]]:
    """The model as (x1, x2) → (F, G), and how its parameter names map back to ``model``'s."""
    if isinstance(model, DualEncoder):
        return model, lambda name: name
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (your encoder) or a DualEncoder, "
                        f"got {type(model).__name__}")
    return _Shared(model), lambda name: name.removeprefix("encoder.")


def _encodings_checked(f: Tensor, g: Tensor, n: int) -> None:
    for name, t in (("F", f), ("G", g)):
        if not isinstance(t, Tensor) or t.ndim != 2 or t.shape[0] != n:
            raise ValueError(
                f"the model must map a batch of {n} inputs to ({n}, d) encodings; its {name} "
                f"is {tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")


def _method(method: str | Method, statistics: bool = False) -> Method:
    m = build_method(method, LossConfig()) if isinstance(method, str) else method
    if statistics and m.stats is None:
        shared = sorted(k for k, v in METHODS.items() if getattr(v, "stats", None) is not None)
        raise ValueError(f"{m.name} shares no statistics; the statistics methods are "
                         f"{', '.join(shared)}")
    return m


# ------------------------------------------------------------------------------ clients


def statistics(model: Model, x1: Tensor, x2: Tensor,
               method: str | Method = "dcco") -> EncodingStats:
    """Phase 1 on a client: its sample count and the method's additive sums of its encodings
    (float64), e.g. ``count``, ``sum_f``, ``sum_ff``, ``sum_g``, ``sum_gg``, ``sum_fg`` for
    ``dcco``. They are what the client sends; ``dict(result.items())`` gives plain tensors.

    Args:
        model: the global model the server sent.
        x1, x2: the two views (or the two modalities) of the client's samples, (N_k, ...).
        method: a statistics method's name (``dcco``, ``dvicreg``) or object.
    """
    m = _method(method, statistics=True)
    dual, _ = dual_view(model)
    n = int(x1.shape[0])
    if n == 0:
        raise ValueError("a client with no samples has no statistics; leave it out of the "
                         "round")
    with torch.no_grad(), buffers_kept(dual):
        f, g = dual(x1, x2)
    _encodings_checked(f, g, n)
    return encoding_stats(f, g, m.stats)


def local_update(model: Model, x1: Tensor, x2: Tensor, aggregate: Moments | None,
                 method: str | Method = "dcco", lr: float = 1.0, steps: int = 1,
                 batch: int | None = None) -> ClientUpdate:
    """Phase 2 on a client: ``steps`` SGD steps of rate ``lr`` on the method's client loss
    (DCCO: L(S_k + stopgrad(S_A − S_k))), returned as a model delta; ``model`` is left
    unchanged.

    Args:
        model: the global model.
        x1, x2: the client's two views, as in phase 1.
        aggregate: S_A, ``merge_statistics(...).aggregate`` (None for methods without
            statistics, the FedAvg baselines).
        method: the method's name or object.
        lr: the client learning rate (paper: 1.0).
        steps, batch: E local steps on minibatches of ``batch`` samples (None: all), with
            S_A held fixed (the paper's one step is exact; more are an approximation).

    Returns:
        ``ClientUpdate``: ``delta`` (parameter name of ``model`` → θ_k − θ), ``num_samples``
        and the client's ``loss`` before its step.
    """
    m = _method(method)
    if m.stats is not None and aggregate is None:
        raise ValueError(f"{m.name} needs the round's aggregate S_A (merge_statistics)")
    if int(x1.shape[0]) < m.min_client_samples:
        raise ValueError(f"{m.name} needs at least {m.min_client_samples} samples on a client, "
                         f"got {int(x1.shape[0])}")
    if steps < 1 or (batch is not None and batch < 1):
        raise ValueError(f"steps and batch must be >= 1, got steps = {steps}, batch = {batch}")
    dual, back = dual_view(model)
    with buffers_kept(dual):
        update = client_update(dual, m, x1, x2, aggregate, lr, steps, batch)
    return replace(update, delta={back(k): v for k, v in update.delta.items()})


# ------------------------------------------------------------------------------ the server


@dataclass(frozen=True)
class Merged:
    """The server's merge of phase 1.

    Attributes:
        aggregate: S_A, the sample-weighted average of the valid replies (with their total
            count), to send to every client that gave valid statistics; None if none did.
        accepted: the positions of the valid replies in the order given.
        tally: what became of the replies (accepted, rejected by kind).
        counts: the sample count of each valid reply, in the order of ``accepted``.
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
    raise TypeError("give the encoding width d (an int) or a DualEncoder to check the "
                    "replies' shapes against")


def merge_statistics(replies: Iterable[EncodingStats | Mapping[str, Any]], model: Model | int,
                     method: str | Method = "dcco") -> Merged:
    """Phase 1 on the server: the valid clients' statistics merged into S_A.

    Each reply is checked as dcco's Flower app checks it: every sum of the method present,
    of the right shape and a floating dtype, finite and of sane magnitude, a positive
    integer count, sums of squares not negative. A malformed reply is left out and counted
    in ``tally.rejected`` by kind; the round goes on with the others.

    Args:
        replies: what the clients sent (``statistics``' results, or mappings of the same
            names to tensors or arrays).
        model: the encoding width d, or the ``DualEncoder`` (its projection width).
        method: the statistics method.
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

    Attributes:
        pseudo_gradient: −Σ_k (N_k/N)·Δ_k over the valid updates, by parameter name (what
            ``apply_update`` gives the server optimiser); None if no update was valid.
        loss: the valid clients' sample-weighted loss.
        num_samples: N, their samples.
        accepted: the positions of the valid updates.
        tally: what became of the updates.
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

    Args:
        updates: ``local_update``'s results (or ``ClientUpdate``s rebuilt from messages).
        model: the global model (names, shapes, dtypes and device of the result).
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
    parameters, e.g. ``dcco.server_optimizer``) with the pseudo-gradient as the gradient."""
    named = trainable_parameters(model)
    missing = [n for n, _ in named if n not in pseudo_gradient]
    if missing:
        raise KeyError(f"the pseudo-gradient lacks {missing[0]} (and {len(missing) - 1} more)"
                       if len(missing) > 1 else f"the pseudo-gradient lacks {missing[0]}")
    apply_pseudo_gradient(optimizer, [p for _, p in named], [pseudo_gradient[n] for n, _ in named])


def server_optimizer(model: nn.Module, name: str = USER_RECIPE.name, lr: float = USER_RECIPE.lr,
                     weight_decay: float = USER_RECIPE.weight_decay,
                     **settings: Any) -> torch.optim.Optimizer:
    """dcco's server optimiser over ``model``: Adam(W) (by default, ``USER_RECIPE``'s rate),
    LARS (1-D parameters excluded from adaptation and weight decay) or SGD, as ``[optim]``
    configures it (``dcco.optim.OptimConfig``'s fields as keywords). Its rate stays ``lr``:
    call ``dcco.optim.set_lr`` for a schedule and warm-up."""
    from dcco.optim import OptimConfig, build_optimizer

    return build_optimizer(trainable_parameters(model),
                           OptimConfig(name=name, lr=lr, weight_decay=weight_decay, **settings))


# ------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def encoder_features(encoder: nn.Module, x: Tensor,
                     transform: Callable[[Tensor], Tensor] | None = None,
                     batch: int = 512) -> Tensor:
    """Your encoder's features of ``x`` (N, ...), in eval mode and without gradients, batch
    by batch, each batch through ``transform`` first (e.g. uint8 images to floats); the
    module's train/eval mode is restored. Returns float32 (N, d) on the CPU."""
    was = encoder.training
    first = next(encoder.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    encoder.eval()
    try:
        out = []
        for part in x.split(batch):
            part = part.to(device)
            if transform is not None:
                part = transform(part)
            elif first is not None and part.is_floating_point():
                part = part.to(first.dtype)
            out.append(encoder(part).float().cpu())
    finally:
        encoder.train(was)
    return torch.cat(out)


def linear_probe(encoder: nn.Module, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor],
                 *, transform: Callable[[Tensor], Tensor] | None = None, steps: int = 1000,
                 seed: int = 0) -> float:
    """The test accuracy of a linear classifier on your encoder's frozen features: dcco's
    linear evaluation (the paper's protocol, appendix B: LARS, batch 512, rate 2.0 with
    cosine decay, the features standardised on the training set) for any module.

    Args:
        encoder: maps a batch of inputs to (N, d) features; left as it was.
        train, test: (inputs, labels), labels int (N,) in [0, classes).
        transform: applied to each batch of inputs first (e.g. uint8 images to floats, no
            augmentation); None: floating inputs are cast to the encoder's dtype.
        steps: the classifier's LARS steps.
        seed: the classifier's batch order.

    Returns:
        Accuracy on ``test``, in [0, 1].
    """
    from dcco.evaluate.probe import linear_probe_features
    from dcco.evaluate.settings import EvalConfig

    (x_train, y_train), (x_test, y_test) = train, test
    y_train, y_test = torch.as_tensor(y_train).long(), torch.as_tensor(y_test).long()
    classes = int(max(y_train.max(), y_test.max())) + 1
    result = linear_probe_features(encoder_features(encoder, x_train, transform), y_train,
                                   encoder_features(encoder, x_test, transform), y_test,
                                   classes, EvalConfig(probe_steps=steps), seed)
    return result.accuracy


# ------------------------------------------------------------------------------ the simulator


@dataclass(frozen=True)
class FitResult:
    """What ``fit`` returns.

    Attributes:
        model: the trained ``DualEncoder`` (your encoder is ``model.backbone``; it is the very
            module you passed, trained in place).
        run_dir: the run directory (``config.toml``, ``metrics.jsonl``, checkpoints,
            ``summary.json``), which ``dcco.load_encoder(run_dir, model=your_encoder)`` reads.
        summary: the run's summary (rounds, final loss, the collapse figures, ...).
        collapse, collapse_warning: see the properties.
    """

    model: DualEncoder
    run_dir: Path
    summary: dict[str, Any]

    @property
    def collapse(self) -> dict[str, float] | None:
        """The last collapse figures (``dead_dims``, ``corr_diag``, ``eff_rank`` and their
        ``round``; ``dcco.collapse``), or None if none were read."""
        return self.summary.get("collapse")

    @property
    def collapse_warning(self) -> str | None:
        """The run's collapse warning (shown once when it was given), or None."""
        return self.summary.get("collapse_warning")


def fit(encoder: nn.Module, clients: Mapping[Hashable, Tensor] | Samples, *, rounds: int,
        augment: Callable[[Tensor], Tensor] | None = None, method: str = "dcco",
        clients_per_round: int = 32, projector: Iterable[int] | None = (128, 128, 128),
        run_dir: str | Path | None = None, seed: int = 0, progress: bool | None = None,
        settings: Iterable[str] | Mapping[str, Any] = ()) -> FitResult:
    """Train your encoder with ``method`` over your clients in dcco's batched simulator.

    Every round samples ``clients_per_round`` clients, makes two views of their samples
    with ``augment`` and runs the method's round over them in one forward and backward: for
    DCCO the exact round (one centralized step on the pooled batch, as
    ``settings=['train.backend="reference"']``, which runs the clients one by one, gives).
    The run directory is ``dcco pretrain``'s: metrics, atomic checkpoints, a summary; an
    interrupted ``fit`` with the same ``run_dir`` and arguments continues from its last
    checkpoint, to the same weights.

    Args:
        encoder: your module, from a batch of views to (N, d) features (trained in place).
        clients: client id → that client's samples (a tensor (n_k, ...) each: images, float
            vectors, token ids, anything ``encoder`` and ``augment`` take), or
            ``dcco.data.Samples``.
        rounds: server rounds.
        augment: one view of a batch of stored samples (``dcco.train.Pretraining``'s
            ``augment``), called twice a round, for samples of any kind (dcco's own
            augmentation then stays off: ``augment.enabled = false``); None: dcco's BYOL
            augmentation, which needs uint8 (N, C, H, W) images with C = 1 or 3.
        method: any federated method (``dcco``, ``dvicreg``, ``cco_fedavg``,
            ``contrastive_fedavg``, ...).
        clients_per_round: K.
        projector: the projector's widths, or None for none.
        run_dir: where the run is written; None: ``runs/fit-<method>-<time>``.
        seed: the run's seed (client sampling, augmentation, the projector's initialisation).
        progress: a progress bar (None: on a terminal).
        settings: further settings of the run config, as ``section.key=value`` strings
            (``'optim.lr=0.5'``) or a mapping (``{"optim.lr": 0.5, "train.log_every": 1}``);
            every key and its default: docs/config.md (``dcco config --list``).

    Raises:
        ConfigError, DataError: bad settings or data, named, before any file or folder is
            written.
    """
    from datetime import datetime

    from dcco.train import check_run, run_with_progress

    data = clients if isinstance(clients, Samples) else samples_of_clients(clients)
    if augment is None and not (data.x.dtype == torch.uint8 and data.x.ndim == 4
                                and data.x.shape[1] in (1, 3)):
        raise DataError(f"dcco's augmentation takes uint8 (N, C, H, W) images with 1 or 3 "
                        f"channels; these samples are {data.x.dtype} "
                        f"{tuple(data.x.shape[1:])}: pass augment=your_function")
    settings = setting_strings(settings)
    for item in settings:
        key = item.partition("=")[0].strip()
        if key in FIT_ARGUMENTS:
            raise ConfigError(f"settings: {key} is fit's argument {FIT_ARGUMENTS[key]}=; "
                              f"give it there")
    dims = None if projector is None else [int(d) for d in projector]
    cfg = fit_config(method, rounds, clients_per_round, dims, seed, settings,
                     own_augment=augment is not None)
    check_run(cfg, data, towers=False)
    model = dual_encoder(encoder, dims, sample=_model_input(data, augment, cfg), seed=seed)
    record = {"class": _qualname(encoder), "feature_dim": model.feature_dim,
              "projector": dims, "augment": "yours" if augment is not None else "dcco",
              "data": _fingerprint(data)}
    if run_dir is None:  # a fresh folder, never an older run's
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path("runs") / f"fit-{method}-{stamp}"
        for k in range(2, 1000):
            if not path.exists():
                break
            path = Path("runs") / f"fit-{method}-{stamp}-{k}"
    else:
        path = Path(run_dir)
    resume = (path / "config.toml").is_file()
    if resume:
        from dcco.rundir import config_differences

        run = RunDir.open(path)
        if differ := config_differences(run.config(), cfg):
            raise ConfigError(f"{path} holds a run with other settings ({differ}); give "
                              f"another run_dir, or the same arguments to continue it")
        stored = run.summary().get("user_model", {})
        for key, what in (("class", "encoder class"), ("data", "clients' samples"),
                          ("augment", "augmentation (yours or dcco's)")):
            if key in stored and stored[key] != record[key]:
                raise ConfigError(f"{path} holds a run of another {what} ({stored[key]!r}, "
                                  f"now {record[key]!r}); give another run_dir, or the same "
                                  f"arguments to continue it")
    else:
        run = RunDir.create(path, cfg)
    run.update_summary(user_model=record)
    summary = run_with_progress(cfg, run, data, None, resume, progress is not False,
                                model=model, augment=augment)
    return FitResult(model, run.path, summary)


def setting_strings(settings: Iterable[str] | Mapping[str, Any]) -> list[str]:
    """``fit``'s settings as ``section.key=value`` strings: a mapping's values written as
    TOML (``{"optim.lr": 0.5}`` → ``optim.lr=0.5``), strings as they are."""
    from dcco.config import to_toml_value

    if isinstance(settings, str):
        raise TypeError("settings takes a list of 'section.key=value' strings or a mapping, "
                        f"not one string ({settings!r})")
    if isinstance(settings, Mapping):
        none = '"none"'  # how an optional setting is left unset
        return [f"{k}={none if v is None else to_toml_value(v)}" for k, v in settings.items()]
    return [str(item) for item in settings]


def fit_config(method: str, rounds: int, clients_per_round: int, projector: list[int] | None,
               seed: int, settings: list[str], own_augment: bool = False) -> RunConfig:
    """The run config of a ``fit``: ``FIT_RECIPE``'s server optimiser, the samples' natural
    clients, dcco's augmentation off with ``own_augment`` (the user's), then ``settings``."""
    base = [
        'data.dataset="samples"', 'data.partition="natural"', f'train.method="{method}"',
        f"train.rounds={rounds}", f"train.clients_per_round={clients_per_round}",
        f"train.seed={seed}", "train.knn_every=0", *FIT_RECIPE, 'augment.blur_p=[0.0, 0.0]',
        *(["augment.enabled=false"] if own_augment else []),
    ]
    if projector is not None:
        base.append(f"model.projector={projector}")
    cfg = load_config(None, base + settings)
    if not METHODS[cfg.train.method].federated:
        raise ConfigError(f"fit trains over clients; {cfg.train.method} is centralized")
    return cfg


def _model_input(data: Samples, augment: Callable[[Tensor], Tensor] | None,
                 cfg: RunConfig) -> Tensor:
    """One model input (no batch dimension), to measure the encoder's output width."""
    from dcco.augment import model_input
    from dcco.train import user_views

    first = data.x[:1]
    if augment is not None:
        return user_views(augment, first, cfg.train.seed, 0, torch.float32)[0][0]
    return model_input(first)[0]


FIT_RECIPE = (f'optim.name="{USER_RECIPE.name}"', f"optim.lr={USER_RECIPE.lr}",
              f"optim.weight_decay={USER_RECIPE.weight_decay}",
              f"optim.warmup_steps={USER_RECIPE.warmup_steps}")
"""``fit``'s server optimiser (``dcco.optim.USER_RECIPE``), before ``settings``."""

FIT_ARGUMENTS = {"train.method": "method", "train.rounds": "rounds",
                 "train.clients_per_round": "clients_per_round", "train.seed": "seed",
                 "model.projector": "projector", "data.dataset": "clients",
                 "data.partition": "clients"}
"""Config keys that ``fit``'s own arguments set (refused in its ``settings``)."""


def _fingerprint(data: Samples) -> str:
    """A digest of the samples and their clients, to refuse resuming a run on other data."""
    import hashlib

    h = hashlib.sha256()
    h.update(str((tuple(data.x.shape), str(data.x.dtype), data.client_names)).encode())
    h.update(data.clients.numpy().tobytes())
    h.update(data.x.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _qualname(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = [
    "Aggregated",
    "FitResult",
    "IdentityProjector",
    "Merged",
    "aggregate_updates",
    "apply_update",
    "dual_encoder",
    "feature_dim",
    "fit",
    "fit_config",
    "linear_probe",
    "local_update",
    "merge_statistics",
    "server_optimizer",
    "statistics",
]
