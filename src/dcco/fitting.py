"""Training and probing your own encoder: ``dcco.fit`` runs whole trainings of it over your
clients in dcco's batched simulator (a ``dcco pretrain`` run directory), and
``dcco.linear_probe`` scores any encoder with dcco's linear evaluation. Both are re-exported
from ``dcco`` (docs/own_code.md)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dcco.config import USER, ConfigError, RunConfig, from_dict, load_config
from dcco.data.datasets import DataError
from dcco.data.samples import Samples, samples_of_clients
from dcco.errors import ArgumentError, arguments_of, shown
from dcco.methods.registry import METHODS
from dcco.models import DualEncoder
from dcco.models.user_encoder import dual_encoder
from dcco.run.rundir import FIT_WORDS, RunDir
from dcco.run.setup import resolved

Model = nn.Module


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

    >>> import torch, dcco
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(400, 2, generator=g)
    >>> y = (x[:, 0] > 0).long()                  # a class a linear layer can read
    >>> dcco.linear_probe(torch.nn.Identity(), (x[:200], y[:200]), (x[200:], y[200:]),
    ...                   steps=200) > 0.95
    True

    Parameters
    ----------
    encoder : nn.Module
        Maps a batch of inputs to (N, d) features; left as it was.
    train, test : tuple[Tensor, Tensor]
        (inputs, labels), labels int (N,) in [0, classes).
    transform : Callable[[Tensor], Tensor] | None (default: None)
        Applied to each batch of inputs first (e.g. uint8 images to floats, no
        augmentation); None: floating inputs are cast to the encoder's dtype.
    steps : int (default: 1000)
        The classifier's LARS steps.
    seed : int (default: 0)
        The classifier's batch order.

    Returns
    -------
    float
        Accuracy on ``test``, in [0, 1].
    """
    from dcco.config import EvalConfig
    from dcco.evaluate.probe import linear_probe_features

    (x_train, y_train), (x_test, y_test) = train, test
    y_train, y_test = torch.as_tensor(y_train).long(), torch.as_tensor(y_test).long()
    for name, x, y in (("train", x_train, y_train), ("test", test[0], y_test)):
        if y.dim() != 1 or len(y) != len(x):
            raise ArgumentError(f"linear_probe: {name}'s labels must be one int a sample, "
                                f"({len(x)},), got shape {tuple(y.shape)}")
        if len(y) and int(y.min()) < 0:
            raise ArgumentError(f"linear_probe: {name}'s labels must be classes 0, 1, ..., "
                                f"got {int(y.min())}")
    classes = int(max(y_train.max(), y_test.max())) + 1
    result = linear_probe_features(encoder_features(encoder, x_train, transform), y_train,
                                   encoder_features(encoder, x_test, transform), y_test,
                                   classes, EvalConfig(probe_steps=steps), seed)
    return result.accuracy


# ------------------------------------------------------------------------------ the simulator


@dataclass(frozen=True)
class FitResult:
    """What ``fit`` returns.

    Attributes
    ----------
    model : DualEncoder
        The trained ``DualEncoder`` (your encoder is ``model.backbone``; it is the very
        module you passed, trained in place).
    run_dir : Path
        The run directory (``config.toml``, ``metrics.jsonl``, checkpoints,
        ``summary.json``), which ``dcco.load_encoder(run_dir, model=your_encoder)`` reads.
    summary : dict[str, Any]
        The run's summary (rounds, final loss, the collapse figures, ...).
    history : tuple[dict[str, Any], ...] (default: ())
        The run's records by round, as logged every ``train.log_every`` rounds:
        ``round``, ``loss`` (the mean over the rounds since the last record), ``lr``, and
        for a method that shares statistics the collapse figures of the round's pooled
        statistics (``dead_dims``, ``corr_diag``, ``eff_rank``, ``max_var``,
        ``median_var``); a run that was continued holds its earlier rounds' records too.
    collapse, collapse_warning
        See the properties.
    """

    model: DualEncoder
    run_dir: Path
    summary: dict[str, Any]
    history: tuple[dict[str, Any], ...] = ()

    @property
    def collapse(self) -> dict[str, float] | None:
        """The last collapse figures (``dead_dims``, ``corr_diag``, ``eff_rank``, ``max_var``,
        ``median_var`` and their ``round``; ``dcco.core.collapse``), or None if none were
        read."""
        return self.summary.get("collapse")

    @property
    def collapse_warning(self) -> str | None:
        """The run's collapse warning (shown once when it was given), or None."""
        return self.summary.get("collapse_warning")


