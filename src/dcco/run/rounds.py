"""Planning a round, split by job (2026-11-28): ``devices``, ``sampling``, ``planning``,
``algorithms``, ``views`` and ``privacy`` under ``dcco.run``. The old names import from here
with a ``DeprecationWarning`` that names each one's new module."""

from __future__ import annotations

from dcco.moved import moved_names

MOVED_TO = {
    "build_partition": "dcco.run.planning",
    "clients_seen": "dcco.run.sampling",
    "sample_clients": "dcco.run.sampling",
}
"""Each name this module held that the docs or a docstring showed a user, and its module
now; the names only ever imported inside dcco went without a shim."""


__getattr__ = moved_names(__name__, MOVED_TO)
