"""Old import paths, each pointing to where its module went.

The package was arranged by layer (``core``, ``data``, ``run``, ``flower/app``, ...); a
script written against an earlier layout, ``from dcco.stats import encoding_stats`` say, still
runs: the import gives the module at its new path and a ``DeprecationWarning`` that names it.
``MOVED`` is the whole list (CHANGELOG.md, "Moved"); ``install`` puts the finder on
``sys.meta_path`` after Python's own, so that it only answers for paths nothing else holds.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED = {
    "dcco.algorithm": "dcco.core.algorithm",
    "dcco.augment": "dcco.data.augment",
    "dcco.checkpoint": "dcco.run.checkpoint",
    "dcco.cli.grid": "dcco.cli.reproduce_command",
    "dcco.client": "dcco.core.client",
    "dcco.collapse": "dcco.core.collapse",
    "dcco.data.splits": "dcco.run.splits",
    "dcco.devices": "dcco.core.devices",
    "dcco.distributed": "dcco.core.distributed",
    "dcco.encoders": "dcco.run.encoders",
    "dcco.evaluate.runs": "dcco.run.evaluations",
    "dcco.experiments": "dcco.run.evaluations",
    "dcco.flower.appwire": "dcco.flower.app.wire",
    "dcco.flower.client_app": "dcco.flower.app.client_app",
    "dcco.flower.federation": "dcco.flower.app.federation",
    "dcco.flower.floor": "dcco.flower.testing.floor",
    "dcco.flower.handlers": "dcco.flower.app.handlers",
    "dcco.flower.inprocess": "dcco.flower.testing.inprocess",
    "dcco.flower.loopback": "dcco.flower.testing.loopback",
    "dcco.flower.nodes": "dcco.flower.app.nodes",
    "dcco.flower.run": "dcco.flower.app.run",
    "dcco.flower.server_app": "dcco.flower.app.server_app",
    "dcco.flower.strategy.checkpoint": "dcco.flower.strategy.strategy_checkpoint",
    "dcco.flower.strategy.evaluation": "dcco.flower.strategy.federated_evaluation",
    "dcco.flower.strategy.rounds": "dcco.flower.strategy.round_steps",
    "dcco.flower.strategy.sampling": "dcco.flower.strategy.node_sampling",
    "dcco.flower.worker": "dcco.flower.app.worker",
    "dcco.losses": "dcco.core.losses",
    "dcco.optim": "dcco.core.optim",
    "dcco.precision": "dcco.core.precision",
    "dcco.privacy": "dcco.core.privacy",
    "dcco.progress": "dcco.run.progress",
    "dcco.report": "dcco.run.report",
    "dcco.reproduce.tables": "dcco.reproduce.result_tables",
    "dcco.run.devices": "dcco.run.device_plan",
    "dcco.run.privacy": "dcco.run.privacy_plan",
    "dcco.rundir": "dcco.run.rundir",
    "dcco.seeding": "dcco.core.seeding",
    "dcco.server": "dcco.core.server",
    "dcco.simulator": "dcco.core.simulator",
    "dcco.statistics_cache": "dcco.core.statistics_cache",
    "dcco.stats": "dcco.core.stats",
}
"""Each old module path and its new one (the layout of 2026-11, by layer, and the names of
2026-12 that say a file's layer where two shared one): those that README,
docs/ or a docstring showed a user at some commit. The paths that were only ever imported
inside dcco went without a shim (CHANGELOG.md, "Removed")."""

CONFIG_CLASSES = ("AugmentConfig", "DataConfig", "EvalConfig", "LossConfig", "ModelConfig",
                  "OptimConfig", "PrivacyConfig", "RunConfig", "TableConfig", "TrainConfig")
"""The config classes: each has one import path, ``dcco.config`` (2026-11-28)."""

MOVED_NAMES = {
    "dcco.core.optim": ("OptimConfig",),
    "dcco.data.augment": ("AugmentConfig",),
    "dcco.methods.base": ("LossConfig",),
}
"""Names that a module used to export, that the docs or a docstring showed there, and that
``dcco.config`` now holds alone: the old import still gives the object, with a
``DeprecationWarning`` (``moved_names``)."""


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of an old path with the module at its new one."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes "
                      f"in a later release; CHANGELOG.md lists every move)", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path already."""


def moved_names(module: str, to: dict[str, str] | None = None):
    """A module ``__getattr__`` for the names ``module`` no longer holds: each old name gives
    the object from its new module, with a ``DeprecationWarning`` that names the new path.
    ``to``: each name's new module; None: ``MOVED_NAMES[module]``, all now in ``dcco.config``."""
    homes = to if to is not None else dict.fromkeys(MOVED_NAMES[module], "dcco.config")

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {homes[name]}.{name}; import it from there "
                      f"(the old path goes in a later release; CHANGELOG.md lists every move)",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__


def install() -> None:
    """Put the finder on ``sys.meta_path``, once, after Python's own finders."""
    if not any(isinstance(f, _Moved) for f in sys.meta_path):
        sys.meta_path.append(_Moved())


__all__ = ["CONFIG_CLASSES", "MOVED", "MOVED_NAMES", "install", "moved_names"]
