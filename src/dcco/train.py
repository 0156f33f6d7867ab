"""The pretraining loop: plan a round, augment its views, run it, apply the server optimiser.

``Pretraining`` holds the state of one run (model, optimiser, rounds done) and nothing else:
data comes in, metrics go out, the CLI shows and stores them. Every random choice of round r
is a pure function of (seed, r), so a run restored from a checkpoint continues bit-identically.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dcco.algorithm import Algorithm, RoundResult
from dcco.augment import is_image, training_views
from dcco.checkpoint import checkpoint_state, load_checkpoint, save_checkpoint
from dcco.client import trainable_parameters
from dcco.collapse import (
    FIGURES,
    CollapseWarning,
    CollapseWatch,
    collapse_figures,
    encoding_figures,
    watch_start,
)
from dcco.config import ConfigError, RunConfig, local_sgd
from dcco.data.paired import Dataset
from dcco.data.partition import (
    Partition,
    clients_of_at_least,
    dirichlet_partition,
    natural_partition,
)
from dcco.devices import to_device
from dcco.distributed import AllReduceExecutor, local_segments, rank_and_size, split_batch
from dcco.evaluate import EvalConfig, knn_accuracy, knn_description, labelled_subset, linear_probe
from dcco.methods.base import Segments
from dcco.methods.predictive import target_decay
from dcco.methods.registry import METHODS, build_method
from dcco.models import DualEncoder
from dcco.models.dual import buffers_kept
from dcco.optim import apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.precision import prepare_model
from dcco.privacy import Ledger, RoundNoise, solve_noise_multiplier, stats_sensitivity
from dcco.rundir import RunDir
from dcco.seeding import derive_seed, generator
from dcco.simulator import executor_for, keeps_graphs_for, run_round
from dcco.statistics_cache import MAX_CACHE_BYTES, StatisticsCache, cache_bytes
from dcco.stats import Moments


def input_record(data: Dataset) -> dict[str, Any]:
    """``input_shape`` (one sample of X, or of the images) and ``input_kind`` ("images" or
    "features"), with ``input_shape_y`` and ``input_kind_y`` for pairs."""
    record: dict[str, Any] = {}
    for tower, suffix in enumerate(("", "_y")[: 1 + data.paired]):
        record[f"input_shape{suffix}"] = list(data.input_shapes[tower])
        record[f"input_kind{suffix}"] = "images" if is_image(data.inputs(tower)) else "features"
    return record


PROBE_SAMPLES = 256
"""Samples of the collapse probe of a method that shares no statistics (``Pretraining.
probe_figures``)."""


def resolve_device(name: str) -> torch.device:
    """``"auto"`` is CUDA when present, else CPU; anything else is checked to exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device = {name!r} but CUDA is not available on this machine")
    return device


def sample_clients(seed: int, round_index: int, num_clients: int, k: int) -> Tensor:
    """The K distinct clients of a round, uniformly without replacement: a function of (seed, r)."""
    if k > num_clients:
        raise ConfigError(
            f"train.clients_per_round = {k} but the partition has only {num_clients} clients"
        )
    return torch.randperm(num_clients, generator=generator(seed, "sample", round_index))[:k]


def centralized_batch(seed: int, step: int, pool: Tensor, batch_size: int) -> Tensor:
    """Sample ids of centralized step ``step``: epochs of shuffled pool, last partial batch dropped."""
    per_epoch = pool.shape[0] // batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"the centralized batch size {batch_size} exceeds the {pool.shape[0]} samples available"
        )
    epoch, offset = divmod(step, per_epoch)
    perm = torch.randperm(pool.shape[0], generator=generator(seed, "epoch", epoch))
    return pool[perm[offset * batch_size:(offset + 1) * batch_size]]


@dataclass(frozen=True)
class RoundPlan:
    """The samples of one round, grouped by client (``segments``)."""

    sample_ids: Tensor
    segments: Segments
    clients: Tensor | None = None
    """The round's client ids, in the order of ``segments`` (None: a centralized batch)."""


def plan_round(cfg: RunConfig, partition: Partition, round_index: int) -> RoundPlan:
    """Which samples round ``round_index`` uses, and which client each belongs to."""
    seed, k = cfg.train.seed, cfg.train.clients_per_round
    if METHODS[cfg.train.method].federated:
        clients = sample_clients(seed, round_index, partition.num_clients, k)
        ids, segment_ids = partition.gather(clients)
        return RoundPlan(ids, Segments(segment_ids, partition.sizes[clients]), clients)
    batch = k * cfg.data.samples_per_client
    ids = centralized_batch(seed, round_index, partition.indices, batch)
    return RoundPlan(ids, Segments.from_counts([batch]))


