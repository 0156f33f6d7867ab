"""dcco: federated training of dual encoders on small non-IID clients.

Implements Distributed Cross Correlation Optimization (DCCO; Vemulapalli et al., ICLR 2023)
and the baselines the paper compares with, on a fast single-machine simulator and over Flower.

The package, layer by layer (dependencies flow one way, down; docs/architecture.md, and
``tests/test_layers.py`` checks it): ``core`` (statistics, losses, the client's and the
server's parts, the algorithm's round, its executors) with ``methods``, ``models``, ``data``
and ``evaluate``; ``config``; ``run`` (the loop, run directories, checkpoints), ``flower``
and ``reproduce``; the public API (``api``, ``fitting``); ``cli``.

What a user imports is re-exported here, each imported on first use (``import dcco`` stays
light): ``dcco.fit`` trains your encoder over your clients in the simulator and
``dcco.linear_probe`` scores it (``dcco.fitting``); ``statistics``, ``merge_statistics``,
``local_update``, ``aggregate_updates`` and ``apply_update`` are a round's parts for your own
loop or deployment, and ``dcco.method`` gives them loss settings of your own (``dcco.api``);
``dcco.load_encoder(RUN_DIR)`` gives a trained encoder as
a plain ``torch.nn.Module`` (``dcco.run.encoders``); ``dcco.ImageViews`` is a ready image
augmentation. ``dcco.flower`` holds the Flower strategy and client helper.

The errors a caller can catch: ``dcco.UserError`` (a ``ValueError``), raised for bad input and
naming it, with its two kinds ``dcco.ConfigError`` (a setting, a config file, a run directory
holding other settings) and ``dcco.DataError`` (samples, data files); and ``dcco.Diverged``
(a ``FloatingPointError``), raised when training's loss stops being finite, naming the round
and its likely cause. Any other exception is a bug of dcco's.
"""

from __future__ import annotations

from typing import Any

from dcco import moved as _moved  # old import paths point to their new homes
from dcco.version import __version__

_moved.install()


_API = ("Aggregated", "Merged", "aggregate_updates", "apply_update", "dual_encoder",
        "local_update", "merge_statistics", "method", "server_optimizer", "statistics")
_FITTING = ("FitResult", "fit", "linear_probe")


def __getattr__(name: str) -> Any:
    # imported on first use, so that `import dcco` stays light (no torch)
    if name in ("load_encoder", "export_encoder", "Encoder"):
        from dcco.run import encoders

        return getattr(encoders, name)
    if name in _API:
        from dcco import api

        return getattr(api, name)
    if name in _FITTING:
        from dcco import fitting

        return getattr(fitting, name)
    if name in ("UserError", "ArgumentError"):
        from dcco import errors

        return getattr(errors, name)
    if name == "ConfigError":
        from dcco.config import ConfigError

        return ConfigError
    if name == "DataError":
        from dcco.data.datasets import DataError

        return DataError
    if name == "CollapseWarning":
        from dcco.core.collapse import CollapseWarning

        return CollapseWarning
    if name == "Diverged":
        from dcco.run.pretraining import Diverged

        return Diverged
    if name == "ImageViews":
        from dcco.data.image_views import ImageViews

        return ImageViews
    raise AttributeError(f"module 'dcco' has no attribute {name!r}")


__all__ = ["Aggregated", "ArgumentError", "CollapseWarning", "ConfigError", "DataError", "Diverged", "Encoder", "FitResult",
           "ImageViews", "Merged", "UserError", "__version__", "aggregate_updates",
           "apply_update", "dual_encoder", "export_encoder", "fit", "linear_probe",
           "load_encoder", "local_update", "merge_statistics", "method", "server_optimizer",
           "statistics"]


def __dir__() -> list[str]:
    """The public names (``__all__``, imported on first use): no helper of this module's."""
    return sorted(__all__)