def fit(encoder: nn.Module, clients: Mapping[Hashable, Tensor] | Samples, *, rounds: int,
        augment: Callable[[Tensor], Tensor] | None = None, method: str = "dcco",
        clients_per_round: int = USER.clients_per_round,
        projector: Iterable[int] | None = USER.projector,
        run_dir: str | Path | None = None, seed: int = 0, progress: bool | None = None,
        settings: Iterable[str] | Mapping[str, Any] = (),
        on_round: Callable[[int, DualEncoder], None] | None = None) -> FitResult:
    """Train your encoder with ``method`` over your clients in dcco's batched simulator.

    fit's defaults are those for a user's own model (``dcco.config.USER``), chosen by
    measurement on such models (docs/results/learning-value.md): Adam at 1e-3
    after 10 warm-up rounds, cosine over the run; λ = 5 (``loss.lambd``; the paper's 20 suits
    its 1024-wide projector); a projector of 512³; 32 clients a round; dcco's own blur and the
    k-NN monitor off. ``settings`` changes any of them.

    Every round samples ``clients_per_round`` clients, makes two views of their samples
    with ``augment`` and runs the method's round over them in one forward and backward: for
    DCCO the exact round (one centralized step on the pooled batch, as
    ``settings=['train.backend="reference"']``, which runs the clients one by one, gives).
    The run directory is ``dcco pretrain``'s: metrics, atomic checkpoints, a summary; an
    interrupted ``fit`` with the same ``run_dir`` and arguments continues from its last
    checkpoint, to the same weights. With more ``rounds`` and nothing else changed, it trains
    on from where the run ended, to the weights one run of the new total gives, when no
    setting depends on the run's length; the default cosine decay of the server rate does
    (its rate at round 1 depends on the total), so continuing such a run is refused, naming
    the setting, and a run meant to be extended sets ``optim.schedule = "constant"``
    (``dcco.run.extension``).

    >>> import tempfile, torch, dcco
    >>> g = torch.Generator().manual_seed(0)
    >>> clients = {k: torch.randn(4, 8, generator=g) for k in range(16)}  # 16 clients of 4
    >>> def jitter(x):                                   # a view: the sample, a little noise
    ...     return x + 0.1 * torch.randn_like(x)
    >>> encoder = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
    ...                               torch.nn.Linear(32, 16))
    >>> run = tempfile.mkdtemp() + "/run"
    >>> steady = {"optim.schedule": "constant", "train.log_every": 2}
    >>> result = dcco.fit(encoder, clients, rounds=4, augment=jitter, clients_per_round=4,
    ...                   projector=(32, 32), run_dir=run, progress=False, settings=steady)
    >>> [r["round"] for r in result.history], result.summary["rounds"]
    ([2, 4], 4)
    >>> longer = dcco.fit(encoder, clients, rounds=6, augment=jitter, clients_per_round=4,
    ...                   projector=(32, 32), run_dir=run, progress=False, settings=steady)
    >>> [r["round"] for r in longer.history], sorted(longer.collapse)[:2]
    ([2, 4, 6], ['corr_diag', 'dead_dims'])

    Parameters
    ----------
    encoder : nn.Module
        Your module, from a batch of views to (N, d) features (trained in place).
    clients : Mapping[Hashable, Tensor] | Samples
        Client id → that client's samples (a tensor (n_k, ...) each: images, float
        vectors, token ids, anything ``encoder`` and ``augment`` take), or
        ``dcco.data.Samples``.
    rounds : int
        Server rounds.
    augment : Callable[[Tensor], Tensor] | None (default: None)
        One view of a batch of stored samples (``dcco.run.pretraining.Pretraining``'s
        ``augment``), called twice a round, for samples of any kind (dcco's own
        augmentation then stays off: ``augment.enabled = false``); None: dcco's BYOL
        augmentation, which needs uint8 (N, C, H, W) images with C = 1 or 3.
    method : str (default: 'dcco')
        Any federated method (``dcco``, ``dvicreg``, ``cco_fedavg``,
        ``contrastive_fedavg``, ...). BYOL's, SimSiam's and MoCo's (``byol_fedavg``,
        ``fedu``, ``fedema``, ``simsiam_fedavg``, ``moco_fedavg``) train your encoder
        with their predictor and target network around it (``dcco.dual_encoder``'s
        ``method``; the predictor's widths: ``model.predictor`` in ``settings``).
    clients_per_round : int (default: 32)
        K (default 32).
    projector : Iterable[int] | None (default: (512, 512, 512))
        The projector's widths (default 512, 512, 512), or None for none.
    run_dir : str | Path | None (default: None)
        Where the run is written; None: ``runs/fit-<method>-<time>``.
    seed : int (default: 0)
        The run's seed (client sampling, augmentation, the projector's initialisation).
    progress : bool | None (default: None)
        A progress bar (None: on a terminal).
    settings : Iterable[str] | Mapping[str, Any] (default: ())
        Further settings of the run config, as ``section.key=value`` strings
        (``'optim.lr=0.5'``) or a mapping (``{"optim.lr": 0.5, "train.log_every": 1}``);
        every key and its default: docs/config.md (``dcco config --list``).
    on_round : Callable[[int, DualEncoder], None] | None (default: None)
        Called after every round with the rounds done and the model (your encoder
        is ``model.backbone``), e.g. to probe the encoder as it trains; what it changes
        in the model is trained on, and its time counts in the run's.

    Returns
    -------
    FitResult
        A ``FitResult``: the trained model (your encoder, trained in place, is its
        ``backbone``), the run directory, the summary, and the loss and collapse figures by
        round (``history``).

    Raises
    ------
    dcco.ConfigError
        A bad setting (an unknown key or value, a key that is one of fit's
        own arguments, a centralized method), or a ``run_dir`` holding a run of other
        settings; named, before any file or folder is written.
    dcco.DataError
        Bad samples (no clients, a client of none, samples of different
        shapes, NaN or an infinity, named by client and sample; samples dcco's own
        augmentation cannot take); likewise before anything is written. Both are a
        ``dcco.UserError``, a ``ValueError``.
    dcco.Diverged
        The loss stopped being finite (a ``FloatingPointError``); its message
        names the round and the likely cause (the augmentation, the inputs or the rate),
        and no checkpoint holds the diverged model.
    dcco.ArgumentError
        An encoder that is not a module, or whose input width or output
        shape does not fit the samples ((N, d) encodings); ``settings`` given as one
        string. A ``dcco.UserError`` and a ``TypeError``.
    dcco.run.rundir.RunDirError
        A ``run_dir`` that is a file or lies under one, a
        folder that is not a dcco run directory, or one that another process is writing
        (a ``dcco.UserError``).
    """
    from dcco.run.loop import run_with_progress
    from dcco.run.setup import validate

    data = _fit_data(encoder, clients, augment)
    settings = setting_strings(settings)
    for item in settings:
        key = item.partition("=")[0].strip()
        if key in FIT_ARGUMENTS:
            raise ConfigError(f"fit: settings: {key} is fit's argument "
                              f"{FIT_ARGUMENTS[key]}=; give it there")
    dims = None if projector is None else [int(d) for d in projector]
    with arguments_of("fit", FIT_ARGUMENTS, kind=None):
        cfg = fit_config(method, rounds, clients_per_round, dims, seed, settings,
                         own_augment=augment is not None)
        validate(cfg)
    # with the method's predictor and target network around your encoder, if it has them
    # (validate has checked model.predictor against the method and the projector)
    model = dual_encoder(encoder, dims, sample=_model_input(data, augment, cfg), seed=seed,
                         method=method, predictor=cfg.model.predictor)
    record = {"class": _qualname(encoder), "feature_dim": model.feature_dim,
              "projector": dims, "augment": "yours" if augment is not None else "dcco",
              "data": _fingerprint(data)}
    path = _fresh_path(method) if run_dir is None else Path(run_dir)
    run, checked, resume = _fit_run(path, cfg, data, model, record)
    then = None if on_round is None else (lambda m, _latest: on_round(m.round, model))
    summary = run_with_progress(cfg, run, data, None, resume, progress is not False,
                                model=model, augment=augment, then=then, checked=checked)
    history = tuple(r for r in run.metrics() if "loss" in r)
    return FitResult(model, run.path, summary, history)


