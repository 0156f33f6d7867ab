"""What training is worth: a user's own model trained with ``dcco.fit``, probed against the
same encoder untrained and against its raw input (docs/results/learning-value.md).

Each run trains one model with one recipe and one seed over Fashion-MNIST split as the
example splits it (15,000 one-class phones of 4 photos, ``examples/own_model.py``), probes the
encoder as it trains at the rounds asked for, and records the linear probe at 5,000 labels
(``dcco.linear_probe``: every 12th training photo, scored on the 10,000 test photos) of

- the trained encoder at each of those rounds, with its features' effective rank;
- the same encoder untrained (the weights it started from);
- the raw input (the photos' pixels, flattened, through the same probe).

The models, as users bring them (each written here): ``example_cnn``, the example's small CNN
with group norm and global pooling (as shipped before this study); ``wide_cnn``, the same
two convolutions without the global pooling, a 4×4 map of 64 channels (1,024 features);
``plain_cnn``, a quickstart-like CNN without normalisation (two convolutions with max pooling,
three linear layers, a 10-d output); ``mlp``, an MLP on flattened photos as float vectors,
with an augmentation for vectors (noise and masking); ``small``, dcco's own `small` network
(ResNet14 with group norm and weight standardisation at widths 16, 32, 64).

The recipes (``RECIPES``) name ``fit``'s settings, its projector and clients a round, and the
augmentation; ``defaults`` is whatever ``dcco.fit`` does by default today, ``before`` what it
did before this study.

    python experiments/learning_value.py run --model example_cnn --recipe defaults \\
        --seeds 0 1 2 --rounds 1500 --curve 100 300 1000 1500 --threads 1 \\
        --out experiments/results/learning_value/example_cnn-defaults.json
    python experiments/learning_value.py table experiments/results/learning_value/*.json \\
        --plot docs/learning_value.png

A record holds the command that made it, the machine, each seed's probes, and the seconds of
training alone (the probes' time excluded).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ the models


class ExampleCNN(nn.Module):
    """The example's CNN as shipped before this study: two strided convolutions with group
    norm, global average pooling, 64 features."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 3, stride=2, padding=1), nn.GroupNorm(8, width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.GroupNorm(8, 2 * width),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class WideCNN(nn.Module):
    """The example's two convolutions and group norm, then a 4×4 average pool instead of the
    global one: the features keep where in the photo a pattern is (64 × 4 × 4 = 1,024)."""

    def __init__(self, width: int = 32, grid: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 3, stride=2, padding=1), nn.GroupNorm(8, width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.GroupNorm(8, 2 * width),
            nn.ReLU(), nn.AdaptiveAvgPool2d(grid), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class DeepCNN(nn.Module):
    """Three strided convolutions with group norm (32, 64, 128 channels), then global
    average pooling: 128 features, each seeing most of the photo (``grid`` > 1: an average
    pool to a grid × grid map instead, 128 × grid² features; ``norm = False``: no group
    norm)."""

    def __init__(self, width: int = 32, grid: int = 1, norm: bool = True) -> None:
        super().__init__()
        layers, c_in = [], 1
        for c in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1),
                       nn.GroupNorm(math.gcd(8, c), c) if norm else nn.Identity(), nn.ReLU()]
            c_in = c
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(grid), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class WSConv(nn.Conv2d):
    """A convolution with weight standardisation (Qiao et al. 2019): each filter's weights
    centred and scaled to unit variance before use, which lets group norm train as fast as
    batch norm."""

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (
            w.var(dim=(1, 2, 3), keepdim=True, unbiased=False) + 1e-5).sqrt()
        return nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)


