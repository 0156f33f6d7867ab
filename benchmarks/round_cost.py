"""Cost of one round per method and backend, relative to a centralized step on the same samples.

For K ∈ {8, 32, 128, 512} clients and 512 samples per round (512/K per client), times:
a batched dcco round, batched cco_fedavg and contrastive_fedavg rounds, a reference (client by
client) dcco round, and a centralized CCO step on the same views; each timing covers the
forward/backward and the server optimiser step, not the (shared) augmentation. Prints the median
of --repeats runs after --warmup runs, and the ratios to the centralized step measured in the
same run. Targets: batched dcco ≤ 1.10×, both FedAvg variants ≤ 1.25×.

    python benchmarks/round_cost.py --widths 16 32 64 --repeats 5
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from dcco.augment import AugmentConfig, augment_pair
from dcco.client import trainable_parameters
from dcco.methods import Segments, build_method
from dcco.models import ModelConfig, build_dual_encoder
from dcco.optim import OptimConfig, apply_pseudo_gradient, build_optimizer
from dcco.simulator import run_round


def time_round(model, method, x1, x2, segments, backend, warmup, repeats) -> float:
    params = trainable_parameters(model)
    optimizer = build_optimizer(params, OptimConfig())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        result = run_round(model, method, x1, x2, segments, backend)
        apply_pseudo_gradient(optimizer, [p for _, p in params],
                              [result.pseudo_gradient[n] for n, _ in params])
        if x1.is_cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    model.load_state_dict(state)
    return statistics.median(times)


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

    central = time_round(model, build_method("centralized_cco"), x1, x2,
                         Segments.from_counts([args.samples]), "batched", args.warmup, args.repeats)
    print(f"centralized step: {central * 1e3:.1f} ms")
    print("| K | samples/client | batched dcco | batched cco_fedavg | batched contrastive_fedavg"
          " | reference dcco |")
    print("|---|---|---|---|---|---|")
    for k in args.clients:
        if args.samples % k:
            raise SystemExit(f"--samples {args.samples} is not divisible by K = {k}")
        per = args.samples // k
        seg = Segments.from_counts([per] * k)
        cells = []
        runs = [("dcco", model, "batched"), ("cco_fedavg", model, "batched"),
                ("contrastive_fedavg", contrastive, "batched"), ("dcco", model, "reference")]
        for name, net, backend in runs:
            method = build_method(name)
            if per < method.min_client_samples:
                cells.append("n/a (1 sample/client)")
                continue
            if backend == "reference" and args.skip_reference:
                cells.append("skipped")
                continue
            t = time_round(net, method, x1, x2, seg, backend, args.warmup, args.repeats)
            cells.append(f"{t * 1e3:.0f} ms ({t / central:.2f}×)")
        print(f"| {k} | {per} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