def _fit_data(encoder: nn.Module, clients: Mapping[Hashable, Tensor] | Samples,
              augment: Callable[[Tensor], Tensor] | None) -> Samples:
    """``fit``'s clients as ``Samples``, refused (named) where the encoder is no module or
    dcco's augmentation cannot take them."""
    if not isinstance(encoder, nn.Module):
        raise ArgumentError(f"encoder must be a torch.nn.Module (your network), not "
                            f"{type(encoder).__name__}")
    data = clients if isinstance(clients, Samples) else samples_of_clients(clients)
    if augment is None and not (data.x.dtype == torch.uint8 and data.x.ndim == 4
                                and data.x.shape[1] in (1, 3)):
        raise DataError(f"dcco's augmentation takes uint8 (N, C, H, W) images with 1 or 3 "
                        f"channels; these samples are {data.x.dtype} "
                        f"{tuple(data.x.shape[1:])}: pass augment=your_function")
    return data


def _fresh_path(method: str) -> Path:
    """A new run folder under ``runs/``, never an older run's."""
    from datetime import datetime

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / f"fit-{method}-{stamp}"
    for k in range(2, 1000):
        if not path.exists():
            break
        path = Path("runs") / f"fit-{method}-{stamp}-{k}"
    return path


def _fit_run(path: Path, cfg: RunConfig, data: Samples, model: nn.Module,
             record: dict[str, Any]) -> tuple[RunDir, Any, bool]:
    """``fit``'s run directory at ``path``: a new one, or the run it holds, resumed if its
    settings, encoder class, samples and augmentation are the same (extended if only its
    rounds grew); with the run's checks (``check_run``: the data scanned, the clients drawn
    and the stores checked once, for the whole run) and whether it resumes."""
    from dcco.run.setup import check_run

    resume = (path / "config.toml").is_file()
    if not resume:
        checked = check_run(cfg, data, model=model, run_dir=path)
        run = RunDir.create(path, cfg, FIT_WORDS)
        run.update_summary(user_model=record)
        return run, checked, False
    from dcco.run.rundir import config_differences

    run = RunDir.open(path)
    stored, longer = _stored_at(run, cfg)
    if differ := config_differences(stored, cfg):
        raise ConfigError(f"{shown(path)} holds a run with other settings ({differ}); "
                          f"give another run_dir=, or the same arguments to continue it")
    kept = run.summary().get("user_model", {})
    for key, what in (("class", "encoder class"), ("data", "clients' samples"),
                      ("augment", "augmentation (yours or dcco's)")):
        if key in kept and kept[key] != record[key]:
            raise ConfigError(f"{shown(path)} holds a run of another {what} "
                              f"({kept[key]!r}, now {record[key]!r}); give another "
                              f"run_dir=, or the same arguments to continue it")
    checked = check_run(cfg, data, model=model, run_dir=path)
    if longer:
        run.extend(cfg)
    run.update_summary(user_model=record)
    return run, checked, True