def algorithm_of(cfg: RunConfig, round_index: int | None = None) -> Algorithm:
    """The run's method with its round settings (``train.local_*``, ``train.staleness``, and
    the update clipping of ``privacy``); with ``round_index``, the settings that change from
    round to round too (``train.own_weight = "fedsc"``: ``fedsc_alpha``;
    ``train.local_lr_schedule = "cosine"``: the server's schedule, ``scheduled_lr``, without
    warm-up, as FedSC's CosineAnnealingLR with T_max = the rounds)."""
    t = cfg.train
    clip = cfg.privacy.update_clip if cfg.privacy.enabled else None
    alpha = (fedsc_alpha(round_index, t.rounds)
             if t.own_weight == "fedsc" and round_index is not None else None)
    local_lr = (t.local_lr if round_index is None else
                scheduled_lr(round_index, t.rounds, t.local_lr, schedule=t.local_lr_schedule))
    return Algorithm(build_method(t.method, cfg.loss), local_lr, t.local_steps,
                     t.local_batch, t.staleness, t.stale_after, clip, t.pseudo_gradient,
                     t.local_statistics, t.stale_statistics, t.aggregate_decay,
                     own_alpha=alpha, local_optimizer=t.local_optimizer,
                     client_weighting=t.client_weighting, local_sgd=local_sgd(t))



def fedsc_alpha(round_index: int, rounds: int, first: float = 1.0, last: float = 0.2) -> float:
    """FedSC's α at a round (0-based): linear from ``first`` to ``last`` over the run."""
    if rounds <= 1:
        return first
    return first + (last - first) * round_index / (rounds - 1)


def build_partition(cfg: RunConfig, train_set: Dataset) -> Partition:
    """The run's clients: Hsu et al. Dirichlet partitioning of the training labels, or with
    ``data.partition = "natural"`` one client per client id of the data (a lesion, a
    patient, a writer), of whatever size. A method whose loss lives within a client (the
    FedAvg baselines: ``min_client_samples``) samples only the natural clients large enough
    for it; the others sit its rounds out."""
    if cfg.data.partition == "natural":
        clients = getattr(train_set, "clients", None)
        if clients is None:
            raise ConfigError(f"data.partition = 'natural' needs a client id per image, and "
                              f"{train_set.name!r} has none")
        partition = natural_partition(clients)
        minimum = METHODS[cfg.train.method].min_client_samples
        usable = clients_of_at_least(partition, minimum)
        if usable.num_clients == 0:
            raise ConfigError(f"{cfg.train.method} needs clients of at least {minimum} "
                              f"samples, and no natural client of {train_set.name!r} has as "
                              f"many")
        return usable
    return dirichlet_partition(
        train_set.labels, cfg.data.samples_per_client, cfg.data.alpha, cfg.train.seed,
        num_clients=cfg.data.num_clients,
    )


