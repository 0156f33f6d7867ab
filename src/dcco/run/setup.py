"""What a run makes of its config before anything is written: the checks across sections that
need a method, a model or the machine (``validate``), ``auto`` made concrete (``resolved``,
``speed_of``), the model it builds (``projector``, ``head``, ``build_model``), and its data and
partition checked against it (``check_data``, ``check_run``).

The config itself (``dcco.config``) is plain data that imports no method, model or torch;
these are its run-side checks, each raising a ``ConfigError`` that names the key to change.

A run is checked once, and the check is a value: ``check_run`` scans the data, builds the
partition and the model and sizes the stores, and returns them as a ``CheckedRun``, which
``dcco.run.pretraining.Pretraining`` takes as it is. The config checks alone (``validate``,
``resolved``) read neither data nor model, and cost nothing to repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dcco.config import ConfigError, RunConfig
from dcco.core.distributed import rank_and_size
from dcco.core.precision import Speed, check, resolve
from dcco.data.augment import is_image
from dcco.data.paired import Dataset, is_paired
from dcco.data.partition import Partition
from dcco.data.samples import refuse_non_finite
from dcco.methods.predictive import PredictiveMethod
from dcco.methods.registry import METHODS, build_method
from dcco.models import DualEncoder, Head, InputShape, build_dual_encoder, check_inputs
from dcco.run.algorithms import algorithm_of
from dcco.run.device_plan import resolve_device
from dcco.run.planning import build_partition
from dcco.run.privacy_plan import Privacy
from dcco.run.stores import STATES_FOLDER, check_stores


def validate(cfg: RunConfig) -> RunConfig:
    """``cfg``, checked across sections against its method: the method's round settings (as
    ``dcco.core.algorithm.Algorithm`` takes them), its head, its norm against its clients'
    batches and its data against its clients' sizes, and ``auto`` resolvable on this machine.
    Reads no data and builds no model.

    Raises:
        ConfigError: naming the key to change.
    """
    try:
        _validate(cfg)
    except ConfigError:
        raise
    except ValueError as e:  # the algorithm's and the precision's checks name the keys
        raise ConfigError(str(e)) from None
    return cfg


def _validate(cfg: RunConfig) -> None:
    method = METHODS[cfg.train.method]
    t = cfg.train
    algorithm_of(cfg)
    if t.absent_statistics == "cached" and method.stats is None:
        raise ConfigError(f"train.absent_statistics = 'cached' keeps clients' shared "
                          f"statistics; {method.name} shares none")
    if cfg.privacy.enabled and not method.federated:
        raise ConfigError(f"privacy is client-level differential privacy for federated "
                          f"methods; {method.name} is centralized (set "
                          f"privacy.noise_multiplier = 0 and privacy.target_epsilon = "
                          f"\"none\")")
    if cfg.privacy.enabled and method.stateful:
        raise ConfigError(f"{method.name}'s clients keep their own model and send it mixed "
                          f"with the global one; client-level differential privacy clips "
                          f"and noises updates from the global model, which is not "
                          f"implemented for it (set privacy.noise_multiplier = 0 and "
                          f"privacy.target_epsilon = \"none\")")
    predictive = issubclass(method, PredictiveMethod)
    if cfg.model.predictor is not None and not (predictive and method.has_predictor):
        raise ConfigError(f"model.predictor is BYOL's and SimSiam's head; {method.name} has "
                          f"none (leave model.predictor unset)")
    if cfg.model.predictor is not None and cfg.model.predictor[-1] != projector(cfg)[-1]:
        raise ConfigError(f"model.predictor must end in the projection width "
                          f"{projector(cfg)[-1]} (the last of the projector), got "
                          f"{list(cfg.model.predictor)}")
    if predictive and not cfg.model.shared:
        raise ConfigError(f"{method.name} needs one network for both views "
                          f"(model.shared = true)")
    if cfg.model.norm == "bn" and method.federated:
        smallest = min(cfg.data.samples_per_client, t.local_batch or
                       cfg.data.samples_per_client)
        if smallest < 2:
            raise ConfigError(
                f"model.norm = 'bn' normalises over a client's batch, which needs at least "
                f"2 samples; {method.name} gives its clients batches of {smallest} "
                f"(data.samples_per_client, train.local_batch). Use model.norm = 'gn'")
    if (cfg.data.samples_per_client < method.min_client_samples
            and cfg.data.partition == "dirichlet"):
        raise ConfigError(
            f"train.method {method.name!r} computes its loss within each client and needs "
            f"data.samples_per_client >= {method.min_client_samples}, got "
            f"{cfg.data.samples_per_client}")
    check(speed_of(cfg), _device_type(t.device))


def speed_of(cfg: RunConfig) -> Speed:
    """The encoders' precision, compile mode and memory format (``auto`` resolved for
    ``train.device``)."""
    t = cfg.train
    batched = t.backend == "batched" and t.local_steps == 1 and t.local_batch is None
    precision, compile = resolve(t.precision, t.compile, _device_type(t.device), batched)
    if compile == "cudagraphs" and not batched:
        raise ConfigError("train.compile = 'cudagraphs' needs rounds of one batch "
                          "(train.backend = 'batched', one local step on all of a client's "
                          "samples); use 'on' or 'off'")
    return Speed(precision, compile, t.channels_last)


def resolved(cfg: RunConfig) -> RunConfig:
    """``cfg`` validated (``validate``), with every ``auto`` of ``[train]``'s precision and
    compile made concrete for ``train.device`` on this machine: what a run directory stores.

    Raises:
        ConfigError: naming the key to change.
    """
    validate(cfg)
    s = speed_of(cfg)
    return replace(cfg, train=replace(cfg.train, precision=s.precision, compile=s.compile))


def projector(cfg: RunConfig) -> tuple[int, ...]:
    """The projector widths: the model's, or the method's paper default."""
    return cfg.model.projector or METHODS[cfg.train.method].default_projector


def head(cfg: RunConfig) -> Head | None:
    """BYOL's or SimSiam's predictor and target (``model.predictor`` or the method's
    default), or None for the other methods."""
    method = METHODS[cfg.train.method]
    if not issubclass(method, PredictiveMethod):
        return None
    return Head(cfg.model.predictor or method.default_predictor(projector(cfg)),
                method.target)


def build_model(cfg: RunConfig, in_channels: InputShape,
                y_shape: InputShape | None = None) -> DualEncoder:
    """The run's dual encoder, initialised from ``train.seed`` (on the CPU, float32).

    Args:
        in_channels: the first input's channels, or one sample's shape; a data set's
            ``input_shapes`` gives both (``build_model(cfg, *data.input_shapes)``).
        y_shape: the second input's shape, for pairs of two modalities; None: the same.
    """
    return build_dual_encoder(cfg.model, in_channels, projector(cfg), cfg.train.seed,
                              head(cfg), y_shape)


def check_data(cfg: RunConfig, dataset: Any, towers: bool = True, scan: bool = True) -> None:
    """Refuse a training set ``cfg`` cannot train on, before any run starts: images for a
    paired ``data.dataset`` (or pairs for an image one), configured towers that cannot read
    their inputs (``towers``: false for towers the user builds), samples holding NaN or an
    infinity (``scan``: false leaves the one pass over every value to ``check_run``), or
    augmentation asked of a modality that is not images.

    Raises:
        ConfigError: naming the key to change.
        DataError: a sample holds NaN or an infinity (naming its client and which sample).
    """
    if dataset.paired != is_paired(cfg.data.dataset):
        fix = ("set data.dataset = 'pairs' for pairs built in code (or 'paired_npz' for "
               "files)" if dataset.paired else "set data.dataset to its image data set")
        raise ConfigError(f"data.dataset = {cfg.data.dataset!r} but the training set "
                          f"{dataset.name!r} holds "
                          f"{'pairs' if dataset.paired else 'images'}; {fix}")
    if cfg.data.partition == "natural" and getattr(dataset, "clients", None) is None:
        raise ConfigError(f"data.partition = 'natural' needs a client id per sample, and "
                          f"{dataset.name!r} has none")
    x_shape, y_shape = dataset.input_shapes
    if towers and dataset.paired and x_shape != y_shape and head(cfg) is not None:
        raise ConfigError(f"{cfg.train.method} needs one network for both inputs, but X "
                          f"and Y of {dataset.name!r} have shapes {x_shape} and {y_shape}")
    if towers:
        try:
            check_inputs(cfg.model, x_shape, y_shape if dataset.paired else None)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    for tower in range(1 + dataset.paired) if scan else ():
        refuse_non_finite(dataset.inputs(tower),
                          f"the training set {dataset.name!r}"
                          + (f" (tower {tower})" if dataset.paired else ""),
                          getattr(dataset, "clients", None),
                          getattr(dataset, "client_names", None))
    for tower, key in enumerate(("augment", "augment_y")[: 1 + dataset.paired]):
        sample = dataset.inputs(tower)
        if getattr(cfg, key).enabled and not is_image(sample):
            raise ConfigError(f"{key}.enabled = true augments images, but "
                              f"{'X' if tower == 0 else 'Y'} of {dataset.name!r} holds "
                              f"{sample.dtype} samples of shape {tuple(sample.shape[1:])}; "
                              f"set {key}.enabled = false")


def check_partition(cfg: RunConfig, partition: Any) -> None:
    """``ConfigError`` when a round asks for more clients than the partition has."""
    if METHODS[cfg.train.method].federated and cfg.train.clients_per_round > \
            partition.num_clients:
        raise ConfigError(
            f"train.clients_per_round = {cfg.train.clients_per_round} but the partition has "
            f"only {partition.num_clients} clients"
            + (" large enough for the method" if cfg.data.partition == "natural" else ""))


@dataclass(frozen=True)
class CheckedRun:
    """A run ``check_run`` found able to start: its config, its data, and what it built from
    them, which ``Pretraining`` takes as they are (no second scan, partition or model)."""

    cfg: RunConfig
    train_set: Dataset
    partition: Partition
    model: DualEncoder
    """The dual encoder to train: the config's, built from ``train.seed`` (CPU, float32), or
    the caller's own."""
    state_dir: Path | None
    """Where the clients' states go with ``train.client_state_store = "disk"``; None: a
    temporary folder."""
    holds_client_states: bool
    """Whether this process keeps the clients' states (a Flower server does not)."""
    users_model: bool
    """Whether ``model`` is the caller's (its towers are theirs, not ``cfg.model``'s)."""
    privacy: Privacy | None = None
    """Differential privacy's accounting (``[privacy]`` on), made once here and used as it
    is by ``Pretraining``; None without privacy."""


