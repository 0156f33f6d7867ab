"""The pretraining loop: plan a round, augment its views, run it, apply the server optimiser.

``Pretraining`` holds the state of one run (model, optimiser, rounds done) and nothing else:
data comes in, metrics go out, the CLI shows and stores them. Every random choice of round r
is a pure function of (seed, r), so a run restored from a checkpoint continues bit-identically.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dcco.augment import augment_pair
from dcco.checkpoint import load_checkpoint, save_checkpoint
from dcco.client import trainable_parameters
from dcco.config import ConfigError, RunConfig
from dcco.data.datasets import ImageDataset
from dcco.data.partition import Partition, dirichlet_partition
from dcco.evaluate import knn_accuracy
from dcco.methods.base import Segments
from dcco.methods.registry import METHODS, build_method
from dcco.models import DualEncoder, build_dual_encoder
from dcco.optim import apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.rundir import RunDir
from dcco.seeding import derive_seed, generator
from dcco.simulator import run_round

DTYPES = {"float32": torch.float32, "float64": torch.float64}


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


def plan_round(cfg: RunConfig, partition: Partition, round_index: int) -> RoundPlan:
    """Which samples round ``round_index`` uses, and which client each belongs to."""
    seed, k = cfg.train.seed, cfg.train.clients_per_round
    if METHODS[cfg.train.method].federated:
        clients = sample_clients(seed, round_index, partition.num_clients, k)
        ids, segment_ids = partition.gather(clients)
        return RoundPlan(ids, Segments(segment_ids, partition.sizes[clients]))
    batch = k * cfg.data.samples_per_client
    ids = centralized_batch(seed, round_index, partition.indices, batch)
    return RoundPlan(ids, Segments.from_counts([batch]))


def build_partition(cfg: RunConfig, train_set: ImageDataset) -> Partition:
    """The run's clients: Hsu et al. Dirichlet partitioning of the training labels."""
    return dirichlet_partition(
        train_set.labels, cfg.data.samples_per_client, cfg.data.alpha, cfg.train.seed,
        num_clients=cfg.data.num_clients,
    )


@dataclass(frozen=True)
class RoundMetrics:
    """What one round reports."""

    round: int
    """1-based index of the round just finished."""
    loss: float
    lr: float
    num_clients: int
    num_samples: int
    seconds: float


class Pretraining:
    """The state of one pretraining run: model, server optimiser and the rounds done so far.

    Args:
        cfg: the run config.
        train_set: the unlabelled pretraining images (labels are used only to partition).
        partition: the clients; by default ``build_partition(cfg, train_set)``.
    """

    def __init__(self, cfg: RunConfig, train_set: ImageDataset,
                 partition: Partition | None = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.train.device)
        self.dtype = DTYPES[cfg.train.dtype]
        self.method = build_method(cfg.train.method, cfg.loss)
        self.partition = partition if partition is not None else build_partition(cfg, train_set)
        if self.method.federated and cfg.train.clients_per_round > self.partition.num_clients:
            raise ConfigError(
                f"train.clients_per_round = {cfg.train.clients_per_round} but the partition has "
                f"only {self.partition.num_clients} clients"
            )
        self.images = train_set.images.to(self.device)
        self.model: DualEncoder = build_dual_encoder(
            cfg.model, in_channels=train_set.images.shape[1], projector_dims=cfg.projector,
            seed=cfg.train.seed,
        ).to(self.device, self.dtype)
        self.params = trainable_parameters(self.model)
        self.optimizer = build_optimizer(self.params, cfg.optim)
        self.rounds_done = 0
        self._augment_seed = derive_seed(cfg.train.seed, "augment")

    @property
    def finished(self) -> bool:
        return self.rounds_done >= self.cfg.train.rounds

    def lr(self, round_index: int) -> float:
        o = self.cfg.optim
        return scheduled_lr(round_index, self.cfg.train.rounds, o.lr, o.warmup_steps, o.schedule)

    def views(self, plan: RoundPlan, round_index: int) -> tuple[Tensor, Tensor]:
        """The two augmented views of the round's samples (N, C, H, W)."""
        ids = plan.sample_ids.to(self.device)
        return augment_pair(self.images[ids], ids, self._augment_seed, round_index,
                            self.cfg.augment, dtype=self.dtype)

    def step(self) -> RoundMetrics:
        """Run the next round and apply the server update."""
        start = time.perf_counter()
        r = self.rounds_done
        plan = plan_round(self.cfg, self.partition, r)
        x1, x2 = self.views(plan, r)
        lr = self.lr(r)
        set_lr(self.optimizer, lr)
        result = run_round(self.model, self.method, x1, x2, plan.segments,
                           self.cfg.train.backend, self.cfg.train.local_lr)
        if not math.isfinite(result.loss):
            raise FloatingPointError(
                f"round {r + 1}: the loss is {result.loss}; training diverged (try a lower "
                f"optim.lr); the model was left as it was before this round"
            )
        grads = [result.pseudo_gradient[name] for name, _ in self.params]
        apply_pseudo_gradient(self.optimizer, [p for _, p in self.params], grads)
        self.rounds_done += 1
        return RoundMetrics(self.rounds_done, result.loss, lr, result.num_clients,
                            result.num_samples, time.perf_counter() - start)


