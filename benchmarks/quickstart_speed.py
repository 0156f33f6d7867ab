"""What a DCCO round costs on the quickstart app (examples/flower-quickstart) against the same
app's FedAvg (one view, supervised) and contrastive FedAvg (DCCO's two views, NT-Xent), on a
data path like Flower's: images stored as a Hugging Face ``Image`` column (PNG bytes decoded
as each item is read), the app's dict-batch loaders.

    OMP_NUM_THREADS=1 python benchmarks/quickstart_speed.py --simulation \\
        --record benchmarks/results/quickstart_speed.json

Three measurements, each of the three strategies:

1. **Compute alone** (the goals: DCCO ≤ 1.8 × FedAvg and ≤ 1.0 × contrastive FedAvg, in CPU
   seconds, best of the blocks): the app's ClientApp on 4 nodes of dcco's in-process grid
   (messages deep-copied both ways as a network would; no Flower engine), half of them a
   round, no evaluation. Blocks of ``--rounds`` rounds alternate, ``--blocks`` of each; a
   round is timed from the server (``evaluate_fn`` after each), in CPU seconds of this
   process and in wall seconds. A block's time is the median of its rounds after its first;
   the ratios are of each strategy's best block (``best_of_blocks``), and of the medians of
   all those rounds (``median``).
2. **One node's parts** (CPU seconds, partition 0, its 80 % training split): reading its
   loader, the two views, the statistics' forward (kept for the update), the update's
   backward, the update without the kept forward (a second forward), each in ``answer``'s
   chunks of ``CHUNK`` samples and in one batch, FedAvg's epoch and the contrastive epoch;
   and the activations the kept forward holds between the phases.
3. **Wall time on Flower's simulation engine** (``--simulation``): ``flwr run`` of the app
   on a local SuperLink with 4 virtual nodes (``dcco.flower.testing.loopback
   .LocalSimulation``), ``--sim-rounds`` rounds of each strategy; the app writes each round's
   wall seconds (``rounds.json``), and the medians of rounds 2 on are compared.

The floor: a two-view method forwards and backpropagates two augmented views of every sample
where FedAvg's epoch does one plain copy, so contrastive FedAvg / FedAvg is what two views
cost; DCCO adds no forward to that when phase 2 reuses phase 1's (``answer``'s
``reuse_forward``, the default), only its second exchange.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "flower-quickstart"
STRATEGIES = ("fedavg", "contrastive", "dcco")
GOALS = {"dcco/fedavg": 1.8, "dcco/contrastive": 1.0}


def _app_config(images: int) -> dict:
    table = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    from flwr.common.config import flatten_dict  # dotted keys, as Flower's run config has them

    return flatten_dict(table["config"]) | {"images": images}


def in_process(args: argparse.Namespace) -> dict:
    """Part 1: each strategy's rounds on the in-process grid, CPU and wall seconds."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg
    from quickstart_dcco import client_app, task

    from dcco.flower import DCCOStrategy
    from dcco.flower.testing.inprocess import InProcessGrid

    base = _app_config(args.images) | {"fraction-evaluate": 0.0}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    cpu: dict[str, list[float]] = {k: [] for k in STRATEGIES}
    wall: dict[str, list[float]] = {k: [] for k in STRATEGIES}
    blocks: dict[str, list[float]] = {k: [] for k in STRATEGIES}  # CPU s, a block's median
    for _ in range(args.blocks):
        for name in STRATEGIES:
            config = base | {"strategy": name}
            grid = InProcessGrid(client_app.app, nodes, config)
            torch.manual_seed(0)
            initial = ArrayRecord(task.Net().state_dict())
            kw = {"fraction_train": config["fraction-train"], "fraction_evaluate": 0.0}
            strategy = DCCOStrategy(**kw) if name == "dcco" else FedAvg(**kw)
            stamps: list[tuple[float, float]] = []
            strategy.start(grid=grid, initial_arrays=initial, num_rounds=args.rounds,
                           train_config=None if name == "dcco"
                           else ConfigRecord({"lr": config["lr"]}),
                           evaluate_fn=lambda r, arrays, s=stamps: s.append(
                               (time.process_time(), time.perf_counter())))
            pairs = list(itertools.pairwise(stamps))[-args.rounds:]
            rounds_cpu = [b[0] - a[0] for a, b in pairs]
            rounds_wall = [b[1] - a[1] for a, b in pairs]
            cpu[name] += rounds_cpu[1:]  # the block's first round warms caches up
            wall[name] += rounds_wall[1:]
            blocks[name].append(statistics.median(rounds_cpu[1:]))
            print(f"{name}: CPU {', '.join(f'{x:.2f}' for x in rounds_cpu)} s; wall "
                  f"{', '.join(f'{x:.2f}' for x in rounds_wall)} s", flush=True)
    medians = {"cpu": {k: statistics.median(v) for k, v in cpu.items()},
               "wall": {k: statistics.median(v) for k, v in wall.items()}}
    best = {k: min(v) for k, v in blocks.items()}
    return {"cpu_seconds": cpu, "wall_seconds": wall, "median": medians,
            "ratios_cpu": _ratios(medians["cpu"]), "ratios_wall": _ratios(medians["wall"]),
            "cpu_block_medians": blocks, "best_of_blocks": best,
            "ratios_cpu_best_of_blocks": _ratios(best)}


