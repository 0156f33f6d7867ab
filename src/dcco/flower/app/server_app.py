"""The dcco ServerApp: read the run config, load the server's data split, run the federation.

Declared in ``pyproject.toml`` (``[tool.flwr.app.components]``); ``flwr run`` starts it in
the SuperLink's ``flwr-serverapp`` process. See ``docs/flower.md``.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from dcco.flower.app.run import run_federated
from dcco.flower.appconfig import parse_run_config
from dcco.run.splits import load_splits

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Pretrain with the run config's method over the connected SuperNodes."""
    cfg, fcfg = parse_run_config(context.run_config)
    train, test = load_splits(cfg)
    run_federated(grid, cfg, fcfg, train, test)
