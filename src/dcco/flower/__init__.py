"""A Flower app for dcco: the simulator's round across processes and machines.

``client_app`` and ``server_app`` are the two Flower components (``pyproject.toml``,
``[tool.flwr.app.components]``); they decode messages (``codec``), call the library's client
and server functions (``nodes``, ``federation``, ``dcco.client``, ``dcco.server``) and encode
the replies. ``secagg`` runs both exchanges through Flower's SecAgg+; ``inprocess`` runs the
apps in one process for tests. This package imports Flower; the rest of dcco never does.
See ``docs/flower.md``.
"""
