"""The dcco ClientApp: decode the server's message, run the client functions, encode the reply.

A SuperNode hosts the clients of its partition (``dcco.flower.nodes``). Messages:

- ``query``: who the node is (partition id, number of partitions, number of clients);
- ``train`` with ``phase = "stats"``: the summed statistics of the sampled clients (DCCO's
  phase 1); the node keeps the round's model in ``context.state`` for phase 2;
- ``train`` with ``phase = "update"``: one local step per sampled client, pooled; DCCO uses
  the model kept from phase 1 and the server's S_A, the FedAvg methods get the model here.

Under SecAgg+ the same handler runs inside Flower's ``secaggplus_mod``, which masks the reply.
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import Tensor

from dcco.flower import codec, secagg
from dcco.flower.appconfig import parse_run_config
from dcco.flower.nodes import (
    NodeIdentity,
    build_model,
    check_hosted,
    load_weights,
    node_data,
    node_partition,
    node_statistics,
    node_update,
)
from dcco.methods.registry import build_method

KEPT_MODEL, KEPT_ROUND = "dcco.kept-model", "dcco.kept-round"

app = ClientApp()


def _identity(context: Context) -> NodeIdentity:
    cfg, _ = parse_run_config(context.run_config)
    pid, n = node_partition(context.node_config)
    return NodeIdentity(pid, n, node_data(cfg).partition.num_clients)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who this node is: the server maps partition ids to node ids with it."""
    return Message(codec.encode_identity(_identity(context)), reply_to=msg)


@app.train(mods=[secagg.secure_aggregation_mod])
def train(msg: Message, context: Context) -> Message:
    """Phase "stats" or "update" of a round for the node's sampled clients."""
    cfg, _ = parse_run_config(context.run_config)
    identity = _identity(context)
    data = node_data(cfg)
    model = build_model(cfg, data.images.shape[1])
    params = None
    if secagg.is_secure(msg.content):
        ins, params = secagg.decode_secure_instruction(msg.content, list(model.state_dict()))
    else:
        ins = codec.decode_instruction(msg.content)
    check_hosted(ins.clients, identity)
    load_weights(model, ins.model if ins.model is not None else _kept(context.state, ins.round))
    method = build_method(cfg.train.method, cfg.loss)
    if ins.phase == "stats":
        _keep(context.state, ins.round, model.state_dict())
        stats = node_statistics(cfg, data, model, ins.clients, ins.round)
        reply = (secagg.secure_stats_reply(stats, params) if params
                 else codec.encode_stats_reply(stats))
    else:
        update = node_update(cfg, method, data, model, ins.clients, ins.round, ins.shared)
        reply = (secagg.secure_update_reply(update, params) if params
                 else codec.encode_update_reply(update))
    return Message(reply, reply_to=msg)


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