class DeepWSCNN(nn.Module):
    """``DeepCNN`` with weight-standardised convolutions."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        layers, c_in = [], 1
        for c in (width, 2 * width, 4 * width):
            layers += [WSConv(c_in, c, 3, stride=2, padding=1), nn.GroupNorm(8, c), nn.ReLU()]
            c_in = c
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Deep4CNN(nn.Module):
    """Four convolutions with group norm (32 at full size, then 64, 128, 256 strided), then
    global average pooling: 256 features."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        layers, c_in = [], 1
        for c, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
            layers += [nn.Conv2d(c_in, c, 3, stride=stride, padding=1), nn.GroupNorm(8, c),
                       nn.ReLU()]
            c_in = c
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class PlainCNN(nn.Module):
    """A quickstart-like CNN without normalisation: two 5×5 convolutions with max pooling,
    three linear layers, a 10-d output (what a classifier's user brings)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Flatten())
        self.head = nn.Sequential(nn.Linear(16 * 4 * 4, 120), nn.ReLU(), nn.Linear(120, 84),
                                  nn.ReLU(), nn.Linear(84, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class VectorMLP(nn.Module):
    """An MLP on 784-d float vectors: two hidden layers of 512, 256 outputs."""

    def __init__(self, d_in: int = 784) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 512), nn.ReLU(), nn.Linear(512, 512),
                                 nn.ReLU(), nn.Linear(512, 256))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def small_network() -> nn.Module:
    """dcco's own `small` network: ResNet14, group norm and weight standardisation, widths
    16, 32, 64 (``configs/fmnist_small.toml``'s backbone), initialised from the seed that
    ``torch.manual_seed`` last set (the run's)."""
    from dcco.config import ModelConfig
    from dcco.models import build_backbone

    return build_backbone(ModelConfig(widths=(16, 32, 64)), (1, 28, 28),
                          seed=torch.initial_seed() % (1 << 31))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "example_cnn": ExampleCNN, "wide_cnn": WideCNN, "deep_cnn": DeepCNN,
    "deep_cnn_grid2": lambda width=32: DeepCNN(width, grid=2), "deep_ws_cnn": DeepWSCNN,
    "deep_plain_cnn": lambda width=32: DeepCNN(width, norm=False),
    "deep4_cnn": Deep4CNN, "plain_cnn": PlainCNN,
    "mlp": VectorMLP, "small": small_network}
VECTOR_MODELS = ("mlp",)
"""Models whose samples are float vectors (the photos flattened and scaled), not images."""


# ------------------------------------------------------------------------------ the views


def to_float(images: Tensor) -> Tensor:
    """uint8 photos (N, 1, 28, 28) → floats in [-1, 1], no augmentation (the probe's view)."""
    return (images.float() / 255 - 0.5) / 0.5


def image_views(crop: tuple[float, float], jitter: float, jitter_p: float = 0.8,
                rotate: float = 0.0, erase: float = 0.0) -> Callable[[Tensor], Tensor]:
    """A user's kornia augmentation of uint8 photos: a random resized crop of ``crop`` of the
    area, a horizontal flip, brightness and contrast jitter of ``jitter`` (none at 0); with
    ``rotate``, a rotation of up to that many degrees; with ``erase``, a random rectangle
    erased with that probability."""
    import kornia.augmentation as K

    parts = [K.RandomResizedCrop((28, 28), scale=crop), K.RandomHorizontalFlip()]
    if rotate > 0:
        parts.append(K.RandomRotation(rotate))
    if jitter > 0:
        parts.append(K.ColorJitter(jitter, jitter, p=jitter_p))
    if erase > 0:
        parts.append(K.RandomErasing(p=erase, scale=(0.02, 0.2)))
    views = nn.Sequential(*parts)

    def augment(images: Tensor) -> Tensor:
        return (views(images.float() / 255) - 0.5) / 0.5

    return augment


def vector_views(noise: float, mask: float) -> Callable[[Tensor], Tensor]:
    """A user's augmentation of float vectors: Gaussian noise of ``noise`` standard
    deviations, then each entry zeroed with probability ``mask``."""

    def augment(x: Tensor) -> Tensor:
        x = x + noise * torch.randn_like(x)
        return x * (torch.rand_like(x) >= mask)

    return augment


# ------------------------------------------------------------------------------ the recipes


@dataclass(frozen=True)
class Recipe:
    """What a run changes from ``dcco.fit``'s defaults: its settings (``settings=``), the
    projector and clients a round (None: fit's default), the augmentation (crop area,
    jitter; for vectors noise and masking), and the method (``fit``'s ``method``: DCCO, or
    another, e.g. BYOL or FedEMA with their predictor and target network around the
    encoder)."""

    settings: tuple[str, ...] = ()
    projector: tuple[int, ...] | None | str = "default"
    clients_per_round: int | None = None
    crop: tuple[float, float] = (0.3, 1.0)
    jitter: float = 0.4
    noise: float = 0.5
    mask: float = 0.3
    rotate: float = 0.0
    erase: float = 0.0
    method: str = "dcco"


BEFORE = ('optim.optimizer="adam"', "optim.lr=1e-3", "optim.warmup_rounds=10",
          "optim.weight_decay=0.0", "loss.lambd=20.0")
"""``dcco.fit``'s settings before this study (until 2026-11-28): its server optimiser, which
it keeps, and the paper's λ."""

RECIPES: dict[str, Recipe] = {
    "defaults": Recipe(),
    "before": Recipe(settings=BEFORE, projector=(128, 128, 128), clients_per_round=32),
}
"""Named recipes; ``--set``, ``--projector``, ``--clients``, ``--crop``, ``--jitter``,
``--noise`` and ``--mask`` change one for a search run (its record says what was run)."""


# ------------------------------------------------------------------------------ a run


def features_rank(features: Tensor) -> float:
    """The effective rank (``dcco.core.collapse.effective_rank``) of centred features."""
    from dcco.core.collapse import effective_rank

    return float(effective_rank(features - features.mean(0)))


def load_data(vectors: bool):
    """The phones (one class each, 4 photos), the probe's labelled and scored sets, and the
    probe's input transform: photos as uint8 images, or as float vectors for ``mlp``."""
    from dcco.data import load_dataset

    train, test = load_dataset("fashion_mnist", "train"), load_dataset("fashion_mnist", "test")
    x_train, x_test = train.images, test.images
    if vectors:
        x_train, x_test = to_float(x_train).flatten(1), to_float(x_test).flatten(1)
    order = train.labels.argsort(stable=True)
    clients = {f"phone-{i}": x_train[order[i:i + 4]] for i in range(0, len(order), 4)}
    labelled = (x_train[::12][:5000], train.labels[::12][:5000])
    scored = (x_test, test.labels)
    transform = None if vectors else to_float
    return clients, labelled, scored, transform


def probe(encoder: nn.Module, labelled, scored, transform) -> tuple[float, float]:
    """The linear probe's accuracy and the test features' effective rank."""
    import dcco
    from dcco.fitting import encoder_features

    accuracy = dcco.linear_probe(encoder, labelled, scored, transform=transform)
    rank = features_rank(encoder_features(encoder, scored[0][:2000], transform))
    return accuracy, rank


def run_one(model: str, recipe: Recipe, seed: int, rounds: int, curve: list[int],
            data, width: int | None = None) -> dict:
    """One seed: the untrained and raw probes, then ``fit`` with the probes at ``curve``."""
    import dcco

    clients, labelled, scored, transform = data
    torch.manual_seed(seed)
    encoder = MODELS[model]() if width is None else MODELS[model](width=width)
    untrained = copy.deepcopy(encoder)
    raw = probe(nn.Flatten(), labelled, scored, transform)
    before = probe(untrained, labelled, scored, transform)
    vectors = model in VECTOR_MODELS
    augment = (vector_views(recipe.noise, recipe.mask) if vectors
               else image_views(recipe.crop, recipe.jitter, rotate=recipe.rotate,
                                erase=recipe.erase))
    kwargs = {}
    if recipe.projector != "default":
        kwargs["projector"] = recipe.projector
    if recipe.clients_per_round is not None:
        kwargs["clients_per_round"] = recipe.clients_per_round
    if recipe.method != "dcco":
        kwargs["method"] = recipe.method
    probes, spent = {}, [0.0]

    def on_round(done: int, dual) -> None:
        if done in curve:
            start = time.perf_counter()
            probes[done] = probe(dual.backbone, labelled, scored, transform)
            spent[0] += time.perf_counter() - start

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        result = dcco.fit(encoder, clients, rounds=rounds, augment=augment, seed=seed,
                          run_dir=Path(folder) / "run", progress=False,
                          settings=recipe.settings, on_round=on_round, **kwargs)
    seconds = time.perf_counter() - start - spent[0]
    if rounds not in probes:
        probes[rounds] = probe(encoder, labelled, scored, transform)
    return {"seed": seed, "raw": raw[0], "raw_rank": raw[1], "untrained": before[0],
            "untrained_rank": before[1],
            "probes": {str(r): {"accuracy": a, "rank": k} for r, (a, k) in sorted(probes.items())},
            "trained": probes[rounds][0], "trained_rank": probes[rounds][1],
            "final_loss": result.summary.get("final_loss"), "collapse": result.collapse,
            "collapse_warning": result.collapse_warning, "train_seconds": seconds}


def machine() -> dict:
    from dcco.run.rundir import code_version

    return {"cpu": code_version().get("cpu"), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "commit": code_version().get("git_commit")}


def cmd_run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    base = RECIPES[args.recipe]
    settings = list(base.settings) + list(args.set)  # later settings win
    projector = base.projector
    if args.projector is not None:
        projector = None if args.projector == ["none"] else tuple(int(d) for d in args.projector)
    recipe = Recipe(settings=settings, projector=projector,
                    clients_per_round=args.clients or base.clients_per_round,
                    crop=tuple(args.crop) if args.crop else base.crop,
                    jitter=base.jitter if args.jitter is None else args.jitter,
                    noise=base.noise if args.noise is None else args.noise,
                    mask=base.mask if args.mask is None else args.mask,
                    rotate=base.rotate if args.rotate is None else args.rotate,
                    erase=base.erase if args.erase is None else args.erase,
                    method=args.method or base.method)
    curve = sorted(set(args.curve or []) | {args.rounds})
    data = load_data(args.model in VECTOR_MODELS)
    record = {"command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)]
                                              + sys.argv[1:]),
              "model": args.model + (f" (width {args.width})" if args.width else ""),
              "recipe": args.name or args.recipe,
              "recipe_detail": {"settings": settings, "projector": projector,
                                "clients_per_round": recipe.clients_per_round,
                                "crop": recipe.crop, "jitter": recipe.jitter,
                                "noise": recipe.noise, "mask": recipe.mask,
                                "rotate": recipe.rotate, "erase": recipe.erase,
                                "method": recipe.method},
              "rounds": args.rounds, "machine": machine(), "seeds": []}
    for seed in args.seeds:
        one = run_one(args.model, recipe, seed, args.rounds, curve, data, args.width)
        record["seeds"].append(one)
        print(f"{args.model} {record['recipe']} seed {seed}: trained "
              f"{100 * one['trained']:.1f} % (rank {one['trained_rank']:.1f}), untrained "
              f"{100 * one['untrained']:.1f} %, raw {100 * one['raw']:.1f} %; "
              f"{one['train_seconds']:.0f} s of training; curve "
              + " ".join(f"{r}:{100 * p['accuracy']:.1f}" for r, p in one["probes"].items()),
              flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            os.replace(tmp, args.out)
    return 0


def cmd_time(args: argparse.Namespace) -> int:
    """Seconds a round of each model under fit's defaults, and the rounds that fill the
    budget: what sets each model's rounds in the study (a fixed budget of wall time)."""
    import dcco

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        model, _, width = name.partition(":")
        vectors = model in VECTOR_MODELS
        clients = load_data(vectors)[0]
        encoder = MODELS[model]() if not width else MODELS[model](width=int(width))
        augment = vector_views(0.5, 0.3) if vectors else image_views((0.3, 1.0), 0.4)
        stamps: list[float] = []
        with tempfile.TemporaryDirectory() as folder:
            dcco.fit(encoder, clients, rounds=args.warmup + args.rounds, augment=augment,
                     run_dir=Path(folder) / "run", progress=False,
                     on_round=lambda done, _m, stamps=stamps: stamps.append(
                         time.perf_counter()))
        per = (stamps[-1] - stamps[args.warmup - 1]) / args.rounds
        rows.append({"model": name, "seconds_per_round": per,
                     "rounds_in_budget": int(60 * args.minutes / per)})
        print(f"{name}: {1000 * per:.0f} ms a round; {args.minutes:g} min = "
              f"{rows[-1]['rounds_in_budget']} rounds", flush=True)
    if args.out:
        record = {"command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)]
                                                  + sys.argv[1:]),
                  "machine": machine(), "minutes": args.minutes, "models": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------------------ the table


def _mean_sd(values: list[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


def _cell(values: list[float]) -> str:
    """mean ± sd (each seed)."""
    mean, sd = _mean_sd(values)
    return f"{mean:.1f} ± {sd:.1f} (" + " / ".join(f"{x:.1f}" for x in values) + ")"


def table_row(r: dict) -> str:
    """One record's row: the probes in %, mean ± sd with every seed, and the gains."""
    seeds = r["seeds"]
    trained = [100 * s["trained"] for s in seeds]
    untrained = [100 * s["untrained"] for s in seeds]
    raw = [100 * s["raw"] for s in seeds]
    gain = [a - b for a, b in zip(trained, untrained)]
    over = [a - b for a, b in zip(trained, raw)]
    secs = sum(s["train_seconds"] for s in seeds) / len(seeds)
    ranks = (f"{_mean_sd([s['trained_rank'] for s in seeds])[0]:.1f} / "
             f"{_mean_sd([s['untrained_rank'] for s in seeds])[0]:.1f}")
    return (f"| {r['model']} | {r['recipe']} | {r['rounds']} | {secs:.0f} | {_cell(trained)} | "
            f"{_cell(untrained)} | {_mean_sd(raw)[0]:.1f} | {_cell(gain)} | {_cell(over)} | "
            f"{ranks} |")


def cmd_table(args: argparse.Namespace) -> int:
    records = [json.loads(Path(p).read_text()) for p in args.records]
    lines = [("| model | recipe | rounds | training (s) | trained | untrained | raw input | "
              "gain over untrained | gain over raw | features' rank (trained / untrained) |"),
             "|---|---|---:|---:|---|---|---:|---|---|---|"]
    lines += [table_row(r) for r in records]
    print("\n".join(lines))
    if args.plot:
        plot(records, args.plot)
    return 0


def plot(records: list[dict], path: Path) -> None:
    """The probe by rounds, one panel a model: each recipe's mean over seeds (its seeds'
    range shaded), the untrained encoder's probe (dotted) and the raw input's (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in records))
    cols = min(3, len(models))
    rows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models):
        mine = [r for r in records if r["model"] == model]
        for r in mine:
            rounds = sorted(int(k) for k in r["seeds"][0]["probes"])
            each = [[100 * s["probes"][str(k)]["accuracy"] for s in r["seeds"]] for k in rounds]
            line, = ax.plot(rounds, [sum(v) / len(v) for v in each], marker="o",
                            label=r["recipe"])
            ax.fill_between(rounds, [min(v) for v in each], [max(v) for v in each],
                            color=line.get_color(), alpha=0.15, linewidth=0)
        seeds = mine[0]["seeds"]
        ax.axhline(_mean_sd([100 * s["untrained"] for s in seeds])[0], color="grey",
                   linestyle=":", label="untrained encoder")
        ax.axhline(_mean_sd([100 * s["raw"] for s in seeds])[0], color="black",
                   linestyle="--", linewidth=1, label="raw input")
        ax.set_title(model)
        ax.set_xlabel("rounds")
        ax.set_ylabel("linear probe, 5,000 labels (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train and probe one model with one recipe, over seeds")
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="defaults")
    p.add_argument("--name", default=None, help="the recipe's name in the record")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fit setting on top of the recipe's (optim.lr=3e-3)")
    p.add_argument("--projector", nargs="+", default=None, help="widths, or 'none'")
    p.add_argument("--clients", type=int, default=None, help="clients a round")
    p.add_argument("--crop", type=float, nargs=2, default=None)
    p.add_argument("--jitter", type=float, default=None)
    p.add_argument("--noise", type=float, default=None)
    p.add_argument("--mask", type=float, default=None)
    p.add_argument("--rotate", type=float, default=None, help="degrees")
    p.add_argument("--erase", type=float, default=None, help="probability")
    p.add_argument("--width", type=int, default=None,
                   help="the model's first width, for the CNNs that take one")
    p.add_argument("--method", default=None,
                   help="fit's method (default dcco): byol_fedavg, fedema, moco_fedavg, ...")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--curve", type=int, nargs="*", default=None,
                   help="rounds at which to probe as it trains (the last always)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_run)
    m = sub.add_parser("time", help="each model's seconds a round, and its rounds in a budget")
    m.add_argument("--models", nargs="+", required=True, metavar="MODEL[:WIDTH]")
    m.add_argument("--minutes", type=float, default=3.0)
    m.add_argument("--rounds", type=int, default=60, help="rounds timed, after the warm-up")
    m.add_argument("--warmup", type=int, default=20)
    m.add_argument("--threads", type=int, default=torch.get_num_threads())
    m.add_argument("--out", type=Path, default=None)
    m.set_defaults(func=cmd_time)
    t = sub.add_parser("table", help="the records as a markdown table (and the curves' plot)")
    t.add_argument("records", nargs="+")
    t.add_argument("--plot", type=Path, default=None)
    t.set_defaults(func=cmd_table)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
