"""The Flower run config: dcco's ``RunConfig`` plus the settings of the Flower adapter.

Flower hands every ServerApp and ClientApp the same flat ``context.run_config``: the keys that
``[tool.flwr.app.config]`` of ``pyproject.toml`` declares, overridden by ``flwr run
--run-config``. Keys are dotted: ``train.method``, ``model.widths``, ... are the fields of
``dcco.config.RunConfig`` (checked by ``dcco.config.load_config`` and
``dcco.run.setup.resolved``, so an unknown key or a bad value is a ``ConfigError`` naming the
key), and ``flower.*`` are the fields of
``FlowerConfig``. Flower config values are scalars, so list and optional fields are written as
strings: ``model.widths = "[16, 32, 64]"``, ``data.num_clients = "none"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Literal

from dcco.config import ConfigError, RunConfig, from_dict, load_config
from dcco.run.setup import resolved

FlowerValue = bool | int | float | str
"""A value of Flower's ``UserConfig``."""

SECTION = "flower"


@dataclass(frozen=True)
class FlowerConfig:
    """Settings of a Flower run that a simulator run does not have.

    Secure aggregation (``secagg``) runs both exchanges of a round through Flower's SecAgg+;
    see ``dcco.flower.secagg`` for the ranges and ``docs/flower.md`` for the error they cause.
    """

    run_dir: str = ""
    """Where the ServerApp writes the run directory; "" = ``runs/flower-<method>-<time>``.
    Relative paths are relative to the ServerApp's working directory (the SuperLink's)."""
    resume: bool = False
    """Continue the run in ``run_dir`` from its checkpoint."""
    timeout: float = 600.0
    """Seconds the server waits for the replies of one exchange; late replies are dropouts."""
    min_survivors: int = 2
    """A round whose phase has fewer valid replies (nodes) is skipped and logged."""
    min_nodes: int = 2
    """Connected SuperNodes needed before the first round."""
    wait_nodes: float = 120.0
    """Seconds to wait for ``min_nodes`` SuperNodes before giving up."""
    worker: Literal["auto", True, False] = "auto"
    """Each node answers from a long-lived worker process that holds torch, the data and the
    model (``dcco.flower.app.worker``), instead of importing them in the process Flower starts
    for every message. ``auto``: where the ClientApp runs in such a process (a deployed
    SuperNode's ``flwr-clientapp``), not in Flower's simulation, whose long-lived Ray actors
    keep their imports (``dcco.flower.app.worker.enabled``)."""
    secagg: bool = False
    """Aggregate statistics and updates with SecAgg+: the server sees only sums."""
    secagg_stats_clip: float = 64.0
    """Clipping range of the statistics, in units of the round's reference frame (encodings
    standardised by the server's calibration batch): a node's second moments up to 64, i.e.
    encodings ≈ 8 reference standard deviations away from the reference mean, pass unclipped."""
    secagg_update_clip: float = 64.0
    """Clipping range of the updates, in units of the round's update scale (the largest
    |Δ| of the server's calibration step)."""
    secagg_quantization: int = 1 << 22
    """Quantisation levels over [−clip, clip] (Flower's default 2^22)."""
    secagg_modulus: int = 1 << 32
    """Modulus of the masked sums, a power of two; nodes per round × levels must stay below."""
    secagg_shares: float = 1.0
    """Secret shares per node, as a fraction of the round's nodes."""
    secagg_threshold: float = 0.5
    """Shares needed to reconstruct a dropped node's mask, as a fraction of the shares."""

    def __post_init__(self) -> None:
        for name in ("timeout", "wait_nodes", "secagg_stats_clip", "secagg_update_clip"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"flower.{name} must be a finite number > 0, got {value}")
        for name in ("min_survivors", "min_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"flower.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("secagg_stats_clip", "secagg_update_clip"):
            if getattr(self, name) < 1:
                raise ValueError(f"flower.{name} must be >= 1 (the loss and clipped-fraction "
                                 f"channels use [0, 1]), got {getattr(self, name)}")
        if self.secagg_quantization < 2:
            raise ValueError(f"flower.secagg_quantization must be >= 2, "
                             f"got {self.secagg_quantization}")
        m = self.secagg_modulus
        if m <= self.secagg_quantization or m > 1 << 32 or m & (m - 1):
            raise ValueError(f"flower.secagg_modulus must be a power of two above "
                             f"flower.secagg_quantization and at most 2^32, got {m}")
        if not 0 < self.secagg_shares <= 1:
            raise ValueError(f"flower.secagg_shares must be in (0, 1], got {self.secagg_shares}")
        if not 0 < self.secagg_threshold <= 1:
            raise ValueError(f"flower.secagg_threshold must be in (0, 1], "
                             f"got {self.secagg_threshold}")


def parse_run_config(run_config: Mapping[str, FlowerValue]) -> tuple[RunConfig, FlowerConfig]:
    """Flower's flat run config → (dcco run config, adapter settings), fully validated.

    Args:
        run_config: ``context.run_config``: dotted keys, e.g. ``{"train.method": "dcco",
            "model.widths": "[16, 32, 64]", "flower.secagg": True}``.

    Raises:
        ConfigError: an unknown key, or a value of the wrong type or out of range.
    """
    sections = {f.name for f in fields(RunConfig)}
    overrides, flower = [], {}
    for key, value in run_config.items():
        section, _, name = key.partition(".")
        if section == SECTION and name:
            flower[name] = value
        elif section in sections and name:
            overrides.append(f"{key}={_toml_text(value)}")
        else:
            raise ConfigError(
                f"unknown run-config key '{key}'; keys are 'flower.<setting>' or "
                f"'<section>.<field>' with a section of {', '.join(sorted(sections))}"
            )
    cfg = resolved(load_config(None, overrides))
    if cfg.model.norm == "bn":
        raise ConfigError("model.norm = 'bn' is not supported over Flower: each client's "
                          "batch-norm running statistics would stay on its device, and the "
                          "server's model would evaluate with its initial ones; use 'gn'")
    if cfg.train.client_weighting != "samples":
        raise ConfigError("train.client_weighting = 'uniform' is not supported over Flower: "
                          "a node replies with its clients' sample-weighted update; use "
                          "'samples' (the same over clients of one size)")
    fcfg = from_dict(FlowerConfig, flower, SECTION)
    if cfg.train.absent_statistics == "cached" and fcfg.secagg:
        raise ConfigError("train.absent_statistics = 'cached' is not supported with "
                          "flower.secagg = true: SecAgg+ shows the server only the sum of the "
                          "nodes' statistics, so it has no client's own to keep; use 'drop', "
                          "or plain exchanges")
    return cfg, fcfg


def run_config_entries(cfg: RunConfig, fcfg: FlowerConfig) -> dict[str, FlowerValue]:
    """The flat Flower run config that ``parse_run_config`` turns back into (cfg, fcfg)."""
    entries: dict[str, FlowerValue] = {}
    for section, values in asdict(cfg).items():
        for name, value in values.items():
            entries[f"{section}.{name}"] = _flower_value(value)
    for name, value in asdict(fcfg).items():
        entries[f"{SECTION}.{name}"] = value
    return entries


def _flower_value(value: object) -> FlowerValue:
    """A config field's value as a Flower scalar: lists and None become TOML text."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(repr(v) for v in value) + "]"
    if isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"config value {value!r} has no Flower form")


def _toml_text(value: FlowerValue) -> str:
    """The text ``dcco.config``'s override parser reads back as ``value``; strings are passed
    through, so that TOML text such as "[4, 8, 8]" or "none" is parsed by it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    raise ConfigError(f"run-config value {value!r} must be a bool, number or string")
