"""dcco: federated training of dual encoders on small non-IID clients.

Implements Distributed Cross Correlation Optimization (DCCO; Vemulapalli et al., ICLR 2023)
and the baselines the paper compares with, on a fast single-machine simulator and over Flower.

Layers, dependencies flowing one way:
``stats``/``losses`` (pure math) → ``client`` (one client's work) → ``methods`` (the losses)
→ ``algorithm`` (the round) → ``simulator``/``flower`` (executors) → ``train`` → ``cli``.

``dcco.load_encoder(RUN_DIR)`` gives a trained encoder as a plain ``torch.nn.Module``
(``dcco.encoders``). DCCO in your own code (``dcco.api``, docs/own_code.md): ``dcco.fit``
trains your encoder over your clients in the simulator; ``statistics``, ``merge_statistics``,
``local_update``, ``aggregate_updates`` and ``apply_update`` are a round's parts, for your own
loop or deployment.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


_API = ("Aggregated", "FitResult", "Merged", "aggregate_updates", "apply_update",
        "dual_encoder", "fit", "linear_probe", "local_update", "merge_statistics",
        "server_optimizer", "statistics")


def __getattr__(name: str) -> Any:
    # imported on first use, so that `import dcco` stays light (no torch)
    if name in ("load_encoder", "export_encoder", "Encoder"):
        from dcco import encoders

        return getattr(encoders, name)
    if name in _API:
        from dcco import api

        return getattr(api, name)
    if name == "ImageViews":
        from dcco.image_views import ImageViews

        return ImageViews
    raise AttributeError(f"module 'dcco' has no attribute {name!r}")


__all__ = ["Aggregated", "Encoder", "FitResult", "ImageViews", "Merged", "__version__",
           "aggregate_updates",
           "apply_update", "dual_encoder", "export_encoder", "fit", "linear_probe",
           "load_encoder", "local_update", "merge_statistics", "server_optimizer",
           "statistics"]


def __dir__() -> list[str]:
    """The public names (``__all__``), which are imported on first use."""
    return sorted(set(__all__) | set(globals()))
