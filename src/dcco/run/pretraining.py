"""The state of one pretraining run (``Pretraining``: model, server optimiser, rounds done,
the last S_A) and its step: plan a round, augment its views, run it, apply the server
optimiser. Every random choice of round r is a pure function of (seed, r), so a run restored
from a checkpoint continues bit-identically."""

from __future__ import annotations

import functools
import math
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dcco.config import RunConfig
from dcco.core.algorithm import Algorithm, RoundResult
from dcco.core.client import trainable_parameters
from dcco.core.client_state import (
    DTYPES,
    ClientStates,
    Layout,
    RoundStates,
)
from dcco.core.collapse import (
    collapse_figures,
    encoding_figures,
)
from dcco.core.devices import to_device
from dcco.core.disk_states import DiskClientStates
from dcco.core.distributed import (
    AllReduceExecutor,
    local_segments,
    rank_and_size,
    share,
    share_client_states,
    split_batch,
)
from dcco.core.optim import apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.core.precision import prepare_model
from dcco.core.privacy import RoundNoise
from dcco.core.seeding import derive_seed, generator
from dcco.core.simulator import executor_for, keeps_graphs_for, run_round
from dcco.core.statistics_cache import StatisticsCache
from dcco.core.stats import Moments
from dcco.data.augment import training_views
from dcco.data.paired import Dataset
from dcco.data.partition import (
    Partition,
)
from dcco.methods.divergence import DivergenceAware
from dcco.methods.predictive import target_decay
from dcco.methods.registry import build_method
from dcco.models import DualEncoder
from dcco.models.dual import buffers_kept
from dcco.run.algorithms import algorithm_of
from dcco.run.checkpoint import checkpoint_state, load_checkpoint
from dcco.run.device_plan import keeps_graphs, max_batch_of, resolve_device
from dcco.run.planning import RoundPlan, input_record, plan_round
from dcco.run.setup import CheckedRun, check_run, speed_of
from dcco.run.views import user_views

PROBE_SAMPLES = 256
"""Samples of the collapse probe of a method that shares no statistics (``Pretraining.
probe_figures``)."""
LR_SCALE_KEY = "server.lr_scale"
"""The round state's entry for ``Pretraining.lr_scale`` (present only when it is not 1)."""


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
    returning: dict[str, float] | None = None
    """FedU and FedEMA: the round's clients that came back with a model of their own
    (``returning``, their count) and the sums over them of ``DivergenceAware.returned``'s
    figures (``divergence``, ``fedu_global_predictor`` or ``fedema_mu``); None otherwise."""


class Diverged(FloatingPointError):
    """Training diverged: the loss (or the model) of round ``round`` is not finite."""

    def __init__(self, round_index: int, message: str) -> None:
        super().__init__(message)
        self.round = round_index


