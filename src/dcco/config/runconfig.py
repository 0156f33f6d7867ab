"""``RunConfig``: every section nested into one run's config, checked across sections when it
is built (a method, its round settings, its model and its data must fit together)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any

from dcco.core.algorithm import Algorithm
from dcco.core.optim import OptimConfig
from dcco.core.precision import Speed, check, resolve
from dcco.core.privacy import PrivacyConfig
from dcco.data.augment import AugmentConfig, is_image
from dcco.data.paired import is_paired
from dcco.data.tables import TableConfig, ham10000_table
from dcco.evaluate import EvalConfig
from dcco.methods.base import LossConfig
from dcco.methods.predictive import PredictiveMethod
from dcco.methods.registry import METHODS
from dcco.models import (
    DualEncoder,
    Head,
    InputShape,
    ModelConfig,
    build_dual_encoder,
    check_inputs,
)

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass



from dcco.config.sections import ConfigError, DataConfig, TrainConfig, local_sgd


@dataclass(frozen=True)
class RunConfig:
    """Everything a pretraining run needs, section by section."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    augment_y: AugmentConfig = field(default_factory=AugmentConfig)
    """The second modality's augmentation, for paired data sets (``augment`` is the first's)."""
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    table: TableConfig = field(default_factory=TableConfig)
    """The client table of ``data.dataset = "client_table"`` (its image settings serve
    ``ham10000`` too)."""

    def __post_init__(self) -> None:
        method = METHODS[self.train.method]
        t = self.train
        Algorithm(method(), t.local_lr, t.local_steps, t.local_batch, t.staleness,
                  t.stale_after, pseudo_gradient=t.pseudo_gradient,
                  local_statistics=t.local_statistics,
                  local_optimizer=t.local_optimizer, stale_statistics=t.stale_statistics,
                  aggregate_decay=t.aggregate_decay, client_weighting=t.client_weighting,
                  local_sgd=local_sgd(t))  # their checks name the train.* keys
        if t.absent_statistics == "cached":
            if method.stats is None:
                raise ValueError(f"train.absent_statistics = 'cached' keeps clients' shared "
                                 f"statistics; {method.name} shares none")
            if t.staleness:
                raise ValueError("train.absent_statistics = 'cached' takes fresh statistics "
                                 "each round; it needs train.staleness = 0")
            if self.privacy.enabled:
                raise ValueError("train.absent_statistics = 'cached' keeps each client's own "
                                 "statistics at the server, which differential privacy "
                                 "forbids; use 'drop' with [privacy]")
        if t.own_weight != "exact" and t.local_statistics != "own":
            raise ValueError("train.own_weight weighs a client's own statistics in its local "
                             "steps; it needs train.local_statistics = 'own'")
        if self.privacy.enabled and not method.federated:
            raise ValueError(f"privacy is client-level differential privacy for federated "
                             f"methods; {method.name} is centralized (set "
                             f"privacy.noise_multiplier = 0 and privacy.target_epsilon = "
                             f"\"none\")")
        predictive = issubclass(method, PredictiveMethod)
        if self.model.predictor is not None and not predictive:
            raise ValueError(f"model.predictor is BYOL's and SimSiam's head; {method.name} has "
                             f"none (leave model.predictor unset)")
        if self.model.predictor is not None and self.model.predictor[-1] != self.projector[-1]:
            raise ValueError(f"model.predictor must end in the projection width "
                             f"{self.projector[-1]} (the last of the projector), got "
                             f"{list(self.model.predictor)}")
        if predictive and not self.model.shared:
            raise ValueError(f"{method.name} needs one network for both views "
                             f"(model.shared = true)")
        if self.model.norm == "bn" and method.federated:
            smallest = min(self.data.samples_per_client, self.train.local_batch or
                           self.data.samples_per_client)
            if smallest < 2:
                raise ValueError(
                    f"model.norm = 'bn' normalises over a client's batch, which needs at least "
                    f"2 samples; {method.name} gives its clients batches of {smallest} "
                    f"(data.samples_per_client, train.local_batch). Use model.norm = 'gn'")
        if self.augment_y != AugmentConfig() and not is_paired(self.data.dataset):
            raise ValueError(f"[augment_y] configures the second modality of paired data; "
                             f"{self.data.dataset} holds images, whose two views both follow "
                             f"[augment]")
        if self.data.dataset == "paired_npz" and self.data.data_dir is None:
            raise ValueError("data.dataset = 'paired_npz' reads train.npz and test.npz from "
                             "data.data_dir; set it (or pass --data-dir)")
        if self.table != TableConfig() and self.data.dataset not in ("client_table",
                                                                     "ham10000"):
            raise ValueError(f"[table] describes a client table (data.dataset = "
                             f"'client_table' or 'ham10000'); {self.data.dataset} is not one")
        if self.data.dataset == "ham10000":
            fixed = ham10000_table(TableConfig())
            clash = [k for k in ("file", "test_file", "image_column", "label_column",
                                 "client_column", "split_column", "image_folders",
                                 "image_suffix")
                     if getattr(self.table, k) != getattr(TableConfig(), k)
                     and getattr(self.table, k) != getattr(fixed, k)]
            if clash:
                raise ValueError(f"data.dataset = 'ham10000' has its own files and columns; "
                                 f"table.{clash[0]} is for data.dataset = 'client_table' "
                                 f"(HAM10000 takes table.image_size, channels, test_fraction "
                                 f"and split_seed)")
        if (self.data.samples_per_client < method.min_client_samples
                and self.data.partition == "dirichlet"):
            raise ValueError(
                f"train.method {method.name!r} computes its loss within each client and needs "
                f"data.samples_per_client >= {method.min_client_samples}, got "
                f"{self.data.samples_per_client}"
            )

    @property
    def speed(self) -> Speed:
        """The encoders' precision, compile mode and memory format (``auto`` resolved for
        ``train.device``)."""
        t = self.train
        batched = t.backend == "batched" and t.local_steps == 1 and t.local_batch is None
        precision, compile = resolve(t.precision, t.compile, _device_type(t.device), batched)
        if compile == "cudagraphs" and not batched:
            raise ValueError("train.compile = 'cudagraphs' needs rounds of one batch "
                             "(train.backend = 'batched', one local step on all of a client's "
                             "samples); use 'on' or 'off'")
        return Speed(precision, compile, t.channels_last)

    def resolved(self) -> RunConfig:
        """This config with every ``auto`` of ``[train]``'s precision and compile made
        concrete for ``train.device`` on this machine: what a run directory stores."""
        try:
            s = self.speed
            check(s, _device_type(self.train.device))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return replace(self, train=replace(self.train, precision=s.precision, compile=s.compile))

    @property
    def projector(self) -> tuple[int, ...]:
        """The projector widths: the model's, or the method's paper default."""
        return self.model.projector or METHODS[self.train.method].default_projector

    @property
    def head(self) -> Head | None:
        """BYOL's or SimSiam's predictor and target (``model.predictor`` or the method's
        default), or None for the other methods."""
        method = METHODS[self.train.method]
        if not issubclass(method, PredictiveMethod):
            return None
        return Head(self.model.predictor or method.default_predictor(self.projector),
                    method.target)

    def check_data(self, dataset: Any, towers: bool = True) -> None:
        """Refuse a training set this config cannot train on, before any run starts: images
        for a paired ``data.dataset`` (or pairs for an image one), configured towers that
        cannot read their inputs (``towers``: false for towers the user builds), or
        augmentation asked of a modality that is not images.

        Raises:
            ConfigError: naming the key to change.
        """
        if dataset.paired != is_paired(self.data.dataset):
            fix = ("set data.dataset = 'pairs' for pairs built in code (or 'paired_npz' for "
                   "files)" if dataset.paired else "set data.dataset to its image data set")
            raise ConfigError(f"data.dataset = {self.data.dataset!r} but the training set "
                              f"{dataset.name!r} holds "
                              f"{'pairs' if dataset.paired else 'images'}; {fix}")
        if self.data.partition == "natural" and getattr(dataset, "clients", None) is None:
            raise ConfigError(f"data.partition = 'natural' needs a client id per sample, and "
                              f"{dataset.name!r} has none")
        x_shape, y_shape = dataset.input_shapes
        if towers and dataset.paired and x_shape != y_shape and self.head is not None:
            raise ConfigError(f"{self.train.method} needs one network for both inputs, but X "
                              f"and Y of {dataset.name!r} have shapes {x_shape} and {y_shape}")
        if towers:
            try:
                check_inputs(self.model, x_shape, y_shape if dataset.paired else None)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        for tower, key in enumerate(("augment", "augment_y")[: 1 + dataset.paired]):
            sample = dataset.inputs(tower)
            if getattr(self, key).enabled and not is_image(sample):
                raise ConfigError(f"{key}.enabled = true augments images, but "
                                  f"{'X' if tower == 0 else 'Y'} of {dataset.name!r} holds "
                                  f"{sample.dtype} samples of shape {tuple(sample.shape[1:])}; "
                                  f"set {key}.enabled = false")

    def build_model(self, in_channels: InputShape,
                    y_shape: InputShape | None = None) -> DualEncoder:
        """The run's dual encoder, initialised from ``train.seed`` (on the CPU, float32).

        Args:
            in_channels: the first input's channels, or one sample's shape; a data set's
                ``input_shapes`` gives both (``cfg.build_model(*data.input_shapes)``).
            y_shape: the second input's shape, for pairs of two modalities; None: the same.
        """
        return build_dual_encoder(self.model, in_channels, self.projector, self.train.seed,
                                  self.head, y_shape)


def _device_type(device: str) -> str:
    """The device type a ``train.device`` value runs on, here ("auto": CUDA when present)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":")[0]