def user_views(augment: Callable[[Tensor], Tensor], samples: Tensor, seed: int,
               round_index: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Two views of ``samples`` by the user's ``augment``, with torch's random state seeded
    from ``(seed, round_index)`` (``seed``: the run's augmentation seed) and restored after;
    floating views cast to ``dtype``."""
    # every CUDA device: manual_seed reseeds them all, and fork_rng restores those it is given
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive_seed(seed, "user", round_index))
        views = augment(samples), augment(samples)
    for v in views:
        if not isinstance(v, Tensor) or v.ndim < 1 or v.shape[0] != samples.shape[0]:
            raise ValueError(f"augment must return one view per sample, a tensor of "
                             f"{samples.shape[0]} rows; got "
                             f"{tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__}")
    return tuple(v.to(dtype) if v.is_floating_point() else v for v in views)


def check_partition(cfg: RunConfig, partition: Partition) -> None:
    """``ConfigError`` when a round asks for more clients than the partition has."""
    if METHODS[cfg.train.method].federated and cfg.train.clients_per_round > \
            partition.num_clients:
        raise ConfigError(
            f"train.clients_per_round = {cfg.train.clients_per_round} but the partition has "
            f"only {partition.num_clients} clients"
            + (" large enough for the method" if cfg.data.partition == "natural" else ""))


def check_run(cfg: RunConfig, train_set: Dataset, towers: bool = True) -> None:
    """Everything ``Pretraining`` refuses about a config and its data, checked before a run
    directory or any other file is created (``load_splits`` has checked the data against the
    config): the device, the data against the config (``RunConfig.check_data``; ``towers``:
    false for towers the user builds), the partition's clients against a round's
    (``check_partition``), and differential privacy's accounting.

    Raises:
        ConfigError: naming the key to change.
    """
    resolve_device(cfg.train.device)
    cfg.resolved()
    cfg.check_data(train_set, towers=towers)
    partition = build_partition(cfg, train_set)
    check_partition(cfg, partition)
    if cfg.privacy.enabled:
        Privacy.of(cfg, partition, build_method(cfg.train.method, cfg.loss))


@dataclass(frozen=True)
class RoundMetrics:
    """What one round reports."""

    round: int
    """1-based index of the round just finished."""
    loss: float | Tensor
    """The round's loss: a number, or a scalar still on the device (read when logged)."""
    lr: float
    num_clients: int
    num_samples: int
    seconds: float
    exchanges: int = 1
    """Server–client exchanges the round took."""
    skipped: str | None = None
    """Why the round was skipped (too few valid replies over Flower), or None."""
    details: Any = None
    """What the backend has to say besides (Flower: the round's reply counters)."""


class Diverged(FloatingPointError):
    """Training diverged: the loss (or the model) of round ``round`` is not finite."""

    def __init__(self, round_index: int, message: str) -> None:
        super().__init__(message)
        self.round = round_index


def max_batch_of(max_batch: int | str | None, device: torch.device) -> int | None:
    """``train.max_batch`` on ``device``: "auto" is 256 samples on a CPU (a forward of a few
    thousand images there runs at about half the speed of its groups; docs/performance.md)
    and None (one forward) elsewhere."""
    if max_batch == "auto":
        return 256 if device.type == "cpu" else None
    return max_batch


def keeps_graphs(max_batch: int | str | None, device: torch.device) -> bool:
    """Whether ``train.max_batch``'s groups keep their graphs from the statistics to the
    update (one forward a group, ``dcco.simulator``): under "auto", whose groups on a CPU are
    for speed; not under a number, which bounds a forward's memory."""
    return max_batch == "auto" and max_batch_of(max_batch, device) is not None


class Pretraining:
    """The state of one pretraining run: model, server optimiser and the rounds done so far.

    Args:
        cfg: the run config.
        train_set: the unlabelled pretraining images, or pairs (labels are used only to
            partition).
        partition: the clients; by default ``build_partition(cfg, train_set)``.
        model: the dual encoder to train (e.g. with the user's own tower for a modality that
            is not images, docs/multimodal.md); by default ``cfg.build_model``.
        augment: the user's own augmentation instead of ``cfg.augment``: a function from a
            batch of stored samples (on the device) to one view of each, called twice a
            round for the two views, each sample's view its own (no mixing across samples).
            It may draw from torch's global random state: the round seeds it from the
            run's seed and the round (``user_views``) and restores it after, so runs are
            reproducible and resume exactly. Its views are cast to the run's dtype when floating.
    """

    def __init__(self, cfg: RunConfig, train_set: Dataset,
                 partition: Partition | None = None, model: DualEncoder | None = None,
                 augment: Callable[[Tensor], Tensor] | None = None) -> None:
        self.cfg = cfg
        self.augment = augment
        self.device = resolve_device(cfg.train.device)
        self.chunk = max_batch_of(cfg.train.max_batch, self.device)
        self.keep_graphs = keeps_graphs(cfg.train.max_batch, self.device)
        self.speed = cfg.speed
        self.dtype = self.speed.param_dtype
        self.algorithm = algorithm_of(cfg)
        self.method = self.algorithm.method
        self.shared: Moments | None = None
        """S_A of the last round applied (None before one, or for a method that shares no
        statistics): what the collapse figures are read from (``dcco.collapse``)."""
        self.aggregate: Moments | None = None
        """The last round's aggregated statistics, which the next round uses when
        ``train.staleness = 1`` (saved in checkpoints)."""
        self.partition = partition if partition is not None else build_partition(cfg, train_set)
        check_partition(cfg, self.partition)
        cfg.check_data(train_set, towers=model is None)
        self.images = train_set.inputs(0).to(self.device)
        """The training samples (the first modality's, for pairs)."""
        self.second = train_set.inputs(1).to(self.device) if train_set.paired else None
        """The second modality's samples, for pairs; None for images."""
        self.inputs_record = input_record(train_set)
        """What the towers read (shapes and kinds), kept with every checkpoint and summary so
        that ``dcco.load_encoder`` rebuilds them, also mid-run."""
        self.model: DualEncoder = prepare_model(
            model if model is not None else cfg.build_model(*train_set.input_shapes),
            self.speed, self.device)
        self.model.unit_encodings = cfg.privacy.enabled
        # the config's, also on a model the caller built (``dcco.fit``'s own encoder)
        self.model.encoding_bound = cfg.model.clip_encodings
        self.params = trainable_parameters(self.model)
        self.optimizer = build_optimizer(self.params, cfg.optim)
        self.privacy = Privacy.of(cfg, self.partition, self.method) if cfg.privacy.enabled \
            else None
        self.rounds_done = 0
        self.rank, self.world = rank_and_size()
        """This process's rank and the number of ranks sharing each round (``dcco.distributed``)."""
        if self.world > 1 and not self.method.federated and self.method.name != "centralized_cco":
            raise ConfigError(
                f"{self.method.name} over several ranks is not supported: a centralized batch "
                f"is split over the ranks and run as DCCO, which is exact for CCO alone; run "
                f"it in one process")
        if self.world > 1 and cfg.train.client_weighting != "samples":
            raise ConfigError("train.client_weighting = 'uniform' runs in one process: the "
                              "ranks of torch.distributed weigh their shares by sample count")
        self.cache = self._statistics_cache()
        """The server's cache of every client's last statistics
        (``train.absent_statistics = "cached"``, saved in checkpoints), else None."""
        self._augment_seed = derive_seed(cfg.train.seed, "augment")
        self._first_bad: Tensor | None = None
        self._bad_loss: Tensor | None = None

    @property
    def finished(self) -> bool:
        return self.rounds_done >= self.cfg.train.rounds

    def lr(self, round_index: int) -> float:
        o = self.cfg.optim
        return scheduled_lr(round_index, self.cfg.train.rounds, o.lr, o.warmup_steps, o.schedule)

    def views(self, plan: RoundPlan, round_index: int) -> tuple[Tensor, Tensor]:
        """The two inputs of the round's samples: two augmented views of each image (N, C, H,
        W), or each pair's X and Y (``dcco.augment.training_views``)."""
        return self._views(plan.sample_ids, self._augment_seed, round_index)

    def _views(self, sample_ids: Tensor, seed: int, round_index: int) -> tuple[Tensor, Tensor]:
        ids = to_device(sample_ids, self.device)
        if self.augment is not None:
            return user_views(self.augment, self.images[ids], seed, round_index, self.dtype)
        return training_views(self.images, self.second, ids, seed, round_index,
                              self.cfg.augment, self.cfg.augment_y, self.dtype)

    def collapse(self, probe: bool = False) -> dict[str, float]:
        """The collapse figures now (``dcco.collapse``), as numbers: of the last round's S_A
        for a method that shares statistics (free: the round merged them); for one that
        shares none, with ``probe``, of a fixed batch's two views (``probe_figures``); {}
        otherwise."""
        if self.shared is not None:
            figures = collapse_figures(self.shared)
        elif probe:
            figures = self.probe_figures()
        else:
            return {}
        return dict(zip(figures, _read(list(figures.values())), strict=True))

    @torch.no_grad()
    def probe_figures(self, size: int = PROBE_SAMPLES) -> dict[str, Tensor]:
        """The collapse figures of ``size`` fixed training samples, two views each (the
        run's augmentation, from a stream of their own), encoded by the model as a round
        encodes them, without gradient and with its buffers kept."""
        pool = self.partition.indices
        gen = generator(self.cfg.train.seed, "collapse-probe")
        ids = pool[torch.randperm(pool.shape[0], generator=gen)[:size]]
        x1, x2 = self._views(ids, derive_seed(self.cfg.train.seed, "collapse-probe"), 0)
        chunk = self.chunk or x1.shape[0]
        with buffers_kept(self.model):
            pairs = [self.model(a, b) for a, b in zip(x1.split(chunk), x2.split(chunk),
                                                        strict=True)]
        f, g = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
        return encoding_figures(f, g)

    def step(self) -> RoundMetrics:
        """Run the next round and apply the server update."""
        start = time.perf_counter()
        r = self.rounds_done
        plan = plan_round(self.cfg, self.partition, r)
        lr = self.lr(r)
        if self.world > 1:
            return self.apply(self._shared_round(plan, r), lr, start)
        x1, x2 = self.views(plan, r)
        absent = None
        if self.cache is not None:
            clients = plan.clients.tolist()
            absent = functools.partial(self.cache.merge_round, clients)
        result = run_round(self.model, self.round_algorithm(r), x1, x2,
                           plan.segments.to(self.device), self.cfg.train.backend,
                           previous=self.previous(r), noise=self.round_noise(r), absent=absent,
                           chunk=self.chunk, keep_graphs=self.keep_graphs)
        return self.apply(result, lr, start)

    def round_algorithm(self, round_index: int) -> Algorithm:
        """The algorithm of round ``round_index``: the run's, with FedSC's α of that round
        under ``train.own_weight = "fedsc"``, its local learning rate under
        ``train.local_lr_schedule = "cosine"``."""
        t = self.cfg.train
        if t.own_weight == "exact" and t.local_lr_schedule == "constant":
            return self.algorithm
        return algorithm_of(self.cfg, round_index)

    def _shared_round(self, plan: RoundPlan, r: int) -> RoundResult:
        """This rank's share of round ``r``, its sums all-reduced (``dcco.distributed``): the
        round's clients split over the ranks, or a centralized batch split and run as DCCO
        over them (exact: the anchored loss of the pooled statistics)."""
        clients = None
        if self.method.federated:
            part, segments = local_segments(plan.segments, self.rank, self.world)
            algorithm = self.round_algorithm(r)
            clients = plan.segments.num_clients
        else:
            part, segments = split_batch(plan.segments.num_samples, self.rank, self.world)
            algorithm = replace(self.algorithm, method=build_method("dcco", self.cfg.loss))
        x1, x2 = self.views(RoundPlan(plan.sample_ids[part], segments), r)
        inner = executor_for(self.cfg.train.backend, self.model, x1, x2,
                             segments.to(self.device), self.chunk,
                             keeps_graphs_for(algorithm, segments, self.keep_graphs))
        executor = AllReduceExecutor(inner, segments.num_samples, plan.segments.num_samples,
                                     clients)
        absent = None  # every rank merges the same statistics into its copy of the cache
        if self.cache is not None:
            absent = functools.partial(self.cache.merge_round, plan.clients.tolist())
        return algorithm.run_round(executor, self.previous(r), self.round_noise(r), absent)

    def apply(self, result: RoundResult, lr: float, start: float) -> RoundMetrics:
        """Apply a round's pseudo-gradient with the server optimiser (at ``lr``) and keep its
        aggregate for the next round.

        A loss that is a number (Flower's) is checked at once: a non-finite one is refused
        before the model changes. A loss still on the device (the simulator's) is not read
        here, which would wait for the GPU every round: the first round with a non-finite
        loss is kept on the device, and ``check_finite`` raises for it at the next metrics
        record or checkpoint, so a diverged model never reaches a checkpoint."""
        r = self.rounds_done
        if isinstance(result.loss, Tensor):
            self._watch_loss(result.loss.detach(), r + 1)
        elif not math.isfinite(result.loss):
            raise FloatingPointError(
                f"round {r + 1}: the loss is {result.loss}; training diverged (try a lower "
                f"optim.lr); the model was left as it was before this round"
            )
        set_lr(self.optimizer, lr)
        grads = [result.pseudo_gradient[name] for name, _ in self.params]
        apply_pseudo_gradient(self.optimizer, [p for _, p in self.params], grads)
        if self.model.target is not None:  # BYOL: the server moves its target network
            self.model.update_target(target_decay(self.cfg.loss.target_decay, r,
                                                  self.cfg.train.rounds))
        self.aggregate = result.aggregate
        self.shared = result.shared
        self.rounds_done += 1
        return RoundMetrics(self.rounds_done, result.loss, lr, result.num_clients,
                            result.num_samples, time.perf_counter() - start, result.exchanges)

    def previous(self, round_index: int) -> Moments | None:
        """Round ``round_index``'s stale statistics: the last aggregate once the algorithm's
        stale rounds have started (``Algorithm.previous_for``), else None."""
        return self.algorithm.previous_for(round_index, self.aggregate)

    def round_noise(self, round_index: int) -> RoundNoise | None:
        """Differential privacy's noise for round ``round_index`` (None without it)."""
        if self.privacy is None:
            return None
        p = self.privacy
        return RoundNoise(self.cfg.train.seed, round_index, p.noise_multiplier * p.stats_bound,
                          p.noise_multiplier * p.update_bound)

    def _watch_loss(self, loss: Tensor, round_done: int) -> None:
        """Remember, on the loss's device, the first round whose loss is not finite."""
        if self._first_bad is None:
            self._first_bad = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=loss.dtype, device=loss.device)
        first = ~torch.isfinite(loss) & (self._first_bad == 0)
        self._first_bad = torch.where(first, round_done, self._first_bad)
        self._bad_loss = torch.where(first, loss, self._bad_loss)

    def check_finite(self) -> None:
        """Raise ``FloatingPointError`` if a round since the start of this process had a
        non-finite loss (``apply``); reads the device once."""
        if self._first_bad is None or int(self._first_bad) == 0:
            return
        bad, loss = int(self._first_bad), float(self._bad_loss)
        raise Diverged(
            bad, f"round {bad}: the loss is {loss}; training diverged (try a lower optim.lr). "
            f"Rounds {bad}-{self.rounds_done} were applied before the check, so this model is "
            f"discarded: no checkpoint was written after round {bad - 1}")

    def _statistics_cache(self) -> StatisticsCache | None:
        """A new cache for ``train.absent_statistics = "cached"``, refused where it cannot
        run or would not fit; None otherwise."""
        t = self.cfg.train
        if t.absent_statistics != "cached":
            return None
        d = self.model.projection_dim  # both towers project to it
        values = self.method.stats.num_values(d, d)
        size = cache_bytes(self.partition.num_clients, t.rounds, t.clients_per_round, values)
        if size > MAX_CACHE_BYTES:
            raise ConfigError(
                f"train.absent_statistics = 'cached' would keep up to {size / 2**30:.1f} GiB "
                f"of client statistics ({self.partition.num_clients} clients, "
                f"{values} values each), over the "
                f"{MAX_CACHE_BYTES / 2**30:.0f} GiB limit; it is meant for a few clients "
                f"(FedSC: 10 to 20), or use 'drop'")
        return StatisticsCache()

    def round_state(self) -> dict[str, Tensor]:
        """What a checkpoint must keep besides model and optimiser: the last aggregate, and
        the cache of clients' statistics."""
        cache = self.cache.state() if self.cache is not None else {}
        if self.aggregate is None:
            return cache
        return {f"aggregate.{k}": v for k, v in self.aggregate.items()} | {
            "aggregate.count": self.aggregate.count} | cache

    def load_round_state(self, state: dict[str, Tensor]) -> None:
        """Restore ``round_state``: the aggregate of the last round before the checkpoint."""
        values = {k[len("aggregate."):]: v.to(self.device) for k, v in state.items()
                  if k.startswith("aggregate.")}
        count = values.pop("count", None)
        self.aggregate = Moments(values, count=count) if values else None
        if self.cache is not None:
            self.cache = StatisticsCache.from_state(state)


@dataclass(frozen=True)
class Privacy:
    """A run's differential privacy, made concrete (``dcco.privacy``).

    Attributes:
        noise_multiplier: σ (given, or solved for ``privacy.target_epsilon``).
        stats_bound: the statistics' sensitivity to one client (add or remove).
        update_bound: the averaged update's: C_u / K.
        population, sample: M clients, K sampled per round without replacement.
        releases: Gaussian releases per round (statistics and update, or the update alone).
        extra: releases once more (stale statistics' first exchange).
        delta: δ of the reported (ε, δ).
    """

    noise_multiplier: float
    stats_bound: float
    update_bound: float
    population: int
    sample: int
    releases: int
    extra: int
    delta: float

    @classmethod
    def of(cls, cfg: RunConfig, partition: Partition, method) -> Privacy:
        sizes = partition.sizes
        if int(sizes.min()) != int(sizes.max()):
            raise ConfigError(
                f"privacy needs clients of one size (the update's sensitivity is C_u / K), "
                f"but the partition's clients hold {int(sizes.min())} to {int(sizes.max())} "
                f"samples")
        k, m = cfg.train.clients_per_round, partition.num_clients
        spec = method.stats
        releases = 2 if spec is not None else 1
        extra = 1 if spec is not None and cfg.train.staleness else 0
        p = cfg.privacy
        sigma = p.noise_multiplier
        if p.target_epsilon is not None:
            try:
                sigma = solve_noise_multiplier(p.target_epsilon, m, k, cfg.train.rounds,
                                               releases, p.delta, extra)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        stats = stats_sensitivity(spec, int(sizes.max())) if spec is not None else 0.0
        return cls(sigma, stats, p.update_clip / k, m, k, releases, extra, p.delta)

    def epsilon(self, rounds: int) -> float:
        """ε at ``delta`` spent by the first ``rounds`` rounds."""
        return self.ledger.epsilon(rounds)

    @functools.cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.noise_multiplier, self.population, self.sample, self.releases,
                      self.delta, self.extra)

    def summary(self, rounds: int) -> dict[str, Any]:
        return {"epsilon": self.epsilon(rounds), "delta": self.delta,
                "noise_multiplier": self.noise_multiplier,
                "stats_sensitivity": self.stats_bound, "update_sensitivity": self.update_bound,
                "clients": self.population, "clients_per_round": self.sample,
                "releases_per_round": self.releases,
                "accounting": "RDP (dp-accounting), K of M clients sampled without "
                              "replacement, replace-one neighbours, central Gaussian noise"}


