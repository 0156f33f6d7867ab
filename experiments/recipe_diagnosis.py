"""Why does a recipe train or stall? One config under several variants, round by round: the
loss, what the encodings look like, and how far each layer moves per round.

    python experiments/recipe_diagnosis.py configs/fmnist_small.toml --rounds 150 \
        --variant "adam 5e-3:" --variant "lars 1.5:optim.optimizer=\"lars\";optim.lr=1.5" \
        --out experiments/results/recipe_diagnosis

A variant is ``NAME:OVERRIDES``, the overrides ``section.key=value`` joined by ``;``, applied
on top of the config (and of ``--set``). Every ``--every`` rounds, on a fixed batch of 512
training images (no augmentation, the model in eval mode), it records:

- ``projection_alive``: the fraction of projection dimensions whose spread over the batch is
  above 1e-3 of the largest (the dimensions the CCO loss can still correlate; a collapsed
  projector keeps few);
- ``projection_rank``: the effective rank (exp of the entropy of the normalised singular
  values) of the standardised projections, and ``feature_rank`` the same of the backbone
  features;
- ``feature_cosine``: the mean pairwise cosine of the backbone features (what misled the raw
  k-NN monitor);
- ``update``: per layer kind (``conv``, ``projector``, ``last``: the projector's plain output
  layer, ``norm``: group-norm scales and shifts), the mean over the window's rounds of
  ‖w_after − w_before‖ / ‖w_before‖, and the largest of those.

The loss is the window's mean. Output: ``--out``.json (every variant's records and the
command) and ``--out``.png (loss, projection rank and layer movement against rounds).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dcco.config import load_config
from dcco.data.augment import model_input
from dcco.run.checkpoint import atomic_write_text
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import code_version
from dcco.run.splits import load_splits


def _kind(name: str, param: torch.Tensor) -> str:
    if param.ndim == 1:
        return "norm"
    if "projector" in name:
        return "projector"
    return "conv"


def _last_projector_layer(model) -> str | None:
    names = [n for n, p in model.named_parameters() if "projector" in n and p.ndim == 2]
    return names[-1] if names else None


def effective_rank(x: torch.Tensor) -> float:
    """exp(entropy of the normalised singular values) of the standardised rows of ``x``."""
    x = x.double()
    std = x.std(0, correction=0)
    keep = std > 1e-12
    if not keep.any():
        return 0.0
    z = (x[:, keep] - x[:, keep].mean(0)) / std[keep]
    s = torch.linalg.svdvals(z)
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


@torch.no_grad()
def encodings(pt: Pretraining, images: torch.Tensor) -> dict[str, float]:
    model = pt.model
    was = model.training
    model.eval()
    x = model_input(images.to(pt.device), pt.dtype)
    features = model.features(x).double()
    z = model.encode(x).double()
    model.train(was)
    spread = z.std(0, correction=0)
    unit = F.normalize(features, dim=1)
    cos = unit @ unit.T
    n = cos.shape[0]
    return {"projection_alive": float((spread > 1e-3 * spread.max()).double().mean()),
            "projection_rank": effective_rank(z), "feature_rank": effective_rank(features),
            "feature_cosine": float((cos.sum() - n) / (n * n - n))}


def run_variant(cfg, rounds: int, every: int, train, probe_images) -> list[dict]:
    pt = Pretraining.of(cfg, train)
    last = _last_projector_layer(pt.model)
    params = {n: p for n, p in pt.model.named_parameters() if p.requires_grad}
    records = [{"round": 0, **encodings(pt, probe_images)}]
    window: dict[str, list[float]] = {}
    losses = []
    for r in range(1, rounds + 1):
        before = {n: p.detach().clone() for n, p in params.items()}
        m = pt.step()
        losses.append(float(m.loss) if m.loss is not None else math.nan)
        for n, p in params.items():
            kind = "last" if n.startswith(last or "\0") else _kind(n, p)
            norm = float(before[n].norm())
            if norm > 0:
                window.setdefault(kind, []).append(float((p.detach() - before[n]).norm()) / norm)
        if r % every == 0 or r == rounds:
            update = {k: {"mean": sum(v) / len(v), "max": max(v)} for k, v in window.items()}
            records.append({"round": r, "loss": sum(losses) / len(losses),
                            **encodings(pt, probe_images), "update": update})
            print(f"  round {r}: loss {records[-1]['loss']:.4g}, projection alive "
                  f"{records[-1]['projection_alive']:.2f}, rank "
                  f"{records[-1]['projection_rank']:.1f}, conv update "
                  f"{update.get('conv', {}).get('mean', 0):.3g}", flush=True)
            window, losses = {}, []
    return records


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, records in results.items():
        later = records[1:]
        rounds = [r["round"] for r in later]
        axes[0].plot(rounds, [r["loss"] for r in later], label=name)
        axes[1].plot([r["round"] for r in records], [r["projection_rank"] for r in records],
                     label=name)
        axes[2].plot(rounds, [r["update"].get("conv", {}).get("mean", math.nan) for r in later],
                     label=name)
    axes[0].set_ylabel("loss (window mean)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("effective rank of projections")
    axes[2].set_ylabel("conv layers: ‖Δw‖/‖w‖ per round")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--variant", action="append", required=True, metavar="NAME:OVERRIDES")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json, .png)")
    args = ap.parse_args(argv)
    results, configs = {}, {}
    train = None
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        extra = [o.strip() for o in overrides.split(";") if o.strip()]
        cfg = load_config(args.config, args.set + extra + [f"train.rounds={args.rounds}"])
        if train is None:
            train = load_splits(cfg)[0]
            ids = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:512]
            probe_images = train.inputs(0)[ids]
        print(f"[{name}] {' '.join(extra) or '(the config as it is)'}", flush=True)
        start = time.perf_counter()
        results[name] = run_variant(cfg, args.rounds, args.every, train, probe_images)
        configs[name] = extra
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)
    command = "python experiments/recipe_diagnosis.py " + shlex.join(
            sys.argv[1:] if argv is None else argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(
        {"command": command, "config": str(args.config), "set": args.set,
         "variants": configs, "machine": {k: code_version()[k] for k in ("cpu", "gpu",
                                                                          "torch")},
         "records": results}, indent=2) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
