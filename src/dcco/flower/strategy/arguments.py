"""The public strategy's arguments, checked before a run: Flower ``FedAvg``'s that it cannot
honour refused by name with the reason, the method, FedSC's cache of absent nodes, and
SecAgg+'s needs. Each error names the argument and says what to pass instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dcco.config import LossConfig
from dcco.core.method import Method
from dcco.flower.secure_round import SecAgg
from dcco.methods.predictive import PredictiveMethod
from dcco.methods.registry import build_method


def refuse_fedavg_arguments(train_metrics_aggr_fn: Callable | None,
                            weighted_by_key: str) -> None:
    """``FedAvg``'s arguments that DCCO's round cannot honour."""
    if train_metrics_aggr_fn is not None:
        raise ValueError("train_metrics_aggr_fn: DCCO's training metrics are its own (the "
                         "round's loss over its valid updates, samples, reply counters "
                         "and collapse figures, in Result.train_metrics_clientapp); "
                         "leave it unset")
    if weighted_by_key != "num-examples":
        raise ValueError(f"weighted_by_key = {weighted_by_key!r}: DCCO's exact round "
                         f"weighs each node by its sample count, which "
                         f"dcco.flower.answer reports as 'num-examples'; leave it unset")


def strategy_method(method: str, lambd: float, absent_statistics: str,
                    secagg: SecAgg | None) -> Method:
    """The method a strategy runs, with λ, checked against the strategy's other choices."""
    built = build_method(method, LossConfig(lambd=lambd))
    if not built.federated:
        raise ValueError(f"{method} is centralized; a strategy needs a federated method")
    if built.stateful:
        raise ValueError(f"{method}'s clients keep state between rounds, which runs in "
                         f"dcco's simulator and dcco's own Flower app (dcco.flower.app); "
                         f"in a Flower app of your own it is not implemented yet")
    predictive = isinstance(built, PredictiveMethod)  # BYOL's, SimSiam's head
    if predictive:
        raise ValueError(f"{method} needs a predictor and a target network around the nodes' "
                         f"encoder (and a server that moves BYOL's target), which runs in "
                         f"dcco's simulator and dcco's own Flower app (dcco.flower.app); "
                         f"in a Flower app of your own it is not implemented yet")
    if absent_statistics not in ("drop", "cached"):
        raise ValueError(f"absent_statistics must be 'drop' or 'cached', got "
                         f"{absent_statistics!r}")
    if absent_statistics == "cached" and built.stats is None:
        raise ValueError(f"absent_statistics='cached' keeps each node's statistics; "
                         f"{method} shares none")
    if absent_statistics == "cached" and secagg is not None:
        raise ValueError("absent_statistics='cached' keeps each node's statistics, and "
                         "SecAgg+ shows the server only their sum: use plain messages "
                         "(secagg=None) or 'drop'")
    return built


def trained_names(trained: Iterable[str] | None, secagg: SecAgg | None, min_train_nodes: int,
                  min_available_nodes: int) -> list[str] | None:
    """The names of the arrays the nodes train: ``trained``, or under SecAgg+ the
    parameters of ``secagg.model`` that require gradients (in its order)."""
    given = None if trained is None else list(trained)
    if secagg is None:
        return given
    if not isinstance(secagg, SecAgg):
        raise TypeError(f"secagg must be a dcco.flower.SecAgg, got {type(secagg).__name__}")
    if min(min_train_nodes, min_available_nodes) < 2:
        raise ValueError("SecAgg+ needs at least 2 nodes an exchange: set min_train_nodes "
                         "and min_available_nodes >= 2")
    learned = {k for k, p in secagg.model.named_parameters() if p.requires_grad}
    order = [k for k in secagg.model.state_dict() if k in learned]
    if given is not None and set(given) != set(order):
        raise ValueError("under SecAgg+ the trained arrays are the parameters of "
                         "secagg.model that require gradients; leave trained=None")
    return order


__all__ = ["refuse_fedavg_arguments", "strategy_method", "trained_names"]