RoundCallback = Callable[[RoundMetrics, dict[str, float]], None]


def run_pretraining(cfg: RunConfig, run: RunDir, train_set: ImageDataset,
                    test_set: ImageDataset | None = None, resume: bool = False,
                    on_round: RoundCallback | None = None) -> dict[str, Any]:
    """Pretrain into a run directory: metrics, atomic checkpoints, k-NN monitor, summary.

    Args:
        cfg: the run config (for a resumed run, the one stored in ``run``).
        run: the run directory, created with ``RunDir.create`` or opened to resume.
        train_set: the pretraining images.
        test_set: used by the k-NN monitor; None disables it.
        resume: continue from ``run``'s checkpoint (from round 0 if none was written yet).
        on_round: called after every round with its metrics and the latest logged values
            (``loss``: the mean over the last logging window, as ``final_loss`` is;
            ``rounds_per_sec``; ``knn`` once measured), e.g. to drive a progress bar.

    Returns:
        The summary written to ``summary.json``.
    """
    pt = Pretraining(cfg, train_set)
    if resume:
        if run.checkpoint_path.is_file():
            pt.rounds_done = load_checkpoint(run.checkpoint_path, pt.model, pt.optimizer)
        run.truncate_metrics(pt.rounds_done)
    t_cfg = cfg.train
    window_loss, window_start, window_rounds = 0.0, time.perf_counter(), 0
    latest: dict[str, float] = {}
    started = time.perf_counter()
    while not pt.finished:
        m = pt.step()
        window_loss += m.loss
        window_rounds += 1
        last = pt.finished
        if m.round % t_cfg.log_every == 0 or last:
            now = time.perf_counter()
            latest.update(loss=window_loss / window_rounds,
                          rounds_per_sec=window_rounds / (now - window_start))
            run.append_metrics({
                "round": m.round, "loss": latest["loss"], "lr": m.lr,
                "rounds_per_sec": latest["rounds_per_sec"], "clients": m.num_clients,
                "samples": m.num_samples,
            })
            window_loss, window_start, window_rounds = 0.0, now, 0
        if test_set is not None and ((t_cfg.knn_every and m.round % t_cfg.knn_every == 0)
                                     or last):
            latest["knn"] = monitor_knn(pt, train_set, test_set)
            run.append_metrics({"round": m.round, "knn": latest["knn"]})
        if m.round % t_cfg.checkpoint_every == 0 or last:
            save_checkpoint(run.checkpoint_path, pt.model, pt.optimizer, m.round,
                            meta={"method": cfg.train.method})
        if on_round is not None:
            on_round(m, latest)
    history = run.metrics()
    losses = [r["loss"] for r in history if "loss" in r]
    knn = [r["knn"] for r in history if "knn" in r]
    return run.update_summary(
        method=cfg.train.method, dataset=cfg.data.dataset, rounds=pt.rounds_done,
        alpha=cfg.data.alpha, samples_per_client=cfg.data.samples_per_client,
        clients_per_round=cfg.train.clients_per_round,
        final_loss=losses[-1] if losses else None, knn=knn[-1] if knn else None,
        pretrain_seconds_this_session=time.perf_counter() - started,
    )


def monitor_knn(pt: Pretraining, train_set: ImageDataset, test_set: ImageDataset) -> float:
    """Weighted k-NN top-1 accuracy of the current encoder (the fast pretraining monitor)."""
    e = pt.cfg.eval
    return knn_accuracy(pt.model, train_set, test_set, k=e.knn_k, temperature=e.knn_temperature,
                        bank_size=e.knn_bank, num_queries=e.knn_queries, seed=pt.cfg.train.seed,
                        device=pt.device)
