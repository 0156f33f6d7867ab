"""What a node of a Flower deployment computes for the clients it hosts
(``dcco.flower.placement`` says which).

A node answers for its sampled clients together: the sum of their statistics (phase 1), and
their sample-weighted average update with the total count (phase 2). Both are what the server
would compute from the clients one by one, so the round is the simulator's; the server checks
and weights nodes, not clients. Under FedSC's cache of absent clients
(``train.absent_statistics = "cached"``) phase 1 sends each client's statistics instead, as
the server keeps every client's last ones.

This module is framework-free (torch and dcco only): ``dcco.flower.app.handlers`` decodes a
message, calls these functions and encodes the reply.
"""

from __future__ import annotations

import functools
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import Tensor, nn

from dcco.config import RunConfig
from dcco.core.algorithm import Algorithm
from dcco.core.client import ClientUpdate, client_statistics, trainable_parameters
from dcco.core.client_state import restored, stored
from dcco.core.precision import prepare_model
from dcco.core.seeding import derive_seed
from dcco.core.stats import CCO_STATS, EncodingStats, Moments, StatsSpec, merge
from dcco.data.augment import training_views
from dcco.data.partition import Partition
from dcco.flower import codec
from dcco.methods.base import Method
from dcco.methods.predictive import target_decay
from dcco.models import DualEncoder
from dcco.run import setup
from dcco.run.algorithms import algorithm_of
from dcco.run.device_plan import resolve_device
from dcco.run.planning import build_partition
from dcco.run.splits import training_split


@dataclass(frozen=True)
class NodeData:
    """A node's copy of the training samples and the run's clients.

    Attributes:
        images: uint8 (M, C, H, W), the training split, on the node's device; for paired
            data the first modality (X, images or features).
        partition: all clients of the run (the node uses only those it hosts).
        second: the second modality (Y) of paired data, else None.
    """

    images: Tensor
    partition: Partition
    second: Tensor | None = None

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One sample's shape for each tower."""
        x = tuple(self.images.shape[1:])
        return x, (tuple(self.second.shape[1:]) if self.second is not None else x)


@functools.lru_cache(maxsize=1)
def node_data(cfg: RunConfig) -> NodeData:
    """The training split and the partition of ``cfg``.

    Cached per process (a pure function of the frozen config): in simulation a node's
    ClientApp runs many messages in one process; a deployed SuperNode starts one process per
    message and pays the load each time.
    """
    train = training_split(cfg)
    device = resolve_device(cfg.train.device)
    return NodeData(train.inputs(0).to(device), build_partition(cfg, train),
                    train.inputs(1).to(device) if train.paired else None)


@functools.lru_cache(maxsize=1)
def build_model(cfg: RunConfig, shapes: tuple[tuple[int, ...], ...]) -> DualEncoder:
    """The run's dual encoder on the configured device and dtype, for weights to be loaded.

    Cached per process like ``node_data``: every message loads the full weights it works on
    (``load_weights``), so one module serves every message (and in simulation every node).
    """
    model = setup.build_model(cfg, *shapes)
    # a node's clients come one message at a time, each of its own size (and over a
    # deployment, each in a fresh process), so compiling would cost more than it saves
    speed = replace(setup.speed_of(cfg), compile="off")
    model.unit_encodings = cfg.privacy.enabled  # a client's statistics bounded (dcco.core.privacy)
    return prepare_model(model, speed, resolve_device(cfg.train.device))


def client_views(cfg: RunConfig, data: NodeData, client: int,
                 round_index: int) -> tuple[Tensor, Tensor]:
    """Both inputs of one client's samples in round ``round_index``: two augmented views
    (N_k, C, H, W), or its pairs' X and Y.

    The same inputs as the simulator's (``dcco.run.pretraining.Pretraining.views``): augmentation is a
    hash of (seed, round, sample id, view), whichever batch a sample is in.
    """
    ids = data.partition.client(client).to(data.images.device)
    return training_views(data.images, data.second, ids, derive_seed(cfg.train.seed, "augment"),
                          round_index, cfg.augment, cfg.augment_y, setup.speed_of(cfg).param_dtype)


def node_statistics(cfg: RunConfig, data: NodeData, model: nn.Module, clients: Sequence[int],
                    round_index: int, spec: StatsSpec = CCO_STATS) -> EncodingStats:
    """Phase 1 for a node's sampled clients: the sum of their ``client_statistics``."""
    return merge(each_client_statistics(cfg, data, model, clients, round_index, spec))


