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

``--scale full|small|tiny`` measures the speed ladder instead, at one client structure
(non-IID 4: clients of 4 samples, 128 of them at ``full``): for each of the three federated
methods and the centralized step, ms per round with today's path (eager float32), then with
each optimisation added in turn (fused/multi-tensor server optimiser, bf16 autocast,
torch.compile, CUDA graphs; channels-last tried on top of the best), and beside each a plain
centralized Barlow Twins step of the same network with the same optimisations, the floor for
that model. It also prints the FLOPs of a round (``torch.utils.flop_counter``), the achieved
TFLOP/s and their fraction of the GPU's dense bf16 peak, and the peak memory; with ``--out``
it writes ``round_cost_<device>.json`` and ``.md`` there.

    python benchmarks/round_cost.py --device cuda --scale full --out benchmarks/results
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dcco.config import AugmentConfig, ModelConfig, OptimConfig
from dcco.core.algorithm import Algorithm
from dcco.core.client import trainable_parameters
from dcco.core.optim import apply_pseudo_gradient, build_optimizer
from dcco.core.precision import Speed, can_compile, prepare_model
from dcco.core.simulator import run_round
from dcco.data.augment import augment_pair
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder


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
    if "--scale" in sys.argv[1:] or any(a.startswith("--scale=") for a in sys.argv[1:]):
        ladder_main()
        return
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


# ------------------------------------------------------------------------ the speed ladder

SCALES = {
    # widths, CCO projector, contrastive projector, samples per round, image side
    "full": ((64, 128, 256), (1024, 1024, 1024), (256, 256, 128), 512, 28),
    "small": ((16, 32, 64), (128, 128, 128), (128, 128, 128), 128, 28),
    "tiny": ((4, 8, 8), (16, 16, 16), (16, 16, 16), 16, 12),
}
"""The Table 1 grid's networks and global batches (experiments/table1_fmnist.toml); ``tiny``
is for checking the benchmark itself on a CPU."""

BF16_DENSE_TFLOPS = (("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0),
                     ("H100", 989.4), ("GH200", 989.4), ("A100", 312.0), ("L40S", 362.1),
                     ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0))
