"""The sections of the run configuration that are dcco's own (``data``, ``train``), and the
error every bad setting raises (``ConfigError``). The other sections are the narrow configs of
their modules (``ModelConfig``, ``AugmentConfig``, ``LossConfig``, ``OptimConfig``,
``EvalConfig``, ``PrivacyConfig``, ``TableConfig``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dcco.errors import UserError


class ConfigError(UserError):
    """A configuration key is unknown or its value is invalid."""


DatasetName = Literal["fashion_mnist", "cifar10", "cifar100", "fashion_mnist_halves",
                      "paired_npz", "pairs", "client_table", "ham10000", "fed_cifar100",
                      "fed_emnist", "samples"]
CLIENT_DATASETS = ("client_table", "ham10000", "fed_cifar100", "fed_emnist", "samples")
"""Data sets whose images come in natural clients (a client id per image)."""
PAIRED_DATASETS = ("fashion_mnist_halves", "paired_npz", "pairs")
"""Data sets of pairs of two modalities (``dcco.data.paired``); the others hold images."""

METHOD_NAMES = ("dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco", "dvicreg",
                "vicreg_fedavg", "centralized_byol", "byol_fedavg", "centralized_simsiam",
                "simsiam_fedavg", "clip_fedavg", "fedsc", "spectral_fedavg", "fedu", "fedema",
                "moco_fedavg")
"""The names ``train.method`` takes: those of ``dcco.methods.registry.METHODS``, which checks
that the two agree when it is imported (the config imports no method)."""

Precision = Literal["auto", "float32", "bf16", "float64"]
"""``train.precision`` (``dcco.core.precision``)."""
Compile = Literal["auto", "off", "on", "cudagraphs"]
"""``train.compile`` (``dcco.core.precision``)."""


TENSORBOARD_HINT = "pip install 'dcco[tensorboard]' (or pip install tensorboard)"


def tensorboard_available() -> bool:
    """Whether TensorBoard's event writer can be imported here."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


