"""Where a DCCO run's encodings sit against the loss's ε (issue 80, item 9;
docs/results/collapse.md): the spread of the per-dimension variances of S_A, round by round, as multiples
of ε, with the standardised spread the loss sees, √(v / (v + ε)).

    python experiments/eps_regime.py --rounds 300 --every 20 \
        --out experiments/results/eps_regime.json

The run is DCCO's recipe of experiments/fair_fmnist.toml (r1 of its tuning rule: ResNet14
16/32/64 with group norm, projector 128^3, LARS 1.5, non-IID 4). It answers whether a
dimension whose variance is under ε is one the loss "reads as a constant" (spread near 0)
or one it still reads at a good part of its size (spread 0.3 to 0.7).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dcco.reproduce import load_grid, plan_cells
from dcco.run.pretraining import Pretraining
from dcco.run.splits import load_splits

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def variances(pt: Pretraining) -> torch.Tensor:
    """The per-dimension variances of F and G, (2d,): in the last round's S_A for a method
    that shares statistics; else of the collapse watch's fixed probe batch, encoded as
    ``Pretraining.probe_figures`` encodes it."""
    from dcco.core.seeding import derive_seed, generator
    from dcco.core.stats import encoding_stats
    from dcco.run.pretraining import PROBE_SAMPLES, buffers_kept

    m = pt.shared
    if m is None:
        pool = pt.partition.indices
        gen = generator(pt.cfg.train.seed, "collapse-probe")
        ids = pool[torch.randperm(pool.shape[0], generator=gen)[:PROBE_SAMPLES]]
        x1, x2 = pt._views(ids, derive_seed(pt.cfg.train.seed, "collapse-probe"), 0)
        with torch.no_grad(), buffers_kept(pt.model):
            f, g = pt.model(x1, x2)
        m = encoding_stats(f.double(), g.double()).moments()
    return torch.cat([m.mean_ff - m.mean_f ** 2, m.mean_gg - m.mean_g ** 2])


def reading(pt: Pretraining, round_done: int, eps: float) -> dict:
    v = variances(pt).double()
    q = torch.quantile(v / eps, torch.tensor(QUANTILES, dtype=torch.float64))
    spread = (v / (v + eps)).sqrt()
    return {"round": round_done,
            "var_over_eps": dict(zip(map(str, QUANTILES), q.tolist(), strict=True)),
            "under_eps": float((v <= eps).double().mean()),
            "under_eps_100": float((v <= eps / 100).double().mean()),
            "median_spread": float(spread.median()),
            "figures": pt.collapse(probe=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--config", type=Path, default=None,
                        help="a run config instead of the tuning grid's DCCO r1 (e.g. "
                             "configs/demo_fmnist.toml)")
    parser.add_argument("--method", default=None, help="with --config: train.method")
    args = parser.parse_args()
    if args.config is not None:
        from dcco.config import load_config
        from dcco.run.setup import resolved

        cfg = resolved(load_config(args.config, [f"train.method={args.method}"]
                                   if args.method else []))
        name = f"{args.config.name} {cfg.train.method}"
    else:
        grid = load_grid(Path(__file__).parent / "fair_fmnist.toml", "tune")
        cell = next(c for c in plan_cells(grid, Path("unused")) if c.path.name.startswith(
            "non-iid-4-dcco-r1"))
        cfg, name = cell.cfg, cell.path.name
    pt = Pretraining.of(cfg, load_splits(cfg)[0], rounds_to_run=args.rounds)
    eps = pt.method.variance_eps()
    readings = []
    for r in range(1, args.rounds + 1):
        pt.step()
        if r % args.every == 0:
            readings.append(reading(pt, r, eps))
            x = readings[-1]
            print(f"round {r}: var/eps quantiles " + ", ".join(
                f"{k} {v:.3g}" for k, v in x["var_over_eps"].items())
                + f"; under eps {x['under_eps']:.0%}, under eps/100 "
                f"{x['under_eps_100']:.0%}; median spread {x['median_spread']:.2f}; "
                f"dead_dims {x['figures']['dead_dims']:.2f} C_ii "
                f"{x['figures']['corr_diag']:.2f}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"run": name, "eps": eps,
                                        "readings": readings}, indent=1) + "\n")


if __name__ == "__main__":
    main()
