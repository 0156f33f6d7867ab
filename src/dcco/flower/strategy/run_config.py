"""The strategy's settings from Flower's run config (``DCCOStrategy.from_run_config``): the
keys ``dcco.<argument>`` of ``context.run_config``, each argument's name with ``-`` for
``_`` (``dcco.lr``, ``dcco.warmup-rounds``), and ``dcco.loss.<key>`` for the loss's other
settings (``dcco.config.LossConfig``'s keys). An app declares them in its
``pyproject.toml`` (``[tool.flwr.app.config]``), where ``flwr run --run-config`` can change
them: Flower refuses an override of a key the app does not declare."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dcco.config import ConfigError

PREFIX = "dcco."
LOSS = "loss."
KEYS: dict[str, type] = {
    "method": str, "optimizer": str, "lr": float, "weight-decay": float,
    "warmup-rounds": int, "schedule": str, "vector-lr-scale": float, "local-lr": float,
    "lambd": float, "fraction-train": float, "fraction-evaluate": float,
    "min-train-nodes": int, "min-evaluate-nodes": int, "min-available-nodes": int,
    "min-survivors": int, "seed": int, "absent-statistics": str, "checkpoint": Path,
    "metrics-file": Path, "aggregation": str,
}
"""The settings a run config can give, after ``dcco.``, and their types (``Path``: a
string, ``""`` for none)."""


def strategy_arguments(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """``DCCOStrategy``'s keyword arguments that ``run_config`` gives; its keys outside
    ``dcco.`` are the app's own and left alone.

    Raises:
        ConfigError: a ``dcco.`` key that names no setting (with the closest one), or a value
            of the wrong type, named by its key.
    """
    out: dict[str, Any] = {}
    loss: dict[str, Any] = {}
    for key, value in run_config.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        if name.startswith(LOSS) and len(name) > len(LOSS):
            loss[name[len(LOSS):].replace("-", "_")] = value
            continue
        if name not in KEYS:
            close = difflib.get_close_matches(name, list(KEYS), n=1)
            hint = f"; did you mean '{PREFIX}{close[0]}'?" if close else ""
            raise ConfigError(f"run-config key '{key}' is no DCCOStrategy setting{hint} (the "
                              f"settings: {', '.join(PREFIX + k for k in KEYS)}, and "
                              f"{PREFIX}{LOSS}<key> for the loss's)")
        out[name.replace("-", "_")] = _typed(key, value, KEYS[name])
    if loss:
        out["loss"] = loss
    return out


def _typed(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind``: an integer for a float, a whole float for an integer, a string
    for a path (``""``: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"run-config key '{key}' = {value!r}: expected {_name(kind)}")
    if kind is float and isinstance(value, (int, float)):
        return float(value)
    if kind is int and isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    if kind in (str, Path) and isinstance(value, str):
        return None if kind is Path and value == "" else value
    raise ConfigError(f"run-config key '{key}' = {value!r}: expected {_name(kind)}")


def _name(kind: type) -> str:
    return {float: "a number", int: "an integer", str: "a string",
            Path: 'a path (a string; "" for none)'}[kind]


__all__ = ["KEYS", "PREFIX", "strategy_arguments"]