def _stored_at(run: RunDir, cfg: RunConfig) -> tuple[RunConfig, bool]:
    """The run's stored config to compare ``cfg`` with, and whether it is a longer run of it:
    the stored config at ``cfg``'s rounds when only the rounds differ and the run can train
    on to them as the run of that many rounds would (``ConfigError`` naming why not), else the
    stored config as it is."""
    from dataclasses import replace

    from dcco.run.checkpoint import checkpoint_rounds
    from dcco.run.extension import extension_refusal
    from dcco.run.rundir import config_differences

    stored = run.config()
    rounds = cfg.train.rounds
    longer = replace(stored, train=replace(stored.train, rounds=rounds))
    if stored.train.rounds == rounds or config_differences(longer, cfg):
        return stored, False
    done = checkpoint_rounds(run.checkpoint_path)
    if why := extension_refusal(stored, rounds, done):
        raise ConfigError(
            f"{shown(run.path)} holds {done} of {stored.train.rounds} rounds of this run, and "
            f"it cannot go on to {rounds} as the run of {rounds} rounds would: {why}. Give "
            f"another run_dir= to train {rounds} rounds from the start; a run whose settings "
            f"do not depend on its length (settings={{'optim.schedule': 'constant'}}) can be "
            f"extended")
    return longer, True


def setting_strings(settings: Iterable[str] | Mapping[str, Any]) -> list[str]:
    """``fit``'s settings as ``section.key=value`` strings: a mapping's values written as
    TOML (``{"optim.lr": 0.5}`` → ``optim.lr=0.5``), strings as they are."""
    from dcco.config import to_toml_value

    if isinstance(settings, str):
        raise ArgumentError("settings takes a list of 'section.key=value' strings or a mapping, "
                            f"not one string ({settings!r})")
    if isinstance(settings, Mapping):
        none = '"none"'  # how an optional setting is left unset
        return [f"{k}={none if v is None else to_toml_value(v)}" for k, v in settings.items()]
    return [str(item) for item in settings]


