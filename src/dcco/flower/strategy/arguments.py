"""The public strategy's arguments, checked before a run: Flower ``FedAvg``'s that it cannot
honour refused by name with the reason, the method and its loss's settings, the head a
predictive method needs in the model, FedSC's cache of absent nodes, and SecAgg+'s needs. Each error names the argument and says what to pass instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import ConfigRecord

from dcco.config import LossConfig
from dcco.config.toml import from_dict
from dcco.core.method import Method
from dcco.flower.secure_round import SecAgg
from dcco.methods.predictive import PredictiveMethod, head_mismatch, head_parts
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
                    secagg: SecAgg | None, loss: Mapping[str, Any] | None = None) -> Method:
    """The method a strategy runs, with λ and ``loss``'s other settings of its loss
    (``dcco.config.LossConfig``'s keys), checked against the strategy's other choices."""
    given = dict(loss or {})
    if "lambd" in given:
        raise ValueError("loss['lambd']: λ is the strategy's own argument; give lambd=")
    try:
        LossConfig(lambd=lambd)
    except ValueError as e:
        raise ValueError(f"lambd = {lambd!r}: {e}") from None
    config = from_dict(LossConfig, given | {"lambd": lambd}, "loss")  # names a bad key
    built = build_method(method, config)
    if not built.federated:
        raise ValueError(f"{method} is centralized; a strategy needs a federated method")
    if isinstance(built, PredictiveMethod) and secagg is not None:
        raise ValueError(f"{method} under SecAgg+ is not implemented (its clients' state and "
                         f"head run with plain messages only); use secagg=None")
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


def train_config_checked(config: ConfigRecord | None, local_lr: float, lr: float
                         ) -> ConfigRecord:
    """``start``'s ``train_config`` (an empty one for None), refused with a ``lr`` in it."""
    config = config or ConfigRecord()
    if "lr" in config:
        raise ValueError(f"train_config['lr'] = {config['lr']!r}: DCCO's nodes take one "
                         f"SGD step at the strategy's local_lr ({local_lr:g}, the "
                         f"paper's) and the server's optimiser sets the model's step "
                         f"(DCCOStrategy(lr={lr:g})); remove 'lr' from "
                         f"train_config and set DCCOStrategy(lr=...) instead")
    return config


def check_arrays(method: Method, secagg: SecAgg | None, weights: Mapping[str, Any]) -> None:
    """That the model's arrays (``initial_arrays``) hold SecAgg+'s model's, and what
    ``method`` trains with: BYOL's and SimSiam's predictor, BYOL's target network, MoCo's
    key encoder, which ``dcco.dual_encoder(..., method=...)`` builds."""
    if secagg is not None and (lacking := [k for k in secagg.model.state_dict()
                                           if k not in weights]):
        raise ValueError(f"initial_arrays lacks {lacking[0]} of secagg.model; give the "
                         f"state_dict of the nodes' model")
    hint = (f"give the state_dict of dcco.dual_encoder(encoder, projector, "
            f"method={method.name!r}), and build the nodes' model the same way")
    if not any(k.startswith("backbone.") for k in weights):  # not a dual encoder's arrays
        if any(head_parts(method)):
            raise ValueError(f"initial_arrays are not a dual encoder's, and {method.name} "
                             f"trains with a predictor or a target network: {hint}")
        return
    wrong = head_mismatch(method, any(k.startswith("predictor.") for k in weights),
                          any(k.startswith("target.") for k in weights))
    if wrong is not None:
        what, needed = wrong
        raise ValueError(f"initial_arrays {'have no' if needed else 'hold a'} {what}, "
                         f"which {method.name} {'trains with' if needed else 'has not'}: "
                         f"{hint}")


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


CONFIG_KEYS = {
    "optim.optimizer": "optimizer", "optim.lr": "lr", "optim.weight_decay": "weight_decay",
    "optim.warmup_rounds": "warmup_rounds", "optim.schedule": "schedule",
    "optim.vector_lr_scale": "vector_lr_scale", "train.aggregation": "aggregation",
    "train.local_lr": "local_lr", "loss.": "loss: ",
}
"""The config keys of the checks ``DCCOStrategy`` runs, by the argument that sets them."""


__all__ = ["CONFIG_KEYS", "check_arrays", "refuse_fedavg_arguments", "strategy_method",
           "train_config_checked", "trained_names"]

