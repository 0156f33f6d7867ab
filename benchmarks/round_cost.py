"""Cost of one round per method and backend, relative to a centralized step on the same samples.

For K ∈ {8, 32, 128, 512} clients and 512 samples per round (512/K per client), times:
a batched dcco round, batched cco_fedavg and contrastive_fedavg rounds, a reference (client by
client) dcco round, and a centralized CCO step on the same views; each timing covers the
forward/backward and the server optimiser step, not the (shared) augmentation. Prints the median
of --repeats runs after --warmup runs, and the median over repetitions of each variant's time
divided by the centralized step's time in the same repetition (the variants of a row are
interleaved, so the ratios survive this shared machine's slow spells). Targets: batched dcco ≤ 1.10×, both FedAvg variants ≤ 1.25×.

``--local-steps 2 4`` adds dcco rounds whose clients take E steps on minibatches of 1/E of
their samples (one local epoch): no batched form exists for them, so the batched executor runs
the clients one by one; the columns measure what that costs.

    python benchmarks/round_cost.py --widths 16 32 64 --repeats 5
    python benchmarks/round_cost.py --clients 32 8 --local-steps 2 4 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from dcco.algorithm import Algorithm
from dcco.augment import AugmentConfig, augment_pair
from dcco.client import trainable_parameters
from dcco.methods import Segments, build_method
from dcco.models import ModelConfig, build_dual_encoder
from dcco.optim import OptimConfig, apply_pseudo_gradient, build_optimizer
from dcco.simulator import run_round


def time_rounds(variants, x1, x2, warmup, repeats) -> list[list[float]]:
    """Seconds per round of each (model, method, segments, backend) variant.

    The variants are interleaved within every repetition, so a slow spell of this shared
    machine hits all of them alike and the per-repetition ratios stay meaningful.
    """
    states = []
    for model, *_ in variants:
        params = trainable_parameters(model)
        states.append((params, build_optimizer(params, OptimConfig()),
                       {k: v.clone() for k, v in model.state_dict().items()}))
    times: list[list[float]] = [[] for _ in variants]
    for i in range(warmup + repeats):
        for j, ((model, method, segments, backend), (params, opt, _)) in enumerate(
                zip(variants, states)):
            start = time.perf_counter()
            result = run_round(model, method, x1, x2, segments, backend)
            apply_pseudo_gradient(opt, [p for _, p in params],
                                  [result.pseudo_gradient[n] for n, _ in params])
            if x1.is_cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                times[j].append(time.perf_counter() - start)
    for (model, *_), (_, _, state) in zip(variants, states):
        model.load_state_dict(state)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--projector", type=int, nargs="+", default=[1024, 1024, 1024])
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--image-size", type=int, default=28)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--local-steps", type=int, nargs="*", default=[],
                    help="also time dcco with E local steps of 1/E of a client's samples")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"# torch {torch.__version__} on {device} ({platform.processor() or platform.machine()},"
          f" {torch.get_num_threads()} threads); ResNet14 widths {tuple(args.widths)}, projector "
          f"{tuple(args.projector)}, {args.samples} samples of {args.channels}×{args.image_size}²"
          f" per round; median of {args.repeats} after {args.warmup} warm-up")
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.samples, args.channels, args.image_size,
                                    args.image_size), generator=gen, dtype=torch.uint8)
    ids = torch.arange(args.samples)
    x1, x2 = augment_pair(images.to(device), ids.to(device), 0, 0, AugmentConfig.byol())
    model = build_dual_encoder(ModelConfig(widths=tuple(args.widths)), args.channels,
                               tuple(args.projector), seed=0).to(device)
    contrastive = build_dual_encoder(ModelConfig(widths=tuple(args.widths)), args.channels,
                                     (256, 256, 128), seed=0).to(device)

    extra = [f" dcco E = {e} |" for e in args.local_steps]
    print("| K | samples/client | centralized step | batched dcco | batched cco_fedavg |"
          " batched contrastive_fedavg | reference dcco |" + "".join(extra))
    print("|---|---|---|---|---|---|---|" + "---|" * len(extra))
    for k in args.clients:
        if args.samples % k:
            raise SystemExit(f"--samples {args.samples} is not divisible by K = {k}")
        per = args.samples // k
        seg = Segments.from_counts([per] * k)
        central = (model, build_method("centralized_cco"), Segments.from_counts([args.samples]),
                   "batched")
        runs = [("dcco", model, "batched"), ("cco_fedavg", model, "batched"),
                ("contrastive_fedavg", contrastive, "batched"), ("dcco", model, "reference")]
        variants, slots = [central], []
        for name, net, backend in runs:
            method = build_method(name)
            if per < method.min_client_samples:
                slots.append("n/a (1 sample/client)")
            elif backend == "reference" and args.skip_reference:
                slots.append("skipped")
            else:
                slots.append(len(variants))
                variants.append((net, method, seg, backend))
        for e in args.local_steps:
            if per < e:
                slots.append(f"n/a ({per} samples/client)")
                continue
            slots.append(len(variants))
            variants.append((model, Algorithm(build_method("dcco"), local_steps=e,
                                              local_batch=per // e), seg, "batched"))
        times = time_rounds(variants, x1, x2, args.warmup, args.repeats)
        base = times[0]
        cells = [f"{statistics.median(base) * 1e3:.0f} ms"]
        for slot in slots:
            if isinstance(slot, str):
                cells.append(slot)
                continue
            t = times[slot]
            ratio = statistics.median(a / b for a, b in zip(t, base))
            cells.append(f"{statistics.median(t) * 1e3:.0f} ms ({ratio:.2f}×)")
        print(f"| {k} | {per} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