class Pretraining:
    """The state of one pretraining run: model, server optimiser and the rounds done so far.

    Args:
        run: the checked run (``dcco.run.setup.check_run``): its config, data, partition,
            model and the stores' sizes, taken as they are. ``Pretraining.of`` checks and
            builds in one call.
        augment: the user's own augmentation instead of ``cfg.augment``: a function from a
            batch of stored samples (on the device) to one view of each, called twice a
            round for the two views, each sample's view its own (no mixing across samples).
            It may draw from torch's global random state: the round seeds it from the
            run's seed and the round (``user_views``) and restores it after, so runs are
            reproducible and resume exactly. Its views are cast to the run's dtype when floating.
    """

    def __init__(self, run: CheckedRun,
                 augment: Callable[[Tensor], Tensor] | None = None) -> None:
        cfg, train_set = run.cfg, run.train_set
        self.cfg = cfg
        self.augment = augment
        self.device = resolve_device(cfg.train.device)
        self.chunk = max_batch_of(cfg.train.max_batch, self.device)
        self.keep_graphs = keeps_graphs(cfg.train.max_batch, self.device)
        self.speed = speed_of(cfg)
        self.dtype = self.speed.param_dtype
        self.algorithm = algorithm_of(cfg)
        self.method = self.algorithm.method
        self.shared: Moments | None = None
        """S_A of the last round applied (None before one, or for a method that shares no
        statistics): what the collapse figures are read from (``dcco.core.collapse``)."""
        self.aggregate: Moments | None = None
        """The last round's aggregated statistics, which the next round uses when
        ``train.staleness = 1`` (saved in checkpoints)."""
        self.partition = run.partition
        self.images = train_set.inputs(0).to(self.device)
        """The training samples (the first modality's, for pairs)."""
        self.second = train_set.inputs(1).to(self.device) if train_set.paired else None
        """The second modality's samples, for pairs; None for images."""
        self.inputs_record = input_record(train_set)
        """What the towers read (shapes and kinds), kept with every checkpoint and summary so
        that ``dcco.load_encoder`` rebuilds them, also mid-run."""
        self.model: DualEncoder = prepare_model(run.model, self.speed, self.device)
        self.model.unit_encodings = cfg.privacy.enabled
        # the config's, also on a model the caller built (``dcco.fit``'s own encoder)
        self.model.encoding_bound = cfg.model.clip_encodings
        self.params = trainable_parameters(self.model)
        self.optimizer = build_optimizer(self.params, cfg.optim)
        self.privacy = run.privacy  # check_run's accounting, made once
        self.rounds_done = 0
        self.lr_scale = 1.0
        """The server's rate relative to its schedule (``train.on_collapse = "rewind"``
        halves it at each rewind; saved in checkpoints when not 1)."""
        self.rank, self.world = rank_and_size()
        """This process's rank and the number of ranks sharing each round (``dcco.core.distributed``)."""
        self.cache = self._statistics_cache()
        """The server's cache of every client's last statistics
        (``train.absent_statistics = "cached"``, saved in checkpoints), else None."""
        self.client_states = (self._client_states(run.state_dir)
                              if run.holds_client_states else None)
        """What each client that has taken part keeps between its rounds, for a method whose
        clients keep their model (FedU, FedEMA; saved in checkpoints), else None."""
        self._augment_seed = derive_seed(cfg.train.seed, "augment")
        self._first_bad: Tensor | None = None
        self._bad_loss: Tensor | None = None

    @classmethod
    def of(cls, cfg: RunConfig, train_set: Dataset, partition: Partition | None = None,
           model: DualEncoder | None = None, augment: Callable[[Tensor], Tensor] | None = None,
           holds_client_states: bool = True, state_dir: Path | None = None,
           rounds_to_run: int | None = None) -> Pretraining:
        """A run checked (``dcco.run.setup.check_run``) and started in one call.

        Args:
            cfg: the run config.
            train_set: the unlabelled pretraining images, or pairs (labels are used only to
                partition).
            partition: the clients; by default ``build_partition(cfg, train_set)``.
            model: the dual encoder to train (e.g. with the user's own tower for a modality
                that is not images, docs/multimodal.md); by default
                ``dcco.run.setup.build_model``.
            augment: see the class.
            holds_client_states: whether this process keeps what the clients of a stateful
                method keep between rounds (FedU, FedEMA, MoCo's queue): the simulator does;
                a Flower server does not, its nodes do.
            state_dir: the folder of the clients' states with ``train.client_state_store =
                "disk"`` (the run directory's ``client_states``); None: a temporary folder,
                deleted with the store.
            rounds_to_run: the rounds this object will run where fewer than the config's (a
                measurement of a few rounds): the clients' store is sized for them.

        Raises:
            ConfigError: naming the key to change. DataError: a sample that is not finite.
        """
        return cls(check_run(cfg, train_set, model=model, partition=partition,
                             state_dir=state_dir, rounds_to_run=rounds_to_run,
                             holds_client_states=holds_client_states), augment)

    @property
    def finished(self) -> bool:
        return self.rounds_done >= self.cfg.train.rounds

    def lr(self, round_index: int) -> float:
        """The server's rate at round ``round_index``: its schedule times ``lr_scale``."""
        o = self.cfg.optim
        return self.lr_scale * scheduled_lr(round_index, self.cfg.train.rounds, o.lr,
                                            o.warmup_rounds, o.schedule)

    def views(self, plan: RoundPlan, round_index: int) -> tuple[Tensor, Tensor]:
        """The two inputs of the round's samples: two augmented views of each image (N, C, H,
        W), or each pair's X and Y (``dcco.data.augment.training_views``)."""
        return self._views(plan.sample_ids, self._augment_seed, round_index)

    def _views(self, sample_ids: Tensor, seed: int, round_index: int) -> tuple[Tensor, Tensor]:
        ids = to_device(sample_ids, self.device)
        if self.augment is not None:
            return user_views(self.augment, self.images[ids], seed, round_index, self.dtype)
        return training_views(self.images, self.second, ids, seed, round_index,
                              self.cfg.augment, self.cfg.augment_y, self.dtype)

    def collapse(self, probe: bool = False) -> dict[str, float]:
        """The collapse figures now (``dcco.core.collapse``), as numbers: of the last round's S_A
        for a method that shares statistics (free: the round merged them); for one that
        shares none, with ``probe``, of a fixed batch's two views (``probe_figures``); {}
        otherwise."""
        if self.shared is not None:
            figures = collapse_figures(self.shared, eps=self.method.variance_eps())
        elif probe:
            figures = self.probe_figures()
        else:
            return {}
        return dict(zip(figures, read_numbers(list(figures.values())), strict=True))

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
        return encoding_figures(f, g, eps=self.method.variance_eps())

    def step(self) -> RoundMetrics:
        """Run the next round and apply the server update."""
        start = time.perf_counter()
        r = self.rounds_done
        plan = plan_round(self.cfg, self.partition, r)
        lr = self.lr(r)
        returning = self._returning(plan.clients, r)
        if self.world > 1:
            return replace(self.apply(self._shared_round(plan, r), lr, start),
                           returning=returning)
        x1, x2 = self.views(plan, r)
        absent = None
        if self.cache is not None:
            clients = plan.clients.tolist()
            absent = functools.partial(self.cache.merge_round, clients)
        states = self._round_states(plan.clients, r)
        result = run_round(self.model, self.round_algorithm(r), x1, x2,
                           plan.segments.to(self.device), self.cfg.train.backend,
                           previous=self.previous(r), noise=self.round_noise(r), absent=absent,
                           chunk=self.chunk, keep_graphs=self.keep_graphs, states=states)
        return replace(self.apply(result, lr, start), returning=returning)

    def _returning(self, clients: Tensor, round_index: int) -> dict[str, float] | None:
        """FedU's and FedEMA's round ``round_index``'s clients that kept a model from an earlier round: how
        many, and the sums of what their starts make of their divergence
        (``RoundMetrics.returning``), read from the store before the round; None for the
        other methods."""
        if self.client_states is None or not isinstance(self.method, DivergenceAware):
            return None
        layout = Layout.of(self.model)
        global_weights = {n: p.detach() for n, p in self.model.named_parameters()}
        sums: dict[str, float] = {"returning": 0.0}
        for client in clients.tolist():
            state = self.client_states.get(client, self.device, self.dtype)
            if state is None:
                continue
            sums["returning"] += 1
            for key, value in self.method.returned(global_weights, state, layout,
                                                     round_index).items():
                sums[key] = sums.get(key, 0.0) + value
        return sums

    def _round_states(self, clients: Tensor, round_index: int) -> RoundStates | None:
        """What round ``round_index``'s ``clients`` (their ids) need of the store, for a
        method whose clients keep state; None otherwise."""
        if self.client_states is None:
            return None
        return RoundStates(clients.tolist(), self.client_states,
                           target_decay(self.cfg.loss.target_decay, round_index,
                                        self.cfg.train.rounds), round_index)

    def round_algorithm(self, round_index: int) -> Algorithm:
        """The algorithm of round ``round_index``: the run's, with FedSC's α of that round
        under ``train.own_weight = "fedsc"``, its local learning rate under
        ``train.local_lr_schedule = "cosine"``."""
        t = self.cfg.train
        if t.own_weight == "exact" and t.local_lr_schedule == "constant":
            return self.algorithm
        return algorithm_of(self.cfg, round_index)

    def _shared_round(self, plan: RoundPlan, r: int) -> RoundResult:
        """This rank's share of round ``r``, its sums all-reduced (``dcco.core.distributed``): the
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
        states = None  # every rank holds the whole store, and runs its share of the clients
        if self.client_states is not None:
            states = self._round_states(
                plan.clients[share(plan.segments.num_clients, self.rank, self.world)], r)
        inner = executor_for(self.cfg.train.backend, self.model, x1, x2,
                             segments.to(self.device), self.chunk,
                             keeps_graphs_for(algorithm, segments, self.keep_graphs), states)
        executor = AllReduceExecutor(inner, segments.num_samples, plan.segments.num_samples,
                                     clients)
        absent = None  # every rank merges the same statistics into its copy of the cache
        if self.cache is not None:
            absent = functools.partial(self.cache.merge_round, plan.clients.tolist())
        result = algorithm.round(executor, self.previous(r), self.round_noise(r), absent)
        if states is not None:  # each rank's clients' new states, to every rank's store
            share_client_states(self.client_states, states.clients)
        return result

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
        if self.model.target is not None and not self.algorithm.stateful:
            # BYOL: the server moves its target network (FedU's and FedEMA's clients each
            # keep their own)
            self.model.update_target(target_decay(self.cfg.loss.target_decay, r,
                                                  self.cfg.train.rounds))
        self.aggregate = result.aggregate
        # a centralized method's ranks share statistics (``_shared_round``), one process
        # shares none: its collapse figures come from the probe batch either way
        self.shared = result.shared if self.method.stats is not None else None
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
            bad, f"round {bad}: the loss is {loss}; training diverged ({self._cause(bad)}). "
            f"Rounds {bad}-{self.rounds_done} were applied before the check, so this model is "
            f"discarded: no checkpoint was written after round {bad - 1}")

    @torch.no_grad()
    def _cause(self, bad: int) -> str:
        """The likely cause of a loss that stopped being finite at round ``bad``, from what
        can be seen: the views of a few samples (the samples themselves were checked finite
        before training: ``check_data``), and whether any server step came before."""
        pool = self.partition.indices[:PROBE_SAMPLES]
        x1, x2 = self._views(pool, derive_seed(self.cfg.train.seed, "diverged"), bad - 1)
        if not (bool(torch.isfinite(x1).all()) and bool(torch.isfinite(x2).all())):
            return ("the views hold NaN or an infinity although the samples are finite: "
                    "the augmentation makes them (a division by a zero spread, say)")
        if bad == 1:
            return ("the loss was not finite at the first round, before any server step, so "
                    "no rate could have caused it: the encoder's outputs overflow on these "
                    "inputs (inputs far out of the range it expects, or a layer that "
                    "overflows)")
        return (f"after {bad - 1} server steps the weights or encodings overflowed: the steps "
                f"are too large for this model; try a lower optim.lr or a longer "
                f"optim.warmup_rounds")

    def _statistics_cache(self) -> StatisticsCache | None:
        """A new cache for ``train.absent_statistics = "cached"`` (sized by ``check_stores``),
        None otherwise."""
        return StatisticsCache() if self.cfg.train.absent_statistics == "cached" else None

    def _client_states(self, state_dir: Path | None) -> ClientStates | DiskClientStates | None:
        """A new store for a method whose clients keep their model (sized by
        ``check_stores``); None for the other methods. Over torch.distributed every rank
        holds the whole store (``share_client_states``), in memory."""
        if not self.method.stateful:
            return None
        dtype = DTYPES[self.cfg.train.client_state_dtype]
        if self.cfg.train.client_state_store == "memory":
            return ClientStates(dtype)
        directory = state_dir
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="dcco-client-states-"))
        store = DiskClientStates(directory, dtype)
        if state_dir is None:
            weakref.finalize(store, shutil.rmtree, directory, True)
        return store

    def round_state(self) -> dict[str, Tensor]:
        """What a checkpoint must keep besides model and optimiser: the last aggregate, the
        cache of clients' statistics, the clients' kept models, and the server's rate scale
        when a rewind has changed it."""
        cache = self.cache.state() if self.cache is not None else {}
        if self.client_states is not None:
            cache = cache | self.client_states.state()
        if self.lr_scale != 1.0:
            cache = cache | {LR_SCALE_KEY: torch.tensor(self.lr_scale, dtype=torch.float64)}
        if self.aggregate is None:
            return cache
        return {f"aggregate.{k}": v for k, v in self.aggregate.items()} | {
            "aggregate.count": self.aggregate.count} | cache

    def restore(self, path: Path) -> None:
        """Restore model, optimiser, rounds done and round state from the checkpoint at
        ``path`` (``dcco.run.checkpoint``)."""
        self.rounds_done = load_checkpoint(path, self.model, self.optimizer)
        self.load_round_state(checkpoint_state(path))

    def load_round_state(self, state: dict[str, Tensor]) -> None:
        """Restore ``round_state``: the aggregate of the last round before the checkpoint."""
        values = {k[len("aggregate."):]: v.to(self.device) for k, v in state.items()
                  if k.startswith("aggregate.")}
        count = values.pop("count", None)
        self.aggregate = Moments(values, count=count) if values else None
        self.lr_scale = float(state[LR_SCALE_KEY]) if LR_SCALE_KEY in state else 1.0
        if self.cache is not None:
            self.cache = StatisticsCache.from_state(state)
        if isinstance(self.client_states, DiskClientStates):
            self.client_states.load(state)
        elif self.client_states is not None:
            self.client_states = ClientStates.from_state(state, self.client_states.dtype)


def read_numbers(values: list[float | Tensor]) -> list[float]:
    """Numbers from numbers and device scalars, with one transfer for all the tensors."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        return list(values)
    read = iter(torch.stack([t.to(torch.float64) for t in tensors]).tolist())
    return [next(read) if isinstance(v, Tensor) else v for v in values]


