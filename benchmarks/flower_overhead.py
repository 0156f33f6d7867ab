"""Overhead of the Flower app per round, in process, against the simulator on the same round.

For each K (clients per round), times interleaved within every repetition:

- ``simulator batched``: ``Pretraining.step`` with the batched backend (the default);
- ``simulator reference``: ``Pretraining.step`` client by client (the same client functions
  the Flower nodes call);
- ``flower in-process``: ``Federation.step`` through ``InProcessGrid``: the real ClientApp
  behind Flower ``Message`` objects (encode, deep copy both ways as the network would, decode,
  validate), with ``--nodes`` nodes hosting the clients; plain, and with ``--secagg`` also
  through SecAgg+ (masking, secret sharing, unmasking), and the secure aggregates' error
  against the plain ones with its bound.

Prints the median seconds per round and the median per-repetition ratio to the reference
backend, so a slow spell of a shared machine hits all variants alike. The model weights are
restored after every timed round, so every variant times the same round. The cost of a real
network (SuperLink, SuperNodes, gRPC, one ClientApp process per message) is measured by
``python -m dcco.flower.testing.loopback`` instead; see docs/flower.md.

    python benchmarks/flower_overhead.py --clients 16 64 --nodes 4 --repeats 5 --secagg
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time

import torch

from dcco.config import load_config
from dcco.core.server import aggregate_updates
from dcco.flower import secagg
from dcco.flower.app.client_app import app as client_app
from dcco.flower.app.federation import Federation
from dcco.flower.app.nodes import node_data, node_update
from dcco.flower.appconfig import FlowerConfig, run_config_entries
from dcco.flower.testing.inprocess import InProcessGrid
from dcco.run.pretraining import Pretraining
from dcco.run.splits import load_splits


def timed(step, pt: Pretraining) -> float:
    """Seconds of one ``step()``; the model and optimiser are restored afterwards."""
    weights = {k: v.clone() for k, v in pt.model.state_dict().items()}
    opt = pt.optimizer.state_dict()
    rounds = pt.rounds_done
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    pt.model.load_state_dict(weights)
    pt.optimizer.load_state_dict(opt)
    pt.rounds_done = rounds
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[16, 64], help="K per round")
    ap.add_argument("--samples-per-client", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=4, help="in-process SuperNodes")
    ap.add_argument("--widths", type=int, nargs=3, default=[16, 32, 64])
    ap.add_argument("--projector", type=int, default=128, help="d (3 layers of this width)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--secagg", action="store_true", help="also time SecAgg+ rounds")
    ap.add_argument("--data-dir", default="none")
    args = ap.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; d = {args.projector}, widths {args.widths}, "
          f"{args.samples_per_client} samples per client, {args.nodes} nodes")
    errors = []
    print("| K | variant | s / round (median) | × reference (median of ratios) |")
    print("|---|---|---|---|")
    for k in args.clients:
        d = args.projector
        data_dir = args.data_dir if args.data_dir == "none" else f'"{args.data_dir}"'
        base = [f"data.data_dir={data_dir}", f"data.samples_per_client={args.samples_per_client}",
                f"model.widths={list(args.widths)}", f"model.projector=[{d}, {d}, {d}]",
                f"train.clients_per_round={k}", "train.rounds=1000", "train.knn_every=0"]
        cfg = load_config(None, base)
        train, _ = load_splits(cfg)
        variants = {}
        for backend in ("batched", "reference"):
            pt = Pretraining.of(load_config(None, [*base, f'train.backend="{backend}"']), train)
            variants[f"simulator {backend}"] = (pt.step, pt)
        for secure in (False, True) if args.secagg else (False,):
            fcfg = FlowerConfig(min_nodes=args.nodes, secagg=secure)
            grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": args.nodes}
                                              for i in range(args.nodes)],
                                 run_config_entries(cfg, fcfg))
            pt = Pretraining.of(cfg, train)
            fed = Federation(grid, pt, fcfg)
            fed.wait_for_nodes()
            variants["flower in-process" + (" SecAgg+" if secure else "")] = (fed.step, pt)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(args.warmup + args.repeats):
            for name, (step, pt) in variants.items():
                t = timed(step, pt)
                if i >= args.warmup:
                    times[name].append(t)
        ref = times["simulator reference"]
        for name, ts in times.items():
            ratio = statistics.median(t / r for t, r in zip(ts, ref))
            print(f"| {k} | {name} | {statistics.median(ts):.3f} | {ratio:.2f} |")
        if args.secagg:
            errors.append((k, *secure_error(variants)))
    for k, stats_err, stats_bound, update_err, update_bound, through in errors:
        print(f"# K = {k}: SecAgg+ − plain, round 1: statistics {stats_err:.2e} (bound "
              f"{stats_bound:.2e}, standardised units); update exchange {update_err:.2e} (bound "
              f"{update_bound:.2e}, units of the calibration step's largest |Δ|); update "
              f"including the statistics' error carried through S_A {through:.2e}")


def secure_error(variants) -> tuple[float, float, float, float, float]:
    """Max |secure − plain| on the same round, in the units the values travel in: of S_A, of
    the update exchange (plain update computed with the secure S_A), their
    ``secagg.error_bound``s, and of the update as the round ends (S_A's error included)."""
    plain = variants["flower in-process"][0].__self__
    secure = variants["flower in-process SecAgg+"][0].__self__
    fcfg = secure.fcfg
    targets, _ = secure.targets(secure.pt.rounds_done)
    counts = [int(secure.pt.partition.sizes[c].sum()) for c in targets.values()]
    scales = secure.calibration(secure.pt.rounds_done)
    a, b = secure.collect(), plain.collect()
    sa, sb = secagg.standardise(a.shared, scales), secagg.standardise(b.shared, scales)
    stats_err = max(float((x - y).abs().max()) for x, y in zip(sa.tensors(), sb.tensors()))
    # the plain update given the secure S_A: what the update exchange alone changes
    pt, r = secure.pt, secure.pt.rounds_done
    data = node_data(pt.cfg)
    updates = [node_update(pt.cfg, pt.method, data, pt.model, c, r, a.shared)
               for c in targets.values()]
    plain_update = aggregate_updates(updates, dict(pt.params))
    update_err = max(float((a.pseudo_gradient[n] - g).abs().max()) / scales.update
                     for n, g in plain_update.items())
    through = max(float((a.pseudo_gradient[n] - g).abs().max()) / scales.update
                  for n, g in b.pseudo_gradient.items())
    bound = [secagg.error_bound(secure._max_weight(targets), counts, clip,
                                fcfg.secagg_quantization, clip)
             for clip in (fcfg.secagg_stats_clip, fcfg.secagg_update_clip)]
    return stats_err, bound[0], update_err, bound[1], through


if __name__ == "__main__":
    main()
