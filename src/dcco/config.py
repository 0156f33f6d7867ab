"""The run configuration: frozen dataclasses nested into one ``RunConfig``, loaded from TOML.

Every section is the narrow config of one module (``data``, ``model``, ``augment``, ``loss``,
``train``, ``optim``, ``eval``), with the paper's values as defaults. Loading checks every key
against the field names and types: an unknown key or a bad value is a ``ConfigError`` that names
the key and says what is allowed. Optional fields take the string ``"none"``.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from dcco.algorithm import Algorithm
from dcco.augment import AugmentConfig, is_image
from dcco.client import LocalSGD
from dcco.data.paired import is_paired
from dcco.data.tables import TableConfig, ham10000_table
from dcco.errors import UserError
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
from dcco.optim import OptimConfig
from dcco.precision import Compile, Precision, Speed, check, resolve
from dcco.privacy import PrivacyConfig
from dcco.scalars import INSTALL_HINT, tensorboard_available

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(UserError):
    """A configuration key is unknown or its value is invalid."""


DatasetName = Literal["fashion_mnist", "cifar10", "cifar100", "fashion_mnist_halves",
                      "paired_npz", "pairs", "client_table", "ham10000", "fed_cifar100",
                      "fed_emnist", "samples"]
CLIENT_DATASETS = ("client_table", "ham10000", "fed_cifar100", "fed_emnist", "samples")
"""Data sets whose images come in natural clients (a client id per image)."""


@dataclass(frozen=True)
class DataConfig:
    """Which data, and how it is split into clients (Hsu, Qi & Brown 2019)."""

    dataset: DatasetName = "fashion_mnist"
    """Images (fashion_mnist, cifar10, cifar100: two augmented views of each), or pairs of two
    modalities (``dcco.data.paired``): fashion_mnist_halves (left and right halves),
    paired_npz (the user's train.npz and test.npz in data_dir), or pairs (a PairedDataset
    that the user's code passes to ``dcco.train.Pretraining``); or images in natural
    clients (``CLIENT_DATASETS``, docs/data.md): client_table (a CSV or Parquet table,
    section ``[table]``), ham10000 (HAM10000 by lesion), fed_cifar100 and fed_emnist (TFF's
    h5 files), or samples (tensors and their clients that the user's code passes to
    ``dcco.fit``: ``dcco.data.samples``)."""
    data_dir: str | None = None
    """Searched first; then $DCCO_DATA, ~/.cache/dcco and the Debian dataset folder."""
    alpha: float = 0.0
    """Dirichlet concentration of each client's class mix: 0 = one class per client, 1000 ≈ IID."""
    samples_per_client: int = 4
    """Samples of every client of a Dirichlet partition; with natural clients, only the
    centralized methods' batch (train.clients_per_round × this)."""
    num_clients: int | None = None
    """None: as many clients as the training split allows."""
    partition: Literal["dirichlet", "natural"] = "dirichlet"
    """"dirichlet": clients drawn from the labels (alpha, samples_per_client); "natural": one
    client per distinct client id of the data (``CLIENT_DATASETS``), of whatever size."""

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ValueError(f"data.alpha must be a finite number >= 0, got {self.alpha}")
        if self.samples_per_client < 1:
            raise ValueError(
                f"data.samples_per_client must be >= 1, got {self.samples_per_client}"
            )
        if self.num_clients is not None and self.num_clients < 1:
            raise ValueError(f"data.num_clients must be >= 1, got {self.num_clients}")
        if self.partition == "natural":
            if self.dataset not in CLIENT_DATASETS:
                raise ValueError(f"data.partition = 'natural' takes the clients a data set "
                                 f"comes in; {self.dataset} has none (natural clients: "
                                 f"{', '.join(CLIENT_DATASETS)})")
            if self.num_clients is not None:
                raise ValueError("data.num_clients sizes a Dirichlet partition; natural "
                                 "clients are as many as the data holds (leave it unset)")


@dataclass(frozen=True)
class TrainConfig:
    """Pretraining: the method, the round budget and how rounds run."""

    method: str = "dcco"
    """The method (``dcco.methods.registry``): dcco, cco_fedavg, contrastive_fedavg,
    centralized_cco (the paper's); dvicreg, vicreg_fedavg, fedsc, spectral_fedavg,
    centralized_byol, byol_fedavg, centralized_simsiam, simsiam_fedavg, clip_fedavg."""
    rounds: int = 100_000
    """Federated rounds, or centralized steps (paper: 100K rounds on CIFAR-100)."""
    clients_per_round: int = 128
    """K. Centralized methods use K × samples_per_client as their batch size."""
    local_lr: float = 1.0
    """Client SGD learning rate (paper: 1.0)."""
    local_steps: int = 1
    """E, client SGD steps per round (paper: 1), with the shared statistics held fixed."""
    local_batch: int | None = None
    """b, samples per local step; None: all of the client's samples."""
    local_statistics: Literal["fixed", "own"] = "fixed"
    """With E > 1: "fixed", every local step on the anchored loss L(S_k + sg(S_A − S_k)),
    whose value stays L(S_A) (linear in the client's statistics, so nothing stops a client
    that keeps stepping); "own", each step on L(S_A + (N_k/N)(S_k − S_k⁰))·N/N_k: the other
    clients' statistics held at S_A, the client's own followed as it moves. The first step is
    the same; methods that share statistics only."""
    own_weight: Literal["exact", "fedsc"] = "exact"
    """With ``local_statistics = "own"``, the weight of a client's own statistics in its local
    objective: "exact", N_k/N (one step is the centralized step); "fedsc", FedSC's α, from 1
    at the first round linearly to 0.2 at the last, with the other clients' average at 1 − α
    (Jing et al. 2024's code; not the centralized step even for one local step)."""
    local_momentum: float = 0.0
    """SGD momentum of the local steps (FedSC: 0.9), its buffer empty at every round's start."""
    local_weight_decay: float = 0.0
    """Weight decay of the local steps, added to each gradient as λθ (FedSC: 5e-4). Not the
    centralized step even for one local step."""
    local_grad_clip: float | None = None
    """Each local step's gradient clipped to this L2 norm over all parameters (FedSC: 3.0);
    none: no clipping. Not the centralized step even for one local step."""
    local_lr_schedule: Literal["constant", "cosine"] = "constant"
    """The local learning rate over the rounds: "constant", local_lr; "cosine",
    local_lr · ½(1 + cos(π r / R)) at round r of R (FedSC's clients, whose server averages
    the models: ``optim.name = "sgd"``, ``optim.lr = 1``)."""
    local_optimizer: Literal["sgd", "layerwise"] = "sgd"
    """With E > 1: "sgd", raw SGD steps of local_lr; "layerwise", each parameter tensor's
    step scaled by ‖θ₀‖/‖g‖ (θ₀ at the round's start; as LARS on the server), so local_lr
    is a relative step size: every tensor moves by local_lr of its norm per step. One step
    (E = 1) is the same either way."""
    pseudo_gradient: Literal["delta", "mean_gradient"] = "delta"
    """What the server optimiser steps on: "delta", −Σ_k (N_k/N) Δ_k (FedOpt; the paper's,
    with one local step of lr 1.0 this is the pooled gradient); "mean_gradient", that divided
    by local_lr × local_steps: the clients' mean gradient along their local steps, so the
    server's lr keeps its meaning whatever local_lr and E are (as local_lr → 0 it is the
    gradient on all of each client's samples)."""
    staleness: int = 0
    """0: each round's statistics are its own clients' (two exchanges per round); 1: the
    previous round's aggregate (one exchange per round)."""
    stale_after: int = 0
    """With staleness = 1: fresh statistics (two exchanges) for the rounds before this one, a
    warm-up, then the previous round's aggregate; 0: stale from the second round on."""
    stale_statistics: Literal["anchored", "own"] = "anchored"
    """With staleness = 1, a stale round's client loss: "anchored", at the previous aggregate
    A; "own", at the mix (N_k/N)·S_k + (1 − N_k/N)·A, the client's own statistics fresh."""
    aggregate_decay: float = 0.0
    """With staleness = 1: the statistics a stale round uses are an exponential moving
    average of the aggregates, β·A_prev + (1 − β)·A_new (0: the last round's)."""
    client_weighting: Literal["samples", "uniform"] = "samples"
    """How the server averages the clients' updates: "samples", by their share N_k/N of the
    round's samples (the exact round); "uniform", 1/K each (FedSC's code). They agree when a
    round's clients all hold as many samples (every Dirichlet partition); "uniform" runs in the
    simulator in one process."""
    absent_statistics: Literal["drop", "cached"] = "drop"
    """Statistics methods: "drop", a round's aggregate is its own clients' (exact);
    "cached", the server keeps every client's last statistics and merges those of the
    clients absent from a round into its aggregate (FedSC's partial participation,
    ``dcco.statistics_cache``; not a centralized step; without privacy; in the simulator,
    in one process or over torch.distributed's ranks, each keeping the same copy, and over
    Flower's plain exchanges, whose nodes then send each client's statistics; not under
    SecAgg+, which shows the server only their sum)."""
    backend: Literal["batched", "reference"] = "batched"
    """"batched": a round's clients in one forward and backward (exact for one local step on
    all of a client's samples); "reference": client by client, as a deployment runs them."""
    max_batch: int | Literal["auto"] | None = "auto"
    """The batched backend runs a round's clients in groups of whole clients of at most this
    many samples, one forward and backward a group, the gradients summed: the same round
    (``dcco.simulator.client_groups``), in less memory. None: all in one forward. "auto":
    256 on a CPU, where one forward of a few thousand images runs at about half the speed
    of its groups (docs/performance.md), each group forwarded once and its graph kept until
    its backward (the memory of the whole round's forward, as on a GPU); None on a GPU. A
    number bounds a forward's memory: a statistics method then forwards each group twice."""
    seed: int = 0
    """The run's seed: initialisation, partition, sampling and augmentation each draw from
    their own stream of it."""
    device: str = "auto"
    """"auto" (CUDA when present), "cpu", "cuda" or "cuda:N"."""
    precision: Precision = "auto"
    """The encoders' arithmetic: "float32"; "bf16", bfloat16 autocast of the backbones (weights,
    projectors and server optimiser in float32; statistics and losses in float64); "float64",
    for exactness checks; "auto", the fastest measured safe on the run's device
    (``dcco.precision.AUTO``), written out concretely in the run's config.toml."""
    compile: Compile = "auto"
    """torch.compile of the encoders: "off", "on", "cudagraphs" (CUDA graphs too, for rounds
    of one shape), or "auto" (``dcco.precision.AUTO``)."""
    channels_last: bool = False
    """NHWC memory format for the backbones (measure it: group norm can undo the gain)."""
    log_every: int = 10
    """Rounds between metrics records (loss, rates, the collapse figures)."""
    checkpoint_every: int = 500
    """Rounds between atomic checkpoints (and at the end)."""
    knn_every: int = 0
    """Rounds between k-NN monitor evaluations; 0 = only at the end."""
    probe_every: int = 0
    """Rounds between linear probes during pretraining (``eval.labels`` labels,
    ``eval.probe_steps`` steps, the run's own probe), each recorded as ``{"round", "probe"}``
    in metrics.jsonl: accuracy against rounds (and exchanges) by the ground truth that the
    k-NN monitor stands for, which reads differently below it from method to method. The
    probes draw no training randomness, so a run trains the same with them. 0: none."""
    tensorboard: bool = False
    """Also write the metrics and evaluations as TensorBoard scalars (RUN_DIR/tensorboard);
    needs ``pip install 'dcco[tensorboard]'``."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"train.method {self.method!r} is not a method; choose one of "
                f"{', '.join(sorted(METHODS))}"
            )
        for name in ("rounds", "clients_per_round", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if isinstance(self.max_batch, int) and not isinstance(self.max_batch, bool) and \
                self.max_batch < 1:
            raise ValueError(f"train.max_batch must be >= 1, \"auto\" or \"none\", got "
                             f"{self.max_batch}")
        for name in ("knn_every", "probe_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if not self.local_lr > 0:
            raise ValueError(f"train.local_lr must be > 0, got {self.local_lr}")
        if self.seed < 0:
            raise ValueError(f"train.seed must be >= 0, got {self.seed}")
        if self.tensorboard and not tensorboard_available():
            raise ValueError(f"train.tensorboard = true needs TensorBoard: {INSTALL_HINT}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(
                f"train.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )


def local_sgd(t: TrainConfig) -> LocalSGD:
    """The local steps' momentum, weight decay and clipping of ``[train]``."""
    return LocalSGD(t.local_momentum, t.local_weight_decay, t.local_grad_clip)


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


def _upgrade(raw: dict[str, Any]) -> None:
    """Read a config written before ``train.precision`` existed as what it computed: its
    ``train.dtype`` is the precision (the values carry over), and it ran eager (compile
    "off"), so older run directories stay readable and comparable."""
    train = raw.get("train")
    if not isinstance(train, dict) or "dtype" not in train:
        return
    value = train.pop("dtype")
    if "precision" in train and train["precision"] != value:
        raise ConfigError(f"train.dtype (the old name of train.precision) is {value!r} but "
                          f"train.precision is {train['precision']!r}; keep train.precision "
                          f"alone")
    train["precision"] = value
    train.setdefault("compile", "off")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: RunConfig | None = None, resolve_auto: bool = True) -> RunConfig:
    """Read a TOML run config, apply ``section.key=value`` overrides, and validate it all.

    Args:
        path: a TOML file, or None for the defaults (``base``).
        overrides: e.g. ``["train.rounds=10", "model.widths=[16, 32, 64]"]``; the value is read
            as TOML, or taken as a plain string when it is not valid TOML.
        base: the config that the file and overrides modify (default: ``RunConfig()``).
        resolve_auto: make ``train.precision`` and ``train.compile`` concrete for this
            machine (``RunConfig.resolved``), as every run directory stores them.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_toml(path, "config file")
        if not raw:
            raise ConfigError(
                f"config file {path} sets nothing; an empty config would start a run with "
                f"every default (the paper's 100,000-round setting). Start from a file in "
                f"configs/, e.g. configs/fmnist_small.toml")
    for item in overrides or []:
        _apply_override(raw, item)
    _upgrade(raw)
    cfg = from_dict(RunConfig, raw, "", base=base or RunConfig())
    return cfg.resolved() if resolve_auto else cfg


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The table in a TOML file, with errors that name the file: missing, a folder,
    unreadable, not UTF-8 text or not valid TOML. ``what`` names the file's role in them."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a TOML file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid TOML: {e}") from None


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ConfigError(f"override {item!r} must look like section.key=value")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    section = raw.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(f"'{parts[0]}' must be a [section] table")
    section[parts[1]] = value


def from_dict(cls: type, data: dict[str, Any], prefix: str, base: Any = None) -> Any:
    """Build dataclass ``cls`` from ``data``, checking names and types; ``base`` gives defaults."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix}' must be a table of keys, got {data!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls) if f.init]
    for key in data:
        if key not in names:
            where = f"section [{prefix}]" if prefix else "the config"
            raise ConfigError(
                f"unknown key '{_join(prefix, key)}' in {where}; allowed: {', '.join(names)}"
            )
    kwargs = {}
    for name in names:
        if name not in data:
            continue
        key = _join(prefix, name)
        default = getattr(base, name) if base is not None else None
        kwargs[name] = _coerce(data[name], hints[name], key, default)
    try:
        return replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{e}") from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _coerce(value: Any, tp: Any, key: str, default: Any) -> Any:
    """``value`` checked (and converted, list → tuple) against the annotation ``tp``."""
    if is_dataclass(tp):
        return from_dict(tp, value, key, base=default)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if (value is None or value == "none") and type(None) in args:  # None: from JSON
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key, default)
        for a in inner:  # e.g. int | Literal["auto"]: the first that takes the value
            try:
                return _coerce(value, a, key, default)
            except ConfigError:
                continue
        kinds = [", ".join(repr(x) for x in get_args(a)) if get_origin(a) is Literal
                 else f"a{'n' if a is int else ''} {getattr(a, '__name__', a)}" for a in inner]
        kinds += ["'none'"] if type(None) in args else []
        raise ConfigError(f"{key} = {value!r} is not allowed; give {' or '.join(kinds)}")
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{key} = {value!r} is not allowed; choose one of {allowed}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", None) for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{key} must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]", None) for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    raise TypeError(f"config field {key} has an unsupported type {tp!r}")  # a bug of ours


def to_toml(cfg: Any) -> str:
    """The config as TOML text that ``load_config`` reads back to an equal config."""
    lines: list[str] = []
    for section, values in asdict(cfg).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {to_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def to_toml_value(value: Any) -> str:
    """One value as TOML text; None is written as the string "none"."""
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(to_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


__all__ = [
    "ConfigError",
    "DataConfig",
    "RunConfig",
    "TrainConfig",
    "from_dict",
    "load_config",
    "read_toml",
    "to_toml",
    "to_toml_value",
]