def _ratios(medians: dict[str, float]) -> dict[str, float]:
    return {"dcco/fedavg": medians["dcco"] / medians["fedavg"],
            "dcco/contrastive": medians["dcco"] / medians["contrastive"],
            "contrastive/fedavg (the floor: two views)":
                medians["contrastive"] / medians["fedavg"]}


def node_parts(args: argparse.Namespace, repeats: int = 3) -> dict:
    """Part 2: one node's parts in CPU seconds (the median of ``repeats``) and the kept
    forward's activations."""
    import torch
    from quickstart_dcco import task

    from dcco.api import local_update, merge_statistics, statistics_kept, update_from_kept
    from dcco.api import method as dcco_method
    from dcco.flower import ImageViews
    from dcco.flower.userapp import node_samples
    from dcco.models.dual_views import CHUNK

    cfg = _app_config(args.images)
    trainloader, _ = task.load_data(0, 4, int(cfg["batch-size"]), args.images)
    method = dcco_method("dcco")  # the strategy's defaults (λ = 5)
    views = ImageViews()

    def cpu(work) -> tuple[float, object]:
        times, out = [], None
        for _ in range(repeats):
            torch.manual_seed(0)
            start = time.process_time()
            out = work()
            times.append(time.process_time() - start)
        return statistics.median(times), out

    read, x = cpu(lambda: node_samples(trainloader))
    view, (x1, x2) = cpu(lambda: (views(x), views(x)))
    net = task.Net()
    parts = {}
    for label, chunk in (("", CHUNK), ("_one_batch", None)):  # answer's, and one batch
        forward, (stats, kept) = cpu(lambda c=chunk: statistics_kept(net, x1, x2, method, c))
        shared = merge_statistics([stats], int(stats.as_dict()["sum_f"].shape[-1]),
                                  method).aggregate

        def backward(c=chunk, s=shared):
            _, fresh = statistics_kept(net, x1, x2, method, c)
            start = time.process_time()
            update_from_kept(fresh, s, method)
            return time.process_time() - start

        parts |= {
            f"statistics_forward_kept{label}": forward,
            f"update_backward_from_kept{label}": statistics.median(
                backward() for _ in range(repeats)),
            f"update_with_a_second_forward{label}": cpu(
                lambda c=chunk, s=shared: local_update(net, x1, x2, s, method, chunk=c))[0]}
    fedavg, _ = cpu(lambda: task.train_supervised(task.Net(), trainloader, 1, float(cfg["lr"])))
    contrastive, _ = cpu(lambda: task.train_contrastive(task.Net(), trainloader, views, 1,
                                                        float(cfg["lr"])))
    parts = {"samples": len(x), "chunk": CHUNK, "read_loader": read, "two_views": view,
             **parts, "fedavg_epoch": fedavg, "contrastive_epoch": contrastive,
             "kept_forward_mib": kept.saved_bytes / 2**20}
    print("one node (CPU s): " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()),
          flush=True)
    return parts


def on_simulation(args: argparse.Namespace) -> dict:
    """Part 3: wall seconds a round on Flower's simulation engine."""
    from dcco.flower.testing.loopback import LocalSimulation

    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder, \
            LocalSimulation(4, Path(folder) / "sim", project=PROJECT) as sim:
        for name in STRATEGIES:
            out = Path(folder) / name
            run = sim.submit({"strategy": name, "num-server-rounds": args.sim_rounds,
                              "fraction-evaluate": 0.0, "images": args.images,
                              "out": str(out)})
            status = sim.wait(run, timeout=1800)
            if status != "finished:completed":
                raise SystemExit(f"the {name} run ended {status}: {sim.details}")
            by_round = json.loads((out / "rounds.json").read_text())["seconds"]
            seconds[name] = [by_round[str(r)] for r in range(2, args.sim_rounds + 1)]
            print(f"simulation, {name}: " + ", ".join(f"{x:.2f}" for x in seconds[name])
                  + " s a round", flush=True)
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {"rounds": args.sim_rounds, "seconds_from_round_2": seconds, "median": medians,
            "ratios": _ratios(medians)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds a block (in process)")
    ap.add_argument("--blocks", type=int, default=2, help="blocks of each strategy")
    ap.add_argument("--images", type=int, default=8000,
                    help="Fashion-MNIST training images shared out (0: all 60,000)")
    ap.add_argument("--simulation", action="store_true",
                    help="also time the rounds on Flower's simulation engine")
    ap.add_argument("--sim-rounds", type=int, default=5)
    ap.add_argument("--record", type=Path, default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    from dcco.run.rundir import code_version, cpu_name

    record = {"command": "OMP_NUM_THREADS=1 python benchmarks/quickstart_speed.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "images": args.images, "nodes": 4, "node_parts": node_parts(args),
              "in_process": in_process(args)}
    if args.simulation:
        record["simulation"] = on_simulation(args)
    ratios = record["in_process"]["ratios_cpu_best_of_blocks"]
    record["goals"] = {k: {"goal": g, "measured": ratios[k], "met": ratios[k] <= g}
                       for k, g in GOALS.items()}
    for key, value in ratios.items():
        goal = f" (goal ≤ {GOALS[key]})" if key in GOALS else ""
        print(f"CPU seconds a round, best of {args.blocks} blocks, {key}: {value:.2f} ×{goal}")
    record["machine"] = {"cpu": cpu_name(), "python": platform.python_version(),
                         **{k: v for k, v in code_version().items()
                            if k in ("torch", "threads", "git_commit")}}
    if args.record is not None:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
