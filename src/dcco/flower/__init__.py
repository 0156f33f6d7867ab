"""A Flower app for dcco: the simulator's round across processes and machines.

``client_app`` and ``server_app`` are the two Flower components (``pyproject.toml``,
``[tool.flwr.app.components]``); they decode messages (``codec``), call the library's client
and server functions (``nodes``, ``federation``, ``dcco.core.client``, ``dcco.core.server``) and encode
the replies. ``secagg`` runs both exchanges through Flower's SecAgg+; ``inprocess`` runs the
apps in one process for tests. This package imports Flower; the rest of dcco never does.
See ``docs/flower.md``.

For your own Flower app (docs/own_code.md): ``dcco.flower.DCCO``, a strategy your ServerApp
starts as it would start Flower's ``FedAvg`` (``strategy``), and ``dcco.flower.answer``, what
your ClientApp's ``train`` handler returns (``userapp``), with ``ImageViews``, a ready image
augmentation; ``SecAgg`` and ``secure_aggregation_mod`` for SecAgg+ (``secure_round``,
``mods``). They are imported on
first use, so that the ClientApp's module stays free of torch.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "DCCO":
        from dcco.flower.strategy import DCCO

        return DCCO
    if name == "SecAgg":
        from dcco.flower.secure_round import SecAgg

        return SecAgg
    if name == "secure_aggregation_mod":
        from dcco.flower.mods import secure_aggregation_mod

        return secure_aggregation_mod
    if name == "answer":
        from dcco.flower.userapp import answer

        return answer
    if name == "RoundsSkipped":
        from dcco.flower.strategy import RoundsSkipped

        return RoundsSkipped
    if name == "ImageViews":
        from dcco.data.image_views import ImageViews

        return ImageViews
    raise AttributeError(f"module 'dcco.flower' has no attribute {name!r}")


__all__ = ["DCCO", "ImageViews", "RoundsSkipped", "SecAgg", "answer",
           "secure_aggregation_mod"]


def __dir__() -> list[str]:
    """The public names (``__all__``), imported on first use."""
    return sorted(set(__all__) | set(globals()))
