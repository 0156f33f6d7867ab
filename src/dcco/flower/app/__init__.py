"""dcco's own Flower app: what ``flwr run`` starts for ``dcco``'s project
(``pyproject.toml``, ``[tool.flwr.app.components]``).

``client_app`` (Flower only, no torch) hands each message to ``handlers``, in its process or in
the node's long-lived ``worker``; ``nodes`` holds a node's data and model; ``server_app`` reads
the run config and runs ``run`` (a whole run: its directory, resume, the summary), whose rounds
``federation`` drives, laying out the messages as ``wire`` does (each node hosting several of
the run's clients, its replies checked against the server's own model).

Beside it in ``dcco.flower``: what a user's own Flower app uses (``strategy``, ``userapp``,
``userwire``, ``mods``, ``secure_round``), the pieces both share (``codec``, ``exchanges``,
``secagg``, ``appconfig``, ``placement``, ``polling``, ``metering``, ``timing``), and the tools of
tests and benchmarks (``testing``).
"""