def fit_config(method: str, rounds: int, clients_per_round: int, projector: list[int] | None,
               seed: int, settings: list[str], own_augment: bool = False) -> RunConfig:
    """The run config of a ``fit``: the defaults for a user's model (``dcco.config.USER``: its
    server optimiser and λ), the samples' natural clients, dcco's augmentation off with
    ``own_augment`` (the user's), then ``settings``. ``fit``'s own arguments are set as
    values, each checked against its key's type, not written out as text to be parsed
    back."""
    values: dict[str, dict[str, Any]] = {
        "data": {"dataset": "samples", "partition": "natural"},
        "loss": {"lambd": USER.lambd},
        "train": {"method": method, "rounds": rounds, "clients_per_round": clients_per_round,
                  "seed": seed, "knn_every": 0},
        "augment": {"blur_p": [0.0, 0.0], "enabled": not own_augment},
    }
    if projector is not None:
        values["model"] = {"projector": list(projector)}
    base = from_dict(RunConfig, values, "", base=RunConfig(optim=USER.optim))
    cfg = resolved(load_config(None, settings, base=base))
    if not METHODS[cfg.train.method].federated:
        raise ConfigError(f"method: {cfg.train.method} is centralized; fit trains over "
                          f"clients")
    return cfg


def fit_defaults() -> list[tuple[str, Any, Any]]:
    """Every key whose value under ``fit``'s defaults (a ``dcco`` run with fit's default
    arguments) differs from the config's own default: ``(key, config default, fit's)``, in
    the config's order. The data keys, which only name fit's samples, and the keys a run
    resolves from ``"auto"`` are left out."""
    from dataclasses import asdict

    fitted = fit_config("dcco", 1, USER.clients_per_round, list(USER.projector), 0, [])
    plain = asdict(RunConfig())
    out = []
    for section, values in asdict(fitted).items():
        for key, value in values.items():
            if (value != plain[section][key] and section != "data" and key != "rounds"
                    and plain[section][key] != "auto"):  # "auto" is resolved, not changed
                out.append((f"{section}.{key}", plain[section][key], value))
    return out


def defaults_section(markdown: bool = True) -> str:
    """docs/config.md's last section (``dcco config``): where ``dcco.fit`` and
    ``dcco.flower.DCCOStrategy`` set other defaults than a config file's, and which."""
    def shown_value(v: Any) -> str:
        return str(list(v) if isinstance(v, tuple) else v)

    rows = fit_defaults()
    strategy = (f"`dcco.flower.DCCOStrategy` takes the same server optimiser and λ as "
                f"arguments, with "
                f"the same defaults: `optimizer={USER.optim.optimizer!r}`, `lr={USER.optim.lr}`, "
                f"`weight_decay={USER.optim.weight_decay}`, "
                f"`warmup_rounds={USER.optim.warmup_rounds}`, `lambd={USER.lambd}`; its "
                f"model is the user's own, so it has no projector, and its nodes answer "
                f"with their own views.")
    intro = ("A user's own model is not the network the paper's recipe was tuned on, so "
             "`dcco.fit` and the Flower strategy `dcco.flower.DCCOStrategy` start from other "
             "defaults for the keys below (`dcco.config.USER`, chosen by measurement: "
             "docs/results/learning-value.md). A config file, `dcco pretrain` "
             "and `dcco demo` keep the defaults above; `fit(settings=...)` changes these as "
             "any other key.")
    if not markdown:
        lines = ["[defaults for your own model]  " + intro]
        lines += [f"  {k} = {shown_value(f)}   (a config file's: {shown_value(c)})"
                  for k, c, f in rows]
        return "\n".join([*lines, "  " + strategy]) + "\n"
    lines = ["## Defaults for your own model", "", intro, "",
             "| key | a config file's default | `dcco.fit`'s default |", "|---|---|---|"]
    lines += [f"| `{k}` | `{shown_value(c)}` | `{shown_value(f)}` |" for k, c, f in rows]
    return "\n".join([*lines, "", strategy]) + "\n"


def _model_input(data: Samples, augment: Callable[[Tensor], Tensor] | None,
                 cfg: RunConfig) -> Tensor:
    """One model input (no batch dimension), to measure the encoder's output width."""
    from dcco.data.augment import model_input
    from dcco.run.views import user_views

    first = data.x[:1]
    if augment is not None:
        return user_views(augment, first, cfg.train.seed, 0, torch.float32)[0][0]
    return model_input(first)[0]


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


__all__ = ["FIT_ARGUMENTS", "FitResult", "defaults_section", "encoder_features", "fit",
           "fit_config", "fit_defaults", "linear_probe", "setting_strings"]
