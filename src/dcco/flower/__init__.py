"""dcco over Flower: the simulator's round across processes and machines. This package
imports Flower; the rest of dcco never does. See ``docs/flower.md``. By role:

- ``app/``: dcco's own Flower app, what ``flwr run`` starts for this project
  (``pyproject.toml``, ``[tool.flwr.app.components]``): ``app.client_app`` and
  ``app.server_app``, its nodes, worker and federation (``dcco.flower.app``).
- For your own Flower app (docs/own_code.md): ``dcco.flower.DCCOStrategy``, a strategy your
  ServerApp starts as it would start Flower's ``FedAvg`` (``strategy``, a package by phase,
  with ``server_model``); ``dcco.flower.answer``, what your ClientApp's ``train`` handler
  returns (``userapp``); ``dcco.flower.evaluate_encoder``, what its ``evaluate`` handler
  returns for an encoder, and ``knn_evaluation``, a server-side ``evaluate_fn`` on a labelled
  set (``evaluation``); ``ImageViews``, a ready image augmentation; and
  ``SecAgg`` and ``secure_aggregation_mod`` for SecAgg+ (``secure_round``, ``mods``). They
  are imported on first use, so that a ClientApp's module stays free of torch.
- Shared by both: ``exchanges`` (a round's two exchanges, written once over a ``Wire``),
  ``secagg`` (both exchanges through SecAgg+), ``appconfig`` (the ``flower.*`` settings),
  ``placement``, ``polling``, ``metering``, ``timing``.
- ``testing/``: the in-process grid, the loopback deployment and Flower's floor, for tests
  and benchmarks; nothing else imports it.

Message encoding is two layouts over one shared core, not one module: ``codec`` packs
tensors, statistics and updates into records, and each layout puts them in a message.
``app.wire`` is dcco's own app's: a node hosts several of the run's clients and gets one packed
instruction for all of them. ``userwire`` is a user's app's: one client a node, in Flower's
own ``arrays`` and ``config`` records, which a user's handler can read without dcco. The two
differ in what a message holds, so a single format would make one of them pay for the other.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("DCCOStrategy", "DCCO"):
        from dcco.flower.strategy import DCCOStrategy

        if name == "DCCO":
            from dcco.flower.strategy.renamed import renamed_strategy

            return renamed_strategy("dcco.flower.DCCO")
        return DCCOStrategy
    if name == "SecAgg":
        from dcco.flower.secure_round import SecAgg

        return SecAgg
    if name == "secure_aggregation_mod":
        from dcco.flower.mods import secure_aggregation_mod

        return secure_aggregation_mod
    if name == "answer":
        from dcco.flower.userapp import answer

        return answer
    if name == "evaluate_encoder":
        from dcco.flower.evaluation import evaluate_encoder

        return evaluate_encoder
    if name == "knn_evaluation":
        from dcco.flower.evaluation import knn_evaluation

        return knn_evaluation
    if name == "RoundsSkipped":
        from dcco.flower.strategy import RoundsSkipped

        return RoundsSkipped
    if name == "ImageViews":
        from dcco.data.image_views import ImageViews

        return ImageViews
    raise AttributeError(f"module 'dcco.flower' has no attribute {name!r}")


__all__ = ["DCCOStrategy", "ImageViews", "RoundsSkipped", "SecAgg", "answer", "evaluate_encoder",
           "knn_evaluation", "secure_aggregation_mod"]


def __dir__() -> list[str]:
    """The public names (``__all__``), imported on first use."""
    return sorted(set(__all__) | set(globals()))
