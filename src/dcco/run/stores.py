"""The stores a run keeps beside its model, sized before anything is written: FedSC's cache of
every client's last statistics (``train.absent_statistics = "cached"``) and the states of
the clients of FedU, FedEMA and MoCo (``train.client_state_store``). ``check_stores``
refuses a run whose stores would not fit, naming what to change; ``dcco.run.setup.check_run``
calls it once, before a run directory exists, and ``Pretraining`` builds the stores it sized."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from torch import nn

from dcco.config import ConfigError, RunConfig
from dcco.core.client_state import DTYPES, MAX_STATE_BYTES, state_bytes
from dcco.core.disk_states import bytes_under
from dcco.core.method import Method
from dcco.core.statistics_cache import MAX_CACHE_BYTES, cache_bytes
from dcco.run.sampling import clients_seen

STATES_FOLDER = "client_states"
"""The folder of a run directory that holds its clients' states on disk
(``RunDir.client_states_path``)."""


def check_stores(cfg: RunConfig, method: Method, model: nn.Module, num_clients: int, *,
                 state_dir: Path | None = None, rounds_to_run: int | None = None,
                 world: int = 1, client_states: bool = True) -> None:
    """Refuse a run whose stores would not fit: the statistics cache over
    ``MAX_CACHE_BYTES``; the clients' states over ``MAX_STATE_BYTES`` in memory, or over the
    free space of ``state_dir``'s disk (a temporary folder's where None) on disk, or on disk
    over several ranks (``world``). ``rounds_to_run``: the rounds a measurement runs where
    fewer than the config's; the store is sized for the clients they meet.
    ``client_states``: false where this process keeps no client's state (a Flower server:
    its nodes keep their own).

    Raises:
        ConfigError: naming the store's size and what to change.
    """
    t = cfg.train
    if t.absent_statistics == "cached":
        d = model.projection_dim  # both towers project to it
        values = method.stats.num_values(d, d)
        size = cache_bytes(num_clients, t.rounds, t.clients_per_round, values)
        if size > MAX_CACHE_BYTES:
            raise ConfigError(
                f"train.absent_statistics = 'cached' would keep up to {size / 2**30:.1f} GiB "
                f"of client statistics ({num_clients} clients, {values} values each), over "
                f"the {MAX_CACHE_BYTES / 2**30:.0f} GiB limit; it is meant for a few clients "
                f"(FedSC: 10 to 20), or use 'drop'")
    if not (method.stateful and client_states):
        return
    entry = state_bytes(method.state_shapes(model), DTYPES[t.client_state_dtype])
    rounds = t.rounds if rounds_to_run is None else min(rounds_to_run, t.rounds)
    seen = clients_seen(t.seed, rounds, num_clients, t.clients_per_round)
    size = seen * entry
    need = (f"{method.name}'s clients keep state between their rounds: "
            f"{entry / 2**20:.2f} MiB a client, for the {seen} clients that {rounds} "
            f"rounds of {t.clients_per_round} sample, {size / 2**30:.1f} GiB")
    half = "" if t.client_state_dtype == "float16" else (
        " or train.client_state_dtype = 'float16' (half of it)")
    if t.client_state_store == "disk":
        if world > 1:
            raise ConfigError("train.client_state_store = 'disk' runs in one process; "
                              "over torch.distributed every rank holds the store in "
                              "memory ('memory')")
        where = state_dir if state_dir is not None else Path(tempfile.gettempdir())
        # a resumed run's own files will be replaced: their disk counts as free
        free = shutil.disk_usage(_existing(where)).free + bytes_under(where)
        if size > free:
            raise ConfigError(f"{need}, more than the {free / 2**30:.1f} GiB free on the "
                              f"disk of {where}; free some, or use fewer rounds or "
                              f"clients, a smaller model{half}")
    elif size > MAX_STATE_BYTES:
        raise ConfigError(
            f"{need}, over the {MAX_STATE_BYTES / 2**30:.0f} GiB limit in memory; use "
            f"train.client_state_store = 'disk', fewer rounds or clients, a smaller "
            f"model{half}")


def _existing(path: Path) -> Path:
    """``path``, or its nearest folder above that exists (for its disk's free space)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


__all__ = ["STATES_FOLDER", "check_stores"]
