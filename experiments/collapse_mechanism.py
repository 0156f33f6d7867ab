"""Where a CCO run stalls: layer by layer, round by round, under several recipes.

    python experiments/collapse_mechanism.py --grid experiments/table1_fmnist.toml --scale gpu \
        --cell non-iid-4-dcco-s0 --rounds 100 --every 10 --threads 1 \
        --variant 'adam 5e-3:' --variant 'adam 1e-3:optim.lr=1e-3' \
        --out experiments/results/collapse/paper_network

A variant is ``NAME:OVERRIDES`` (``section.key=value`` joined by ``;``) on top of the cell's
config (``--grid``/``--scale``/``--cell``) or of ``--config``. It runs the first ``--rounds``
rounds of that run, its learning-rate schedule that of all its ``train.rounds`` (the first
hundred rounds of a 5,000-round cosine are at nearly its peak rate). Every ``--every`` rounds (and
at round 0) it records, on a fixed batch of ``--batch`` training images seen through two
views of the run's augmentation (a fixed draw; the model in training mode, no gradient):

- the loss's two terms on that batch: ``on_diag`` Σ_i (1 − C_ii)² and ``off_diag``
  λ/(d−1) Σ_{i≠j} C_ij², and the collapse figures (``dcco.core.collapse``) of its encodings and
  of the last round's S_A;
- the spread of the encodings' per-dimension variances against the loss's ε (quantiles, and
  the fraction below ε);
- for every layer whose output matters (the stem, each residual block, the backbone's pooled
  features, each hidden projector layer after its ReLU, the projector's output): ``dead``,
  the fraction of units that are 0 for every sample (ReLU outputs; a channel counts as one
  unit); ``spread``, ‖X − X̄‖/‖X‖ over the samples of the (channel-pooled) outputs, the share
  of a layer's output that differs between samples (0: every sample alike); ``rank``, the
  effective rank of their standardised (N, units) matrix;
- per parameter group (stem and stage convolutions, the backbone's and the projector's
  group-norm gains and shifts, the projector's hidden and last weights, its last bias), the
  mean over the window of ‖Δw‖/‖w‖ per round;
- the projector's last weight W: its stable rank ‖W‖²_F/σ₁², and its rows' norms (min,
  median, max): a dimension whose row shrinks dies there.

Output: ``--out``.json (the command, the machine, every variant's records).
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
from torch import nn

from dcco.config import load_config
from dcco.core.collapse import collapse_figures, effective_rank
from dcco.core.losses import cco_from_correlation, cross_correlation
from dcco.core.seeding import derive_seed
from dcco.core.stats import encoding_stats
from dcco.data.augment import training_views
from dcco.run.checkpoint import atomic_write_text
from dcco.run.monitors import monitor_knn
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import code_version
from dcco.run.splits import load_splits

PROBE_ROUND = 2**20
"""The augmentation round of the fixed probe views (no training round reaches it)."""


def cell_config(grid: Path, scale: str, cell: str, overrides: list[str]):
    """The config of one grid cell, with ``overrides`` on top."""
    from dataclasses import replace

    from dcco.config import load_config as _load
    from dcco.reproduce.grid import load_grid
    from dcco.reproduce.plan import plan_cells

    g = load_grid(grid, scale)
    cells = {c.path.name: c for c in plan_cells(g, Path("/nonexistent"))}
    if cell not in cells:
        raise SystemExit(f"no cell {cell!r} in {grid} at scale {scale}; "
                         f"e.g. {', '.join(sorted(cells)[:6])}")
    cfg = cells[cell].cfg
    if not overrides:
        return cfg
    from dcco.config import to_toml

    text = to_toml(cfg)
    tmp = Path("/tmp") / f"collapse-mechanism-{cell}.toml"
    tmp.write_text(text)
    return replace(_load(tmp, overrides))


def _layers(model) -> dict[str, nn.Module]:
    """The modules whose outputs are recorded, by a short name."""
    out: dict[str, nn.Module] = {}
    backbone = model.backbone
    if hasattr(backbone, "stem"):
        out["stem"] = backbone.stem
        for i, block in enumerate(backbone.layers):
            out[f"block{i}"] = block
    out["features"] = backbone
    relus = [m for m in model.projector if isinstance(m, nn.ReLU)]
    for i, relu in enumerate(relus):
        out[f"proj{i}"] = relu
    out["output"] = model.projector
    return out


def _pooled(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=(2, 3)) if x.ndim == 4 else x


def _layer_figures(x: torch.Tensor) -> dict[str, float]:
    x = x.detach().double()
    units = x.transpose(0, 1).reshape(x.shape[1], -1) if x.ndim == 4 else x.T
    dead = float((units.abs().amax(1) == 0).double().mean())
    p = _pooled(x)
    centred = p - p.mean(0)
    spread = float(centred.norm() / p.norm().clamp_min(1e-300))
    std = p.std(0, correction=0)
    keep = std > 1e-12
    rank = float(effective_rank(centred[:, keep] / std[keep])) if keep.any() else 0.0
    return {"dead": dead, "spread": spread, "rank": rank}


def _group(name: str, p: torch.Tensor, last: str) -> str:
    if name == last:
        return "proj_last_w"
    if name == last.replace("weight", "bias"):
        return "proj_last_b"
    if name.startswith("projector"):
        return "proj_norm" if p.ndim == 1 else "proj_hidden_w"
    if p.ndim == 1:
        return "backbone_norm"
    if name.startswith("backbone.stem"):
        return "stem"
    if name.startswith("backbone.layers."):
        stage = int(name.split(".")[2]) // 2
        return f"stage{stage}"
    return "other"


@torch.no_grad()
def probe(pt: Pretraining, x1: torch.Tensor, x2: torch.Tensor) -> dict:
    model, captured = pt.model, {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, n=n: captured.setdefault(n, [])
                                     .append(out))
             for n, m in _layers(model).items()]
    try:
        pairs = [model(a, b) for a, b in zip(x1.split(128), x2.split(128), strict=True)]
        f, g = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    finally:
        for h in hooks:
            h.remove()
    layers = {}
    for name, outs in captured.items():  # each call's first half is its first view's
        out = torch.cat([o[: o.shape[0] // 2] for o in outs])
        layers[name] = _layer_figures(out)
    eps, lambd = pt.cfg.loss.eps, pt.cfg.loss.lambd
    m = encoding_stats(f, g).moments()
    c = cross_correlation(m, eps)
    d = c.shape[0]
    on = float(((1 - torch.diagonal(c)) ** 2).sum())
    total = float(cco_from_correlation(c, lambd))
    var = torch.cat([m.mean_ff - m.mean_f ** 2, m.mean_gg - m.mean_g ** 2])
    q = torch.quantile(var, torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=var.dtype))
    figures = {k: float(v) for k, v in collapse_figures(m).items()}
    w = dict(model.named_parameters())[_last_weight(model)].detach().double()
    rows = w.norm(dim=1)
    sigma = torch.linalg.matrix_norm(w, ord=2)
    return {"on_diag": on, "off_diag": total - on, "probe_loss": total,
            "off_abs_mean": float((c.abs().sum() - torch.diagonal(c).abs().sum()) / (d * d - d)),
            "var_quantiles": [float(v) for v in q], "below_eps": float((var < eps).double()
                                                                       .mean()),
            **{f"probe_{k}": v for k, v in figures.items()},
            "layers": layers,
            "last_w": {"stable_rank": float(w.norm() ** 2 / sigma ** 2),
                       "row_norm": [float(rows.min()), float(rows.median()),
                                    float(rows.max())]}}


def _last_weight(model) -> str:
    names = [n for n, p in model.named_parameters() if n.startswith("projector") and p.ndim == 2]
    return names[-1]


def run_variant(cfg, rounds: int, every: int, train, test, batch: int, knn_every: int
                ) -> list[dict]:
    pt = Pretraining.of(cfg, train)
    ids = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:batch]
    x1, x2 = training_views(pt.images, pt.second, ids.to(pt.device),
                            derive_seed(cfg.train.seed, "collapse-probe"), PROBE_ROUND,
                            cfg.augment, cfg.augment_y, pt.dtype)
    last = _last_weight(pt.model)
    params = {n: p for n, p in pt.model.named_parameters() if p.requires_grad}
    records = [{"round": 0, **probe(pt, x1, x2)}]
    window: dict[str, list[float]] = {}
    losses, spectral = [], []
    for r in range(1, rounds + 1):
        before = {n: p.detach().clone() for n, p in params.items()}
        m = pt.step()
        losses.append(float(m.loss))
        moved: dict[str, list[float]] = {}
        for n, p in params.items():
            norm = float(before[n].norm())
            if norm > 0:
                moved.setdefault(_group(n, p, last), []).append(
                    float((p.detach() - before[n]).norm()) / norm)
        for k, v in moved.items():
            window.setdefault(k, []).append(sum(v) / len(v))
        w = params[last].detach().double()
        spectral.append(float(torch.linalg.matrix_norm(w - before[last].double(), ord=2)
                              / torch.linalg.matrix_norm(before[last].double(), ord=2)))
        if r % every == 0 or r == rounds:
            shared = getattr(pt, "shared", None)
            rec = {"round": r, "loss": sum(losses) / len(losses), "lr": m.lr,
                   **probe(pt, x1, x2),
                   "update": {k: sum(v) / len(v) for k, v in window.items()},
                   "last_w_spectral_update": sum(spectral) / len(spectral)}
            if knn_every and (r % knn_every == 0 or r == rounds):
                rec["knn"] = monitor_knn(pt, train, test)
            if shared is not None and "mean_fg" in shared:
                rec |= {f"sa_{k}": float(v) for k, v in
                        collapse_figures(shared).items()}
            records.append(rec)
            lay = rec["layers"]
            print(f"  round {r}: loss {rec['loss']:.4g} (on {rec['on_diag']:.0f}, off "
                  f"{rec['off_diag']:.0f}), below ε {rec['below_eps']:.2f}, C_ii "
                  f"{rec['probe_corr_diag']:.2f}, rank {rec['probe_eff_rank']:.1f}; features "
                  f"spread {lay['features']['spread']:.3f} rank {lay['features']['rank']:.1f}; "
                  f"update last {rec['update'].get('proj_last_w', math.nan):.3g} stage2 "
                  f"{rec['update'].get('stage2', math.nan):.3g} (σ₁ {rec['last_w_spectral_update']:.3g})"
                  + (f"; k-NN {rec['knn']:.3f}" if "knn" in rec else ""), flush=True)
            window, losses, spectral = {}, [], []
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path)
    src.add_argument("--grid", type=Path)
    ap.add_argument("--scale", default="gpu")
    ap.add_argument("--cell", default="non-iid-4-dcco-s0")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME:OVERRIDES")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--knn-every", type=int, default=0,
                    help="the run's standardised k-NN monitor every this many rounds (0: none)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results, configs, seconds = {}, {}, {}
    train = None
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        extra = [o.strip() for o in overrides.split(";") if o.strip()]
        sets = args.set + extra + ['train.compile="off"']
        cfg = (load_config(args.config, sets) if args.config
               else cell_config(args.grid, args.scale, args.cell, sets))
        if cfg.train.rounds < args.rounds:
            raise SystemExit(f"{name}: train.rounds = {cfg.train.rounds} < --rounds")
        if train is None:
            train, test = load_splits(cfg)
        print(f"[{name}] {' '.join(extra) or '(as it is)'}", flush=True)
        start = time.perf_counter()
        results[name] = run_variant(cfg, args.rounds, args.every, train, test, args.batch,
                                    args.knn_every)
        configs[name] = extra
        seconds[name] = time.perf_counter() - start
        print(f"  {seconds[name]:.0f} s", flush=True)
        _write(args, argv, results, configs, seconds)
    print(f"wrote {args.out}.json")
    return 0


def _write(args, argv, results, configs, seconds) -> None:
    command = "python experiments/collapse_mechanism.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(
        {"command": command, "variants": configs, "seconds": seconds,
         "threads": torch.get_num_threads(),
         "machine": {k: v for k, v in code_version().items() if k in ("cpu", "gpu", "torch", "commit")},
         "records": results}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