RoundCallback = Callable[[RoundMetrics, dict[str, float]], None]


class MetricsWindow:
    """The rounds since the last metrics record (one record every ``train.log_every``
    rounds): their mean loss, rate, clients, samples and exchanges. A backend with more to
    report (Flower's reply counters) extends ``add`` and ``record``."""

    def __init__(self) -> None:
        self.rounds = self.skipped = self.clients = self.samples = self.exchanges = 0
        self.losses: list[float | Tensor] = []
        """Each round's loss: a number, or a tensor still on the device (read at ``record``)."""
        self.start = time.perf_counter()

    def add(self, m: RoundMetrics) -> None:
        self.rounds += 1
        if m.skipped is not None:
            self.skipped += 1
            return
        self.losses.append(m.loss)
        self.clients += m.num_clients
        self.samples += m.num_samples
        self.exchanges += m.exchanges

    def record(self, round_done: int, lr: float) -> dict[str, Any]:
        """The metrics record of the window: ``loss`` is the mean over its rounds (absent if
        all were skipped); ``clients``, ``samples`` and ``exchanges`` are per round."""
        done = max(self.rounds - self.skipped, 1)
        rec: dict[str, Any] = {"round": round_done}
        if self.losses:
            losses = [float(v) for v in _read(self.losses)]
            rec["loss"] = sum(losses) / len(losses)
        return rec | {"lr": lr, "rounds_per_sec": self.rounds / (time.perf_counter() - self.start),
                      "clients": self.clients // done, "samples": self.samples // done,
                      "exchanges": self.exchanges / done}


