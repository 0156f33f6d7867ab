"""Which nodes a round of the public strategy asks (``dcco.flower.DCCOStrategy``): a fraction
of the connected ones, at least a minimum, once enough are connected, as Flower's ``FedAvg``
samples them. Training and federated evaluation draw from streams of their own, so that
evaluating leaves training's sample of nodes as it would be without it; both streams are
kept in the strategy's checkpoint."""

from __future__ import annotations

import logging
import random
import time

from flwr.serverapp import Grid

from dcco.core.seeding import derive_seed

LOG = logging.getLogger("flwr.dcco")


class NodeSampler:
    """The nodes of each round's training and evaluation.

    Args:
        fraction_train, min_train_nodes: training's share of the connected nodes, and its
            fewest.
        fraction_evaluate, min_evaluate_nodes: evaluation's (``fraction_evaluate = 0``:
            none).
        min_available_nodes: nodes to wait for before sampling.
        seed: the run's seed (training's stream; evaluation's is derived from it).
    """

    def __init__(self, fraction_train: float, min_train_nodes: int, fraction_evaluate: float,
                 min_evaluate_nodes: int, min_available_nodes: int, seed: int) -> None:
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if not 0 <= fraction_evaluate <= 1:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if min(min_train_nodes, min_available_nodes) < 1:
            raise ValueError("min_train_nodes and min_available_nodes must be >= 1")
        if min_evaluate_nodes < 0:
            raise ValueError(f"min_evaluate_nodes must be >= 0, got {min_evaluate_nodes}")
        self.fraction_train, self.min_train_nodes = fraction_train, min_train_nodes
        self.fraction_evaluate = fraction_evaluate
        self.min_evaluate_nodes = 0 if fraction_evaluate == 0 else min_evaluate_nodes
        self.min_available_nodes, self.seed = min_available_nodes, seed
        self.begin()

    def begin(self) -> None:
        """Both streams from the start (a run's ``begin``)."""
        self._train = random.Random(self.seed)
        self._evaluate = random.Random(derive_seed(self.seed, "evaluate"))

    def train(self, grid: Grid) -> list[int]:
        """A round's training nodes, sorted."""
        return self._sample(grid, self._train, self.fraction_train, self.min_train_nodes)

    def evaluate(self, grid: Grid) -> list[int]:
        """A round's evaluation nodes, sorted (none at ``fraction_evaluate = 0``)."""
        if self.fraction_evaluate == 0:
            return []
        return self._sample(grid, self._evaluate, self.fraction_evaluate,
                            self.min_evaluate_nodes)

    def _sample(self, grid: Grid, rng: random.Random, fraction: float, minimum: int
                ) -> list[int]:
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            LOG.info("waiting for nodes: %d connected, %d needed", len(nodes),
                     self.min_available_nodes)
            time.sleep(1.0)
        k = min(len(nodes), max(minimum, int(fraction * len(nodes))))
        return sorted(rng.sample(nodes, k))

    def state(self) -> dict:
        """Both streams' states, as plain lists (a checkpoint's ``weights_only`` load)."""
        return {"rng": _plain(self._train), "eval_rng": _plain(self._evaluate)}

    def load(self, state: dict) -> None:
        self._train.setstate(_tuple(state["rng"]))
        self._evaluate.setstate(_tuple(state["eval_rng"]))


def _plain(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _tuple(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


__all__ = ["NodeSampler"]
