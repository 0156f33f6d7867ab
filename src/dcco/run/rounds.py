"""Planning a round, split by job (2026-11-28): ``devices``, ``sampling``, ``planning``,
``algorithms``, ``views`` and ``privacy`` under ``dcco.run``. The old names import from here
with a ``DeprecationWarning`` that names each one's new module."""

from __future__ import annotations

import importlib
import warnings

MOVED_TO = {
    "Privacy": "dcco.run.privacy",
    "RoundPlan": "dcco.run.planning",
    "algorithm_of": "dcco.run.algorithms",
    "build_partition": "dcco.run.planning",
    "centralized_batch": "dcco.run.sampling",
    "clients_seen": "dcco.run.sampling",
    "fedsc_alpha": "dcco.run.algorithms",
    "input_record": "dcco.run.planning",
    "keeps_graphs": "dcco.run.devices",
    "max_batch_of": "dcco.run.devices",
    "plan_round": "dcco.run.planning",
    "resolve_device": "dcco.run.devices",
    "sample_clients": "dcco.run.sampling",
    "user_views": "dcco.run.views",
}
"""Each name this module held and its module now."""


def __getattr__(name: str):
    if name not in MOVED_TO:
        raise AttributeError(f"module 'dcco.run.rounds' has no attribute {name!r}")
    warnings.warn(f"dcco.run.rounds.{name} moved to {MOVED_TO[name]}.{name}; import it from "
                  f"there (the old path goes in a later release)", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module(MOVED_TO[name]), name)