def _read(values: list[float | Tensor]) -> list[float]:
    """Numbers from numbers and device scalars, with one transfer for all the tensors."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        return list(values)
    read = iter(torch.stack([t.to(torch.float64) for t in tensors]).tolist())
    return [next(read) if isinstance(v, Tensor) else v for v in values]


def resume_from_checkpoint(pt: Pretraining, run: RunDir) -> None:
    """Restore model, optimiser, rounds done and round state from ``run``'s checkpoint (none
    yet: round 0), and drop the metrics logged after it."""
    if run.checkpoint_path.is_file():
        pt.rounds_done = load_checkpoint(run.checkpoint_path, pt.model, pt.optimizer)
        pt.load_round_state(checkpoint_state(run.checkpoint_path))
    if pt.rank == 0:
        run.truncate_metrics(pt.rounds_done)


def pretraining_loop(pt: Pretraining, run: RunDir, step: Callable[[], RoundMetrics],
                     train_set: Dataset, test_set: Dataset | None = None,
                     on_round: RoundCallback | None = None,
                     window: Callable[[], MetricsWindow] = MetricsWindow,
                     meta: dict[str, Any] | None = None,
                     on_log: Callable[[dict[str, Any]], None] | None = None,
                     stop: Callable[[], str | None] | None = None,
                     on_warning: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The run loop of every backend: rounds until ``pt`` is finished, with metrics records,
    the collapse figures and their watch, the k-NN monitor, atomic checkpoints and the
    summary.

    Every metrics record carries the collapse figures (``dcco.collapse``): of the round's
    S_A for a method that shares statistics; for one that shares none, of a fixed probe
    batch at the k-NN monitor's rounds (``train.knn_every``) and the last. The first sign of
    collapse after the warm-up (``CollapseWatch``, from ``collapse_watch_start``) is noted in
    the metrics (``{"round": r, "warning": "collapse", "message": ...}``) and in the summary
    (``collapse_warning``), and said once: to ``on_warning``, or as a ``CollapseWarning``.

    A run told to stop (``stop`` returns a reason) goes on to the end of its logging window,
    so that its records are those an uninterrupted run writes, then checkpoints there, notes
    ``{"round": r, "stopped": reason}`` in the metrics and returns without a summary: the run
    is unfinished, and resuming it continues from that round as if it had never stopped.

    Args:
        pt: the training state (resumed or fresh).
        run: its run directory.
        step: runs the next round and applies it (``Pretraining.step``, or the Flower
            federation's), returning its metrics.
        train_set, test_set: the k-NN monitor's bank and queries; no test set, no monitor.
        on_round: called after every round with its metrics and the latest logged values
            (``loss``: the mean over the last logging window, as ``final_loss`` is;
            ``rounds_per_sec``; ``knn`` once measured), e.g. to drive a progress bar.
        window: makes a fresh ``MetricsWindow`` (a backend's subclass).
        meta: stored with each checkpoint (the method is always stored).
        on_log: called with every metrics record written.
        stop: asked after each logged round whether to stop (a reason, e.g. "time budget"),
            or None to go on.
        on_warning: shows the collapse warning (a progress bar's note); None: Python's
            ``warnings.warn``.

    Returns:
        The summary written to ``summary.json``; for a stopped run ``{"rounds": r,
        "stopped": reason}``, and no summary is written.
    """
    cfg = pt.cfg
    t_cfg = cfg.train
    meta = {"method": t_cfg.method} | pt.inputs_record | (meta or {})
    w, latest, started = window(), {}, time.perf_counter()
    model_bytes = sum(p.numel() * p.element_size() for _, p in pt.params)
    state_bytes = sum(v.numel() * v.element_size() for v in pt.model.state_dict().values())
    d = pt.model.projection_dim
    message_bytes = pt.algorithm.message_bytes(d, d, model_bytes,
                                               state_bytes=state_bytes - model_bytes)
    writes = pt.rank == 0  # with several ranks, rank 0 alone writes (all hold one model)
    watch = CollapseWatch(watch_start(cfg.optim.warmup_steps))
    stopped: str | None = None
    while not pt.finished and stopped is None:
        m = step()
        w.add(m)
        last = pt.finished
        if m.skipped is not None and writes:
            run.append_metrics({"round": m.round, "skipped": m.skipped})
        if m.round % t_cfg.log_every == 0 or last:
            pt.check_finite()
            record = w.record(m.round, m.lr) | {"bytes_per_client": message_bytes}
            if writes:
                record |= pt.collapse(probe=last or bool(
                    t_cfg.knn_every and m.round % t_cfg.knn_every == 0))
            if pt.privacy is not None:
                record["epsilon"] = latest["epsilon"] = pt.privacy.epsilon(m.round)
            if writes:
                run.append_metrics(record)
            latest |= {k: record[k] for k in ("loss", "rounds_per_sec", *FIGURES)
                       if k in record}
            warning = watch.check(m.round, {k: record[k] for k in FIGURES if k in record}, d)
            if warning is not None and writes:
                run.append_metrics({"round": m.round, "warning": "collapse",
                                    "message": warning})
                if on_warning is not None:
                    on_warning(warning)
                else:
                    warnings.warn(warning, CollapseWarning, stacklevel=2)
            if on_log is not None:
                on_log(record)
            w = window()
            if stop is not None and not last:
                stopped = stop()
        if writes and test_set is not None and (
                (t_cfg.knn_every and m.round % t_cfg.knn_every == 0) or last):
            latest["knn"] = monitor_knn(pt, train_set, test_set)
            run.append_metrics({"round": m.round, "knn": latest["knn"],
                                "knn_features": cfg.eval.knn_features})
        if writes and test_set is not None and t_cfg.probe_every and \
                m.round % t_cfg.probe_every == 0:
            latest["probe"] = monitor_probe(pt, train_set, test_set)
            run.append_metrics({"round": m.round, "probe": latest["probe"],
                                "probe_labels": cfg.eval.labels})
        if m.round % t_cfg.checkpoint_every == 0 or last or stopped is not None:
            pt.check_finite()
            if writes:
                save_checkpoint(run.checkpoint_path, pt.model, pt.optimizer, m.round,
                                meta=meta, state=pt.round_state())
        if on_round is not None:
            on_round(m, latest)
    if stopped is not None:
        if writes:
            run.append_metrics({"round": pt.rounds_done, "stopped": stopped})
        return {"rounds": pt.rounds_done, "stopped": stopped}
    if not writes:
        return {"rounds": pt.rounds_done, "rank": pt.rank}
    history = run.metrics()
    losses = [r["loss"] for r in history if "loss" in r]
    knn = [r["knn"] for r in history if "knn" in r]
    skipped = sum(1 for r in history if isinstance(r.get("skipped"), str))
    warned = [r["message"] for r in history if r.get("warning") == "collapse"]
    figures = next((r for r in reversed(history) if "eff_rank" in r), {})
    return run.update_summary(
        method=t_cfg.method, dataset=cfg.data.dataset, rounds=pt.rounds_done,
        alpha=cfg.data.alpha, samples_per_client=cfg.data.samples_per_client,
        clients_per_round=t_cfg.clients_per_round,
        final_loss=losses[-1] if losses else None, knn=knn[-1] if knn else None,
        **({"knn_features": cfg.eval.knn_features,
            "knn_monitor": knn_description(cfg.eval, *_knn_sizes(cfg.eval, train_set, test_set))}
           if knn else {}),
        **pt.inputs_record,
        exchanges_per_round=pt.algorithm.exchanges(has_previous=True),
        bytes_per_client_round=message_bytes,
        pretrain_seconds_this_session=time.perf_counter() - started,
        **({"skipped_rounds": skipped} if skipped else {}),
        **({"privacy": pt.privacy.summary(pt.rounds_done)} if pt.privacy is not None else {}),
        **({"collapse": {k: figures[k] for k in ("round", *FIGURES)}} if figures else {}),
        **({"collapse_warning": warned[0]} if warned else {}),
    )