def each_client_statistics(cfg: RunConfig, data: NodeData, model: nn.Module,
                           clients: Sequence[int], round_index: int,
                           spec: StatsSpec = CCO_STATS) -> list[EncodingStats]:
    """Phase 1 for a node's sampled clients one by one: each one's ``client_statistics``, in
    the order of ``clients`` (the server's cache of absent clients keeps each client's own,
    ``train.absent_statistics = "cached"``)."""
    return [client_statistics(model, *client_views(cfg, data, k, round_index), spec)
            for k in clients]


def node_update(cfg: RunConfig, algorithm: Algorithm | Method, data: NodeData,
                model: nn.Module, clients: Sequence[int], round_index: int,
                shared: Moments | None, states: NodeStates | None = None) -> ClientUpdate:
    """Phase 2 for a node's sampled clients: each one's ``client_update`` (the algorithm's
    local steps; a method alone takes the run's, ``train.local_*``), pooled. A method whose
    clients keep state between rounds (FedU, FedEMA, MoCo's queue) keeps it in ``states``
    (``ContextStates``, the node's ``context.state``, or ``dcco.flower.node_states.
    FolderStates``, the node's disk; ``stateful_updates``).

    Returns:
        Δ = Σ_k (N_k / N)·Δ_k over the node's clients, N = Σ_k N_k, each Δ_k scaled first
        by ``train.aggregation``'s rule (``Algorithm.combine``), and their sample-weighted
        loss: one client's reply to the server, standing for all of them.
    """
    if not isinstance(algorithm, Algorithm):
        algorithm = replace(algorithm_of(cfg), method=algorithm)
    if algorithm.stateful:
        updates = stateful_updates(cfg, algorithm, data, model, clients, round_index, states)
    else:
        updates = [algorithm.client_update(model, *client_views(cfg, data, k, round_index),
                                           shared) for k in clients]
    return algorithm.combine(updates, dict(trainable_parameters(model)))


CLIENT_STATE = "dcco.client-state."
"""A hosted client's state in the node's ``context.state``: ``dcco.client-state.<client>``."""


class NodeStates(Protocol):
    """Where a node keeps its clients' states: ``get`` (None: a client never seen) and
    ``put``, as the simulator's store."""

    def get(self, client: int, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict[str, Tensor] | None: ...

    def put(self, client: int, state: dict[str, Tensor]) -> None: ...


class ContextStates:
    """The node's clients' states in its ``context.state``, one record a client
    (``CLIENT_STATE``), held as ``train.client_state_dtype`` says. They last as long as
    Flower keeps the node's context, one Flower run."""

    def __init__(self, state: MutableMapping[str, object], dtype: torch.dtype) -> None:
        self.state, self.dtype = state, dtype

    def get(self, client: int, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict[str, Tensor] | None:
        record = self.state.get(f"{CLIENT_STATE}{client}")
        return None if record is None else restored(codec.tensors_of(record), self.dtype,
                                                    device, dtype)

    def put(self, client: int, state: dict[str, Tensor]) -> None:
        self.state[f"{CLIENT_STATE}{client}"] = codec.array_record(stored(state, self.dtype))


def stateful_updates(cfg: RunConfig, algorithm: Algorithm, data: NodeData, model: nn.Module,
                     clients: Sequence[int], round_index: int,
                     states: NodeStates | None) -> list[ClientUpdate]:
    """Each sampled client's round from what it kept (``Algorithm.stateful_updates``), as the
    simulator runs it; its new state replaces the old in ``states``."""
    if states is None:
        raise ValueError(f"{algorithm.method.name}'s clients keep state between rounds; the "
                         f"node needs its context.state or a state folder to hold it")
    probe = next(iter(model.parameters()))
    return algorithm.stateful_updates(
        model, ((k, *client_views(cfg, data, k, round_index)) for k in clients),
        lambda k: states.get(k, probe.device, probe.dtype), states.put,
        target_decay(cfg.loss.target_decay, round_index, cfg.train.rounds), round_index)


def load_weights(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Load the server's weights (a full ``state_dict``) into ``model``, in its dtype."""
    own = model.state_dict()
    if set(weights) != set(own):
        missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
        raise ValueError(f"the server's model does not fit this node's: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}; do server and nodes run one config?")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in weights.items()})
