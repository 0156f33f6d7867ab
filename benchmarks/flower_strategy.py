"""``dcco.flower.DCCOStrategy``'s round against Flower's own ``FedAvg`` round, on the same
app, model and nodes, measured in one run (issue 38's target: at most 1.5 ×).

Runs ``examples/flower-app`` on Flower's local simulation with ``--nodes`` virtual nodes and
``compare-fedavg = true``: its ServerApp alternates blocks of ``--rounds`` rounds of FedAvg
(one exchange: the model down, new weights up, after one local step of contrastive FedAvg) and
of DCCO (two exchanges: the model down and statistics up, S_A down and an update up), timing
every round from the server (``evaluate_fn`` after each). The ratio is of the medians of the
rounds after each block's first.

    python benchmarks/flower_strategy.py --record benchmarks/results/flower_strategy.json

Where the time goes at a few photos a node: Flower's simulation engine picks the messages
waiting for its nodes up on a fixed poll (``add_messages_to_queue`` in
``flwr/server/superlink/fleet/vce/vce_api.py``, 0.1 s in 1.41/1.42), so an exchange whose
nodes compute for less than that still takes about one poll, and DCCO's second exchange one
poll more. ``--engine-poll`` runs the same app in this process (``run_simulation``) with the
engine's poll set to each value given, to show it:

    python benchmarks/flower_strategy.py --engine-poll 0.1 0.01 \
        --record benchmarks/results/flower_strategy_engine_poll.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dcco.flower.testing.loopback import LocalSimulation
from dcco.run.rundir import code_version, cpu_name

PROJECT = Path(__file__).resolve().parents[1] / "examples" / "flower-app"
TARGET = 1.5


def measure(args: argparse.Namespace, photos: int) -> dict:
    """One simulation of the app with ``photos`` photos a node: both strategies' seconds per
    round, their medians and the ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        sim = LocalSimulation(args.nodes, Path(tmp) / "sim", project=PROJECT)
        with sim:
            run_id = sim.submit({"num-server-rounds": args.rounds, "blocks": args.blocks,
                                 "fraction-train": args.fraction, "compare-fedavg": True,
                                 "photos-per-node": photos, "out": str(out)})
            status = sim.wait(run_id, timeout=3600)
        if status != "finished:completed":
            sys.exit(f"the run ended {status}: {sim.details}")
        seconds = json.loads((out / "timings.json").read_text())
    return summarise(args, photos, seconds)


def measure_in_process(args: argparse.Namespace, photos: int, poll: float) -> dict:
    """``measure`` with the app in this process (``flwr.simulation.run_simulation``) and the
    simulation engine's pickup poll set to ``poll`` seconds."""
    import tomllib
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    sys.path.insert(0, str(PROJECT))
    os.environ["PYTHONPATH"] = os.pathsep.join(  # Ray's actors import the example's modules
        p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)
    from dcco_flower_example import client_app, server_app
    from flwr.common.config import flatten_dict

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        config = flatten_dict(tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"][
            "flwr"]["app"]["config"]) | {"num-server-rounds": args.rounds, "blocks": args.blocks,
                                "fraction-train": args.fraction, "compare-fedavg": True,
                                "photos-per-node": photos, "out": str(out)}
        server, client = ServerApp(), ClientApp()

        def configured(c: Context) -> Context:  # run_simulation passes no run config
            return Context(run_id=c.run_id, node_id=c.node_id, node_config=c.node_config,
                           state=c.state, run_config=config)

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            server_app.main(grid, configured(context))

        handlers = Path(tmp) / "handlers.jsonl"

        @client.train()
        def train(msg: Message, context: Context) -> Message:
            started = time.perf_counter()
            reply = client_app.train(msg, configured(context))  # the state is the node's
            config = msg.content.config_records.get("config")
            kind = "fedavg" if config is None or "phase" not in config else config["phase"]
            with handlers.open("a") as f:  # one short line: an atomic append (POSIX)
                f.write(json.dumps([kind, time.perf_counter() - started]) + "\n")
            return reply

        def pickup(state, queue, nodes_mapping, f_stop) -> None:
            """The engine's pickup of the messages waiting for its nodes, every ``poll``."""
            while not f_stop.is_set():
                for node_id in nodes_mapping:
                    for msg in state.get_message_ins(node_id=node_id, limit=1):
                        queue.put(msg)
                f_stop.wait(poll)

        original = vce_api.add_messages_to_queue
        vce_api.add_messages_to_queue = pickup
        try:
            run_simulation(server_app=server, client_app=client, num_supernodes=args.nodes,
                           backend_config={"client_resources": {"num_cpus": 1}})
        finally:
            vce_api.add_messages_to_queue = original
        seconds = json.loads((out / "timings.json").read_text())
        handled: dict[str, list[float]] = {}
        for line in handlers.read_text().splitlines():
            kind, took = json.loads(line)
            handled.setdefault(kind, []).append(took)
    row = summarise(args, photos, seconds)
    # what a node's handler took per message, by message: the compute and the data a round
    # waits for on each node, the rest of a round being Flower's and the server's
    return row | {"engine_poll_s": poll, "handler_median_s": {
        k: statistics.median(v) for k, v in handled.items()}}


def summarise(args: argparse.Namespace, photos: int, seconds: dict) -> dict:
    medians = {}
    for name, values in seconds.items():
        # a block of R rounds gives R round times; its first (the strategy's warm-up) is
        # left out
        kept = [v for i, v in enumerate(values) if i % args.rounds != 0]
        medians[name] = statistics.median(kept)
    return {"photos_per_node": photos, "seconds_per_round": seconds, "median_s": medians,
            "ratio": medians["dcco"] / medians["fedavg"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6, help="rounds per block")
    ap.add_argument("--blocks", type=int, default=3, help="blocks per strategy, alternated")
    ap.add_argument("--fraction", type=float, default=0.5, help="fraction_train")
    ap.add_argument("--photos", type=int, nargs="+", default=[8],
                    help="photos per node: one simulation each (the app's photos-per-node)")
    ap.add_argument("--engine-poll", type=float, nargs="+", metavar="SECONDS",
                    help="in this process, with the simulation engine's pickup poll at each "
                         "value (Flower's: 0.1)")
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    if args.engine_poll:
        rows = [measure_in_process(args, photos, poll) for photos in args.photos
                for poll in args.engine_poll]
    else:
        rows = [measure(args, photos) for photos in args.photos]
    for row in rows:
        poll = ""
        if "engine_poll_s" in row:
            poll = f" (engine poll {row['engine_poll_s']} s; a node's handler: " + ", ".join(
                f"{k} {1e3 * v:.0f} ms" for k, v in row["handler_median_s"].items()) + ")"
        print(f"{row['photos_per_node']} photos a node{poll}: FedAvg {row['median_s']['fedavg']:.3f} "
              f"s a round, DCCO {row['median_s']['dcco']:.3f} s a round: {row['ratio']:.2f} × "
              f"(target ≤ {TARGET} ×)")
    if args.record:
        record = {"command": "python benchmarks/flower_strategy.py " + " ".join(sys.argv[1:]),
                  "machine": f"{cpu_name()} ({os.cpu_count()} cores), {platform.system()}",
                  "code": code_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                  "nodes": args.nodes, "rounds_per_block": args.rounds,
                  "blocks": args.blocks, "fraction_train": args.fraction, "rows": rows,
                  "target": TARGET}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")


if __name__ == "__main__":
    main()
