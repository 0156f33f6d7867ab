"""A run's clients (the partition) and a round's samples grouped by client, before anything is
written; and the record of the data's input shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from dcco.config import ConfigError, RunConfig
from dcco.core.method import Segments
from dcco.data.augment import is_image
from dcco.data.paired import Dataset
from dcco.data.partition import (
    Partition,
    clients_of_at_least,
    dirichlet_partition,
    natural_partition,
)
from dcco.methods.registry import METHODS
from dcco.run.sampling import centralized_batch, sample_clients


def input_record(data: Dataset) -> dict[str, Any]:
    """``input_shape`` (one sample of X, or of the images) and ``input_kind`` ("images" or
    "features"), with ``input_shape_y`` and ``input_kind_y`` for pairs."""
    record: dict[str, Any] = {}
    for tower, suffix in enumerate(("", "_y")[: 1 + data.paired]):
        record[f"input_shape{suffix}"] = list(data.input_shapes[tower])
        record[f"input_kind{suffix}"] = "images" if is_image(data.inputs(tower)) else "features"
    return record


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


__all__ = ["RoundPlan", "build_partition", "input_record", "plan_round"]