def check_run(cfg: RunConfig, train_set: Dataset, *, model: DualEncoder | None = None,
              partition: Partition | None = None, run_dir: Path | None = None,
              state_dir: Path | None = None, rounds_to_run: int | None = None,
              holds_client_states: bool = True) -> CheckedRun:
    """Everything ``Pretraining`` refuses about a config and its data, checked before a run
    directory or any other file is created (``load_splits`` has checked the data against the
    config), and what was built on the way: the device, the config across its sections
    (``validate``), the data against the config (``check_data``: scanned once, here), the
    partition's clients against a round's (``check_partition``), differential privacy's
    accounting, and the stores kept beside the model (``check_stores``).

    Args:
        model: the caller's own dual encoder (``dcco.fit``'s); None: the config's, built here.
        partition: the clients, where the caller has them; None: ``build_partition``.
        run_dir: where the run will be; its ``client_states`` folder is ``state_dir``.
        state_dir: the clients' states' folder on disk, without a ``run_dir``.
        rounds_to_run, holds_client_states: see ``Pretraining``.

    Raises:
        ConfigError: naming the key to change.
        DataError: a sample holds NaN or an infinity.
    """
    resolve_device(cfg.train.device)
    validate(cfg)
    users_model = model is not None
    check_data(cfg, train_set, towers=not users_model)
    if partition is None:
        partition = build_partition(cfg, train_set)
    check_partition(cfg, partition)
    method = build_method(cfg.train.method, cfg.loss)
    world = rank_and_size()[1]
    if world > 1 and not method.federated and method.name != "centralized_cco":
        raise ConfigError(
            f"{method.name} over several ranks is not supported: a centralized batch is split "
            f"over the ranks and run as DCCO, which is exact for CCO alone; run it in one "
            f"process")
    if world > 1 and cfg.train.client_weighting != "samples":
        raise ConfigError("train.client_weighting = 'uniform' runs in one process: the ranks "
                          "of torch.distributed weigh their shares by sample count")
    privacy = Privacy.of(cfg, partition, method) if cfg.privacy.enabled else None
    if model is None:
        model = build_model(cfg, *train_set.input_shapes)
    if run_dir is not None:
        state_dir = Path(run_dir) / STATES_FOLDER
    check_stores(cfg, method, model, partition.num_clients, world=world,
                 state_dir=state_dir, rounds_to_run=rounds_to_run,
                 client_states=holds_client_states)
    return CheckedRun(cfg, train_set, partition, model, state_dir, holds_client_states,
                      users_model, privacy)


def _device_type(device: str) -> str:
    """The device type a ``train.device`` value runs on, here ("auto": CUDA when present)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":")[0]


__all__ = ["CheckedRun", "build_model", "check_data", "check_partition", "check_run", "head", "projector",
           "resolved", "speed_of", "validate"]
