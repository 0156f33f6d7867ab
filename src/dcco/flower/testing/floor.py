"""Flower's own floor: a ServerApp and a ClientApp that only exchange tiny messages.

A deployed round's seconds are Flower's (a SuperNode's poll, a ``flwr-clientapp`` process
started for every message, the ServerApp's pulls) plus dcco's (imports of torch and dcco in
that process, data, compute). This app has only the first part: its ClientApp imports Flower
and nothing of torch, and echoes each message; its ServerApp runs ``rounds`` rounds of
``exchanges`` exchanges with every connected node, through the same ``push_and_pull`` as
dcco's rounds, and writes the seconds of each round to ``record`` (JSON). With ``payload``
(bytes), each message carries that many bytes each way, as dcco's carry the model, in one
array of zeros or, with ``payload_arrays`` = k, in k distinct random arrays (a model's
tensors sent one array each: Flower moves every array as an object of its own). So
``benchmarks/flower_loopback.py`` can set dcco's seconds per round against this floor,
measured in the same run on the same machine. Its Flower project is
``benchmarks/flower_floor/pyproject.toml``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from dcco.flower.polling import push_and_pull

client_app = ClientApp()
server_app = ServerApp()


@client_app.train()
def echo(msg: Message, context: Context) -> Message:
    """The message's round and exchange, and its payload if it has one, sent back."""
    reply = RecordDict({"echo": ConfigRecord(dict(msg.content["ask"]))})
    if "payload" in msg.content.array_records:
        reply["payload"] = msg.content.array_records["payload"]
    return Message(reply, reply_to=msg)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """``rounds`` rounds of ``exchanges`` exchanges with ``min_nodes`` nodes or more; each
    round's seconds written to ``record``."""
    cfg = context.run_config
    rounds, exchanges = int(cfg["rounds"]), int(cfg["exchanges"])
    min_nodes, timeout = int(cfg["min_nodes"]), float(cfg["timeout"])
    payload = int(cfg.get("payload", 0))  # bytes each way
    pieces = int(cfg.get("payload_arrays", 1))
    rng = np.random.default_rng(0)
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < min_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} of {min_nodes} nodes connected within "
                               f"{timeout:.0f} s")
        time.sleep(0.1)
    seconds = []
    for r in range(rounds):
        start = time.perf_counter()
        for e in range(exchanges):
            arrays = _payload(payload, pieces, rng)
            asks = [Message(_ask(r, e, arrays), dst_node_id=n,
                            message_type=MessageType.TRAIN) for n in nodes]
            replies = push_and_pull(grid, asks, timeout)
            failed = [m for m in replies if m.has_error()]
            if len(replies) != len(nodes) or failed:
                raise RuntimeError(f"round {r}, exchange {e}: {len(replies)} of {len(nodes)} "
                                   f"replies, {len(failed)} failed")
        seconds.append(time.perf_counter() - start)
    path = Path(str(cfg["record"]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"nodes": len(nodes), "exchanges": exchanges,
                               "payload_bytes": payload, "payload_arrays": pieces,
                               "seconds_per_round": seconds}) + "\n")
    os.replace(tmp, path)


def _payload(size: int, pieces: int, rng: np.random.Generator) -> ArrayRecord | None:
    """``size`` bytes of float32: one array of zeros, or ``pieces`` > 1 distinct random
    arrays, new for every exchange (Flower stores arrays by their content's hash, so equal
    arrays would travel as one)."""
    if not size:
        return None
    if pieces <= 1:
        return ArrayRecord({"x": Array(np.zeros(size // 4, dtype=np.float32))})
    n = max(1, size // 4 // pieces)
    return ArrayRecord({f"x{i}": Array(rng.standard_normal(n).astype(np.float32))
                        for i in range(pieces)})


def _ask(round_index: int, exchange: int, arrays: ArrayRecord | None) -> RecordDict:
    content = RecordDict({"ask": ConfigRecord({"round": round_index, "exchange": exchange})})
    if arrays is not None:
        content["payload"] = arrays
    return content