"""Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, by device name."""


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: what is switched on."""

    name: str
    speed: Speed
    fast_optimizer: bool


def ladder_steps(device: torch.device, wanted: list[str] | None) -> list[Step]:
    """Today's path, then each optimisation added in turn (CUDA graphs on CUDA only), then
    channels-last on top of the best."""
    compiles = can_compile(device.type)
    steps = [Step("eager float32", Speed("float32", "off"), False),
             Step("+ fused optimiser", Speed("float32", "off"), True),
             Step("+ bf16", Speed("bf16", "off"), True)]
    if compiles:
        steps.append(Step("+ compile", Speed("bf16", "on"), True))
    if compiles and device.type == "cuda":
        steps.append(Step("+ CUDA graphs", Speed("bf16", "cudagraphs"), True))
    last = steps[-1]
    steps.append(Step("+ channels_last", Speed(last.speed.precision, last.speed.compile, True),
                      True))
    if wanted:
        unknown = set(wanted) - {s.name for s in steps}
        if unknown:
            raise SystemExit(f"--steps: unknown {sorted(unknown)}; here: "
                             f"{[s.name for s in steps]}")
        steps = [s for s in steps if s.name in wanted]
    return steps


def barlow_twins(z1: torch.Tensor, z2: torch.Tensor, lambd: float = 20.0) -> torch.Tensor:
    """A plain Barlow Twins loss in the encodings' dtype: batch-normalised cross-correlation,
    (1 − C_ii)² on the diagonal and λ/(d − 1)·C_ij² off it (the CCO loss's scaling)."""
    n, d = z1.shape
    a = (z1 - z1.mean(0)) / torch.sqrt(z1.var(0, correction=0) + 1e-5)
    b = (z2 - z2.mean(0)) / torch.sqrt(z2.var(0, correction=0) + 1e-5)
    c = a.T @ b / n
    on = torch.diagonal(c)
    return ((1 - on) ** 2).sum() + lambd / (d - 1) * ((c * c).sum() - (on * on).sum())


def floor_step(model, opt, x1, x2) -> None:
    """The floor: a centralized Barlow Twins step, nothing federated about it."""
    z1, z2 = model(x1, x2)
    loss = barlow_twins(z1, z2)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def round_step(model, opt, params, algorithm, x1, x2, segments) -> None:
    """One round as ``dcco.run.pretraining.Pretraining.step`` runs it, after the augmentation."""
    result = run_round(model, algorithm, x1, x2, segments.to(x1.device), "batched")
    apply_pseudo_gradient(opt, [p for _, p in params],
                          [result.pseudo_gradient[n] for n, _ in params])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _peak_tflops(name: str) -> float | None:
    for key, tflops in BF16_DENSE_TFLOPS:
        if key.lower() in name.lower():
            return tflops
    return None


def count_flops(fn) -> int:
    """FLOPs of one call of ``fn`` (matrix multiplications and convolutions, as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def ladder_main() -> None:
    ap = argparse.ArgumentParser(description="The speed ladder of one round (see the module "
                                             "docs of benchmarks/round_cost.py)")
    ap.add_argument("--scale", choices=sorted(SCALES), required=True)
    ap.add_argument("--device", default="auto", help="auto (CUDA if present), cpu or cuda")
    ap.add_argument("--samples-per-client", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=None,
                    help="rounds per variant before timing (default 5 on CUDA, 1 on CPU); "
                         "compilation and CUDA graph recording happen here")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per timed block (default 20 on CUDA, 1 on CPU)")
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks per variant")
    ap.add_argument("--steps", nargs="+", default=None, metavar="STEP",
                    help="only these rungs, by name (e.g. 'eager float32' '+ compile')")
    ap.add_argument("--methods", nargs="+", default=None, choices=sorted(METHOD_FEDERATED),
                    help="only these methods (default: all four)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense bf16 peak (default: NVIDIA's figure by name)")
    ap.add_argument("--out", type=Path, default=None,
                    help="write round_cost_<device>.json and .md into this folder")
    args = ap.parse_args()

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here")
    on_gpu = device.type == "cuda"
    warmup = args.warmup if args.warmup is not None else (5 if on_gpu else 1)
    block = args.rounds if args.rounds is not None else (20 if on_gpu else 1)
    widths, projector, contrastive_projector, samples, side = SCALES[args.scale]
    per = args.samples_per_client
    if samples % per:
        raise SystemExit(f"--samples-per-client {per} does not divide the {samples} samples")
    clients = samples // per
    name = torch.cuda.get_device_name(device) if on_gpu else (
        f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    peak = args.peak_tflops if args.peak_tflops is not None else (
        _peak_tflops(name) if on_gpu else None)
    if hasattr(torch, "_dynamo"):  # every rung compiles new models of the same code
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (samples, 1, side, side), generator=gen, dtype=torch.uint8)
    ids = torch.arange(samples)
    segments = {True: Segments.from_counts([per] * clients),
                False: Segments.from_counts([samples])}
    methods = [(m, cco) for m, cco in [("dcco", True), ("cco_fedavg", True),
                                        ("contrastive_fedavg", False), ("centralized_cco", True)]
               if args.methods is None or m in args.methods]
    print(f"# {name}; torch {torch.__version__}; ResNet14 widths {widths}, projector "
          f"{projector} (contrastive {contrastive_projector}); {samples} samples of 1×{side}² "
          f"per round, {clients} clients of {per}; {block} rounds per timed block, median of "
          f"{args.repeats} blocks after {warmup} warm-up rounds")

    def views(dtype):
        _sync(device)
        start = time.perf_counter()
        out = augment_pair(images.to(device), ids.to(device), 0, 0, AugmentConfig.byol(),
                           dtype=dtype)
        _sync(device)
        return out, time.perf_counter() - start

    (x1, x2), _ = views(torch.float32)
    augment_ms = statistics.median(views(torch.float32)[1] for _ in range(3)) * 1e3
    print(f"# augmentation of both views: {augment_ms:.2f} ms per round (not in the "
          f"timings below, the same for every variant)")

    # FLOPs of each method's round and of the floor, counted once on eager float32 models
    flops: dict[str, int] = {}
    for cco_net in (True, False):
        net = build_dual_encoder(ModelConfig(widths=widths), 1,
                                 projector if cco_net else contrastive_projector, seed=0).to(device)
        params = trainable_parameters(net)
        opt = build_optimizer(params, OptimConfig(), fast=False)
        flops["floor" if cco_net else "floor-contrastive"] = count_flops(
            lambda net=net, opt=opt: floor_step(net, opt, x1, x2))
        for method, uses_cco_net in methods:
            if uses_cco_net == cco_net:
                seg = segments[METHOD_FEDERATED[method]]
                flops[method] = count_flops(
                    lambda net=net, opt=opt, params=params, method=method, seg=seg: round_step(
                        net, opt, params, Algorithm(build_method(method)), x1, x2, seg))
        del net, opt

    rows = []
    header = ("| step | method | ms / round | floor ms | × floor | TFLOP/s | "
              + ("% of bf16 peak | " if peak else "") + "peak memory (GiB) |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for step in ladder_steps(device, args.steps):
        nets = {}
        for cco_net in (True, False):
            net = build_dual_encoder(ModelConfig(widths=widths), 1,
                                     projector if cco_net else contrastive_projector, seed=0)
            nets[cco_net] = prepare_model(net, step.speed, device)
        xs = (x1.to(step.speed.param_dtype), x2.to(step.speed.param_dtype))
        variants = []  # (label, network, run one round)
        for cco_net, net in nets.items():
            params = trainable_parameters(net)
            floor_opt = build_optimizer(params, OptimConfig(), fast=step.fast_optimizer)
            variants.append((("floor", cco_net),
                             lambda net=net, o=floor_opt, xs=xs: floor_step(net, o, *xs)))
            for method, uses_cco_net in methods:
                if uses_cco_net != cco_net:
                    continue
                opt = build_optimizer(params, OptimConfig(), fast=step.fast_optimizer)
                algorithm = Algorithm(build_method(method))
                seg = segments[METHOD_FEDERATED[method]]
                variants.append(((method, cco_net), lambda net=net, o=opt, p=params,
                                 a=algorithm, s=seg, xs=xs: round_step(net, o, p, a, *xs, s)))
        memory = {}
        for label, run in variants:
            for _ in range(warmup):
                run()
            _sync(device)
            if on_gpu:  # what one round adds to what the rung holds (models, views, graphs)
                torch.cuda.reset_peak_memory_stats(device)
                held = torch.cuda.memory_allocated(device)
                run()
                _sync(device)
                memory[label] = (torch.cuda.max_memory_allocated(device) - held) / 2**30
        times: dict = {label: [] for label, _ in variants}
        for _ in range(args.repeats):
            for label, run in variants:  # interleaved: a slow spell hits every variant
                _sync(device)
                start = time.perf_counter()
                for _ in range(block):
                    run()
                _sync(device)
                times[label].append((time.perf_counter() - start) / block)
        for method, cco_net in [(m, c) for m, c in methods]:
            t, floor = times[(method, cco_net)], times[("floor", cco_net)]
            ms, floor_ms = statistics.median(t) * 1e3, statistics.median(floor) * 1e3
            ratio = statistics.median(a / b for a, b in zip(t, floor))
            tflops = flops[method] / (ms / 1e3) / 1e12
            row = {"step": step.name, "method": method,
                   "clients": clients if METHOD_FEDERATED[method] else 1,
                   "samples_per_client": per if METHOD_FEDERATED[method] else samples,
                   "precision": step.speed.precision, "compiled": step.speed.compiled,
                   "compile_mode": step.speed.compile,
                   "channels_last": step.speed.channels_last,
                   "fused_optimizer": step.fast_optimizer,
                   "ms_per_round": round(ms, 3), "centralized_ms_per_round": round(floor_ms, 3),
                   "ratio_to_centralized": round(ratio, 3),
                   "tflop_per_round": flops[method] / 1e12,
                   "floor_tflop_per_round": flops["floor" if cco_net else "floor-contrastive"]
                   / 1e12,
                   "tflops": float(f"{tflops:.4g}"),
                   "peak_fraction": round(tflops / peak, 4) if peak else None,
                   "peak_memory_gib": (round(memory[(method, cco_net)], 2) if on_gpu
                                       else None)}
            rows.append(row)
            cells = [step.name, method, f"{ms:.2f}", f"{floor_ms:.2f}", f"{ratio:.2f}×",
                     f"{tflops:.3g}"]
            if peak:
                cells.append(f"{100 * tflops / peak:.1f} %")
            cells.append(f"{row['peak_memory_gib']:.2f}" if on_gpu else "n/a")
            print("| " + " | ".join(cells) + " |", flush=True)
        del nets, variants, net, params, opt, floor_opt, run, xs
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
        if args.out is not None:  # after every rung: a later rung that fails loses nothing
            write_ladder(args, name, peak, widths, projector, contrastive_projector, samples,
                         side, augment_ms, warmup, block, rows, on_gpu)


def write_ladder(args, name, peak, widths, projector, contrastive_projector, samples, side,
                 augment_ms, warmup, block, rows, on_gpu) -> None:
    """``round_cost_<device>.json`` and ``.md`` in ``args.out``, with the rows so far."""
    record = {"device": name, "torch": torch.__version__, "scale": args.scale,
              "widths": list(widths), "projector": list(projector),
              "contrastive_projector": list(contrastive_projector), "samples": samples,
              "image_side": side, "bf16_peak_tflops": peak, "augment_ms": round(augment_ms, 3),
              "warmup": warmup, "rounds_per_block": block, "repeats": args.repeats,
              "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if on_gpu else None,
              "command": "python benchmarks/round_cost.py " + " ".join(sys.argv[1:]),
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"round_cost_{_slug(name if on_gpu else 'cpu')}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    stem.with_suffix(".md").write_text(ladder_markdown(record))
    print(f"# wrote {stem}.json and {stem}.md")


METHOD_FEDERATED = {"dcco": True, "cco_fedavg": True, "contrastive_fedavg": True,
                    "centralized_cco": False}


def ladder_markdown(record: dict) -> str:
    """The ladder as a Markdown table, with the command and the machine."""
    peak = record["bf16_peak_tflops"]
    lines = [f"# Round cost on {record['device']}", "",
             (f"Command: `{record['command']}` (torch {record['torch']}). Scale "
             f"`{record['scale']}`: ResNet14 widths {tuple(record['widths'])}, projector "
             f"{tuple(record['projector'])} (contrastive "
             f"{tuple(record['contrastive_projector'])}), {record['samples']} samples of "
             f"1×{record['image_side']}² per round. Each time covers the round's "
             f"forward/backward and the server optimiser, not the augmentation "
             f"({record['augment_ms']} ms per round). 'floor': a plain centralized Barlow Twins "
             f"step of the same network with the same optimisations. Median of "
             f"{record['repeats']} blocks of {record['rounds_per_block']} rounds after "
             f"{record['warmup']} warm-up rounds."), "",
             "| step | method | clients × samples | ms / round | floor ms | × floor | TFLOP/s | "
             + ("% of dense bf16 peak | " if peak else "") + "peak memory (GiB) |",
             "|---|---|---|---:|---:|---:|---:|" + ("---:|" if peak else "") + "---:|"]
    for r in record["rows"]:
        cells = [r["step"], r["method"], f"{r['clients']} × {r['samples_per_client']}",
                 f"{r['ms_per_round']:.2f}", f"{r['centralized_ms_per_round']:.2f}",
                 f"{r['ratio_to_centralized']:.2f}×", f"{r['tflops']:.3g}"]
        if peak:
            cells.append(f"{100 * r['peak_fraction']:.1f} %")
        cells.append("n/a" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
