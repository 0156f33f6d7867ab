"""Planning a round, split by job (2026-11-28): ``devices``, ``sampling``, ``planning``,
``algorithms``, ``views`` and ``privacy`` under ``dcco.run``. The old names import from here
with a ``DeprecationWarning`` that names each one's new module."""

from __future__ import annotations

from dcco.moved import moved_names

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


__getattr__ = moved_names(__name__, MOVED_TO)