def run_pretraining(cfg: RunConfig, run: RunDir, train_set: Dataset,
                    test_set: Dataset | None = None, resume: bool = False,
                    on_round: RoundCallback | None = None,
                    model: DualEncoder | None = None,
                    stop: Callable[[], str | None] | None = None,
                    augment: Callable[[Tensor], Tensor] | None = None,
                    on_warning: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Pretrain in this process into a run directory (``pretraining_loop``).

    Args:
        cfg: the run config (for a resumed run, the one stored in ``run``).
        run: the run directory, created with ``RunDir.create`` or opened to resume.
        train_set: the pretraining images.
        test_set: used by the k-NN monitor; None disables it.
        resume: continue from ``run``'s checkpoint (from round 0 if none was written yet).
        on_round: see ``pretraining_loop``.
        model, augment: see ``Pretraining``.
        stop, on_warning: see ``pretraining_loop``.

    Returns:
        The summary written to ``summary.json`` (``pretraining_loop``'s partial record for a
        run that was told to stop).
    """
    pt = Pretraining(cfg, train_set, model=model, augment=augment)
    if resume:
        resume_from_checkpoint(pt, run)
    return pretraining_loop(pt, run, pt.step, train_set, test_set, on_round, stop=stop,
                            on_warning=on_warning)


def run_with_progress(cfg: RunConfig, run: RunDir, train_set: Dataset,
                      test_set: Dataset | None, resume: bool, progress: bool,
                      stop: Callable[[], str | None] | None = None,
                      model: DualEncoder | None = None,
                      augment: Callable[[Tensor], Tensor] | None = None) -> dict[str, Any]:
    """``run_pretraining`` with a progress bar (``progress``: None on a terminal, plain lines
    in a log; False: none) and the run's loss and k-NN plots at the end."""
    from dcco.progress import Progress
    from dcco.report import plot_run_curves

    bar = Progress(cfg.train.rounds, label="round", enabled=None if progress else False)

    def on_round(m: RoundMetrics, latest: dict[str, Any]) -> None:
        # The loss shown is the mean over the last logging window: the "final loss" of the
        # summary, not one round's value.
        extra = {"loss": latest["loss"]} if "loss" in latest else {}
        if "knn" in latest:
            extra["k-NN"] = f"{100 * latest['knn']:.1f}%"
        if "epsilon" in latest:
            extra["ε"] = f"{latest['epsilon']:.3g}"
        extra |= collapse_postfix(latest)
        bar.update(m.round, **extra)

    with bar:
        summary = run_pretraining(cfg, run, train_set, test_set, resume=resume,
                                  on_round=on_round, model=model, stop=stop, augment=augment,
                                  on_warning=(lambda text: bar.note(f"warning: {text}"))
                                  if bar.enabled else None)
    plot_run_curves(run)
    return summary


def collapse_postfix(latest: dict[str, Any]) -> dict[str, str]:
    """The collapse figures as a progress line shows them (``dead``, ``C_ii``, ``rank``)."""
    if "eff_rank" not in latest:
        return {}
    return {"dead": f"{latest['dead_dims']:.0%}", "C_ii": f"{latest['corr_diag']:.2f}",
            "rank": f"{latest['eff_rank']:.1f}"}


def monitor_knn(pt: Pretraining, train_set: Dataset, test_set: Dataset) -> float:
    """Weighted k-NN top-1 accuracy of the current encoder's first tower (the fast
    pretraining monitor)."""
    e = pt.cfg.eval
    return knn_accuracy(pt.model, train_set, test_set, k=e.knn_k, temperature=e.knn_temperature,
                        bank_size=e.knn_bank, num_queries=e.knn_queries, seed=pt.cfg.train.seed,
                        device=pt.device, features=e.knn_features)


def monitor_probe(pt: Pretraining, train_set: Dataset, test_set: Dataset) -> float:
    """The run's linear probe on the model as it is (``train.probe_every``): its
    ``eval.labels`` labelled samples of the seed, its probe settings; the model is left as it
    was and no training randomness is drawn."""
    e, seed = pt.cfg.eval, pt.cfg.train.seed
    ids = labelled_subset(train_set.labels, e.labels, train_set.num_classes, seed)
    return linear_probe(pt.model, train_set, test_set, ids, e, seed, pt.device).accuracy


def _knn_sizes(e: EvalConfig, train_set: Dataset, test_set: Dataset | None
               ) -> tuple[int, int]:
    """The bank and query counts the monitor used (its sizes, capped by the splits)."""
    n_test = len(test_set) if test_set is not None else 0
    return (min(e.knn_bank or len(train_set), len(train_set)),
            min(e.knn_queries or n_test, n_test))