@dataclass(frozen=True)
class DataConfig:
    """Which data, and how it is split into clients (Hsu, Qi & Brown 2019)."""

    dataset: DatasetName = "fashion_mnist"
    """Images (fashion_mnist, cifar10, cifar100: two augmented views of each), or pairs of two
    modalities (``dcco.data.paired``): fashion_mnist_halves (left and right halves),
    paired_npz (the user's train.npz and test.npz in data_dir), or pairs (a PairedDataset
    that the user's code passes to ``dcco.run.pretraining.Pretraining``); or images in natural
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
    validation: int = 0
    """Training samples held out as a validation split (``dcco.data.validation``), drawn
    class-balanced by ``validation_seed``; 0: none. When > 0 the run never reads the test
    split: pretraining, the partition and the probe's labels use the rest of the training
    split, and every evaluation and monitor scores the held-out samples instead of the test
    split (for choosing a recipe without reading the test set)."""
    validation_seed: int = 0
    """Seeds the validation split (not the run seed: every run of a tuning grid holds out
    the same samples)."""

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ValueError(f"data.alpha must be a finite number >= 0, got {self.alpha}")
        if self.samples_per_client < 1:
            raise ValueError(
                f"data.samples_per_client must be >= 1, got {self.samples_per_client}"
            )
        if self.num_clients is not None and self.num_clients < 1:
            raise ValueError(f"data.num_clients must be >= 1, got {self.num_clients}")
        if not (isinstance(self.validation, int) and self.validation >= 0):
            raise ValueError(f"data.validation must be a whole number >= 0 (training samples "
                             f"held out), got {self.validation!r}")
        if self.validation and self.dataset in CLIENT_DATASETS + ("pairs",):
            raise ValueError(f"data.validation holds out single training samples; "
                             f"{self.dataset}'s samples come in natural clients or from your "
                             f"code, so hold out whole clients yourself (a table's "
                             f"split_column, or the samples you pass) and leave it 0")
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
    centralized_byol, byol_fedavg, centralized_simsiam, simsiam_fedavg, clip_fedavg; fedu,
    fedema (BYOL clients that keep their own model, ``dcco.methods.divergence``);
    moco_fedavg (MoCo v2 with FedAvg, ``dcco.methods.moco``)."""
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
    the models: ``optim.optimizer = "sgd"``, ``optim.lr = 1``)."""
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
    aggregation: Literal["fedavg", "ldawa"] = "fedavg"
    """How the server combines the clients' updates: "fedavg", their weighted average (by
    ``client_weighting``; the exact round); "ldawa", L-DAWA's (Rehman et al., ICCV 2023):
    each layer of each client's model first scaled by its cosine with the global model's
    (``dcco.core.aggregation``). Federated methods; every backend, SecAgg+ included; not
    with [privacy], whose clip it would void."""
    absent_statistics: Literal["drop", "cached"] = "drop"
    """Statistics methods: "drop", a round's aggregate is its own clients' (exact);
    "cached", the server keeps every client's last statistics and merges those of the
    clients absent from a round into its aggregate (FedSC's partial participation,
    ``dcco.core.statistics_cache``; not a centralized step; without privacy; in the simulator,
    in one process or over torch.distributed's ranks, each keeping the same copy, and over
    Flower's plain exchanges, whose nodes then send each client's statistics; not under
    SecAgg+, which shows the server only their sum)."""
    client_state_dtype: Literal["float32", "float16"] = "float32"
    """FedU, FedEMA and MoCo: how the simulator (and a Flower node) holds what each client
    keeps between its rounds, its own model or its queue (``dcco.core.client_state``):
    "float32", as the client left it; "float16", half the memory, each float32 value rounded
    once when stored (a float64 run's tensors are held as they are)."""
    client_state_store: Literal["memory", "disk"] = "memory"
    """FedU, FedEMA and MoCo in the simulator: where the clients' kept states live.
    "memory", on the CPU, up to 8 GiB; "disk", a file a client in the run directory's
    ``client_states`` (``dcco.core.disk_states``), as much as the disk holds, each
    checkpoint a snapshot of hard links; in one process (not over torch.distributed)."""
    backend: Literal["batched", "reference"] = "batched"
    """"batched": a round's clients in one forward and backward (exact for one local step on
    all of a client's samples); "reference": client by client, as a deployment runs them."""
    max_batch: int | Literal["auto"] | None = "auto"
    """The batched backend runs a round's clients in groups of whole clients of at most this
    many samples, one forward and backward a group, the gradients summed: the same round
    (``dcco.core.simulator.client_groups``), in less memory. None: all in one forward. "auto":
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
    (``dcco.core.precision.AUTO``), written out concretely in the run's config.toml. Read from
    its old name, ``train.dtype``, with a ``DeprecationWarning``."""
    compile: Compile = "auto"
    """torch.compile of the encoders: "off", "on", "cudagraphs" (CUDA graphs too, for rounds
    of one shape), or "auto" (``dcco.core.precision.AUTO``)."""
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
    on_collapse: Literal["warn", "stop", "rewind"] = "warn"
    """What the run does at its collapse warning (``dcco.core.collapse.CollapseWatch``):
    "warn", say it once and train on; "stop", end the run there, its result the last
    checkpoint from before the warning (the summary, the model and every evaluation are
    that round's); "rewind", go back to that checkpoint, halve the server's rate and train
    on, at most 3 times (a fourth collapse stops the run as "stop" does). Each event is one
    line in the run's output, in metrics.jsonl and in the summary's ``collapse_events``.
    With "stop" or "rewind" a run also checkpoints its start, to come back to
    (``dcco.run.collapse_response``)."""
    tensorboard: bool = False
    """Also write the metrics and evaluations as TensorBoard scalars (RUN_DIR/tensorboard);
    needs ``pip install 'dcco[tensorboard]'``."""

    def __post_init__(self) -> None:
        if self.method not in METHOD_NAMES:
            raise ValueError(
                f"train.method {self.method!r} is not a method; choose one of "
                f"{', '.join(sorted(METHOD_NAMES))}"
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
        if not 0.0 <= self.local_momentum < 1.0:
            raise ValueError(f"train.local_momentum must be in [0, 1), got "
                             f"{self.local_momentum}")
        if not self.local_weight_decay >= 0.0:
            raise ValueError(f"train.local_weight_decay must be >= 0, got "
                             f"{self.local_weight_decay}")
        if self.local_grad_clip is not None and not self.local_grad_clip > 0.0:
            raise ValueError(f"train.local_grad_clip must be > 0 or none, got "
                             f"{self.local_grad_clip}")
        if self.seed < 0:
            raise ValueError(f"train.seed must be >= 0, got {self.seed}")
        if self.tensorboard and not tensorboard_available():
            raise ValueError(f"train.tensorboard = true needs TensorBoard: {TENSORBOARD_HINT}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(
                f"train.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )
        if self.own_weight != "exact" and self.local_statistics != "own":
            raise ValueError("train.own_weight weighs a client's own statistics in its local "
                             "steps; it needs train.local_statistics = 'own'")
        if self.absent_statistics == "cached" and self.staleness:
            raise ValueError("train.absent_statistics = 'cached' takes fresh statistics each "
                             "round; it needs train.staleness = 0")
