"""What a node does with the server's messages: the handlers of the dcco ClientApp.

``query``: who the node is (partition id, number of partitions, number of clients).
``train`` with ``phase = "stats"``: the summed statistics of the sampled clients (DCCO's
phase 1; each client's own under ``train.absent_statistics = "cached"``); the node keeps the
round's model in ``context.state`` for phase 2. ``train`` with ``phase = "update"``: the local
steps of each sampled client, pooled; DCCO uses the model kept from phase 1 and the server's
S_A, the FedAvg methods get the model here; with stale statistics the model and the previous
round's S_A come together, and the node sends its fresh statistics with its update.

They take and return a message's content (``RecordDict``), so that they run alike in the
ClientApp's process and in a node's long-lived worker (``dcco.flower.app.worker``).
"""

from __future__ import annotations

import time

_IMPORT_START = time.time()  # before the heavy imports: their time is measured

import torch
from flwr.app import ConfigRecord, Context, RecordDict
from torch import Tensor

from dcco.config import RunConfig
from dcco.core.client_state import DTYPES, kept_by_clients, with_kept
from dcco.flower import codec, secagg, timing
from dcco.flower.app.nodes import (
    ContextStates,
    NodeStates,
    build_model,
    each_client_statistics,
    load_weights,
    node_data,
    node_statistics,
    node_update,
)
from dcco.flower.appconfig import parse_run_config
from dcco.flower.codec import Instruction
from dcco.flower.node_states import FolderStates, state_folder
from dcco.flower.placement import NodeIdentity, check_hosted, node_partition
from dcco.run.algorithms import algorithm_of

KEPT_MODEL, KEPT_ROUND = "dcco.kept-model", "dcco.kept-round"
_IMPORTED = time.time()


def _identity(context: Context) -> NodeIdentity:
    cfg, _ = parse_run_config(context.run_config)
    pid, n = node_partition(context.node_config)
    return NodeIdentity(pid, n, node_data(cfg).partition.num_clients)


def query(content: RecordDict, context: Context) -> RecordDict:
    """Who this node is: the server maps partition ids to node ids with it."""
    return codec.encode_identity(_identity(context))


def train(content: RecordDict, context: Context) -> RecordDict:
    """Phase "stats" or "update" of a round for the node's sampled clients; the model of a
    phase "stats" is kept in ``context.state`` for phase "update"."""
    started = time.time()
    cfg, _ = parse_run_config(context.run_config)
    identity = _identity(context)
    data = node_data(cfg)
    loaded = time.time()
    model = build_model(cfg, data.input_shapes)
    algorithm = algorithm_of(cfg)
    spec = algorithm.method.stats
    params = None
    kept = kept_by_clients(model, algorithm.method)  # not sent: the clients' own
    if secagg.is_secure(content):
        ins, params = secagg.decode_secure_instruction(
            content, [k for k in model.state_dict() if k not in kept], spec)
    else:
        ins = codec.decode_instruction(content)
    check_hosted(ins.clients, identity)
    if ins.shared is not None:
        expected = {f"mean_{f.name}" for f in spec.fields} if spec is not None else set()
        if set(ins.shared) != expected:
            raise codec.InstructionError(
                f"malformed instruction from the server: S_A holds {sorted(ins.shared)}, "
                f"{algorithm.method.name} needs {sorted(expected)}")
    load_weights(model, with_kept(model, ins.model if ins.model is not None
                                  else _kept(context.state, ins.round), kept))
    if (ins.phase == "stats" or ins.with_stats) and spec is None:
        raise ValueError(f"the server asked for statistics, but {algorithm.method.name} "
                         f"shares none; do server and nodes run one config?")
    if ins.phase == "stats":
        _keep(context.state, ins.round, model.state_dict())
        if cfg.train.absent_statistics == "cached":  # the server keeps each client's own
            reply = codec.encode_each_stats_reply(each_client_statistics(
                cfg, data, model, ins.clients, ins.round, spec))
        else:
            stats = node_statistics(cfg, data, model, ins.clients, ins.round, spec)
            reply = (secagg.secure_stats_reply(stats, params, spec) if params
                     else codec.encode_stats_reply(stats))
    else:
        # fresh statistics for the next round (stale mode) come from the round's model, as
        # the clients' local steps leave it untouched
        stats = (node_statistics(cfg, data, model, ins.clients, ins.round, spec)
                 if ins.with_stats else None)
        # a stale round's update carries its model (no statistics exchange came before it)
        stale = algorithm.staleness == 1 and ins.with_stats and ins.model is not None
        states = client_states(cfg, context, ins) if algorithm.stateful else None
        update = node_update(cfg, algorithm_of(cfg, ins.round).for_update(stale), data, model,
                             ins.clients, ins.round, ins.shared, states)
        reply = (secagg.secure_update_reply(update, params, stats, spec) if params
                 else codec.encode_update_reply(update, stats))
    if timing.enabled():
        timing.record("message", phase=ins.phase, round=ins.round,
                      process_start=timing.process_start(), import_start=_IMPORT_START,
                      imported=_IMPORTED, handler_start=started, handler_end=time.time(),
                      data_load=loaded - started, compute=time.time() - loaded)
    return reply


def client_states(cfg: RunConfig, context: Context, ins: Instruction) -> NodeStates:
    """Where the node keeps its clients' states: its ``client-state-dir`` (node config or
    ``DCCO_CLIENT_STATE_DIR``; ``dcco.flower.node_states``) under the run's key, else its
    ``context.state``."""
    held = DTYPES[cfg.train.client_state_dtype]
    folder = state_folder(context.node_config)
    if folder is None:
        return ContextStates(context.state, held)
    return FolderStates(folder, ins.states_key, ins.round, cfg.train.checkpoint_every, held)


def _keep(state: RecordDict, round_index: int, weights: dict[str, Tensor]) -> None:
    """Keep the round's model on the node for phase 2 (saves a second download)."""
    state[KEPT_MODEL] = codec.array_record(weights)
    state[KEPT_ROUND] = ConfigRecord({"round": round_index})


def _kept(state: RecordDict, round_index: int) -> dict[str, torch.Tensor]:
    kept = state.config_records.get(KEPT_ROUND)
    if kept is None or kept["round"] != round_index:
        held = None if kept is None else kept["round"]
        raise ValueError(f"phase 'update' of round {round_index} needs the model of its phase "
                         f"'stats', but this node holds the model of round {held}")
    return codec.tensors_of(state.array_records[KEPT_MODEL])
