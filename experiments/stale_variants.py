"""Stale statistics under the small recipe's LARS: every variant tried, round by round.

Runs DCCO with one exchange per round (train.staleness = 1) at the Table 1 grid's small scale
(experiments/stale_fmnist.toml, scale small-stale: LARS lr 1.5), seed 0, at non-IID 1 and
non-IID 4, once per variant:

- ``anchored``: the paper's anchored loss at the previous round's aggregate (the baseline);
- ``own``: train.stale_statistics = "own", the client's own statistics fresh in the mix;
- ``ema``: train.aggregate_decay = 0.9, a moving average of the aggregates;
- ``own-ema``: both;
- ``head``: the server drops, from every stale round's pseudo-gradient, the directions the
  fresh loss is blind to at the last projector layer (its bias, and each output row's
  radial component: per-dimension shift and scale; the fresh gradient there is exactly 0);
- ``head-1d-adapted``: ``head`` with LARS's trust ratio on the 1-D parameters too;
- ``unit``: encodings normalised to the unit sphere before the statistics;
- ``pipelined``: the statistics of the round's own clients at the previous round's model
  (as if each round's clients had sent their statistics one round ahead, with the previous
  round's single exchange): one round of lag and no sampling difference;
- ``pipelined-warmup``: ``pipelined`` after 50 fresh rounds.

``head``, ``unit`` and ``pipelined`` are probes, patched in here (no setting ships them).
Each run records every round's loss and the largest 1-D parameter norm, and stops at the
first non-finite loss (diverged), after 20 rounds in a row at the collapsed loss d = 128 (no
correlation left: collapsed), or after 20 rounds in a row above twice its first loss (blown
up); a run that ends with a finite model gets the 5,000-label linear probe.

    python experiments/stale_variants.py --out experiments/results/stale_variants.json

With ``--gradient-error R`` it measures instead why: a fresh run (LARS, non-IID 4) for R
rounds, then on round R's clients the pooled gradient with fresh statistics against the one
with stale statistics of three kinds: the previous round's aggregate (other clients, the
previous model: what a stale round uses), other clients' statistics at the current model
(sampling alone), and the current clients' statistics at the previous model (lag alone),
each with the anchored loss and the own-statistics mix; also how far the clients' gradients
cancel in the fresh round (the pooled gradient's norm over the clients' mean norm).

    python experiments/stale_variants.py --gradient-error 50 \
        --out experiments/results/stale_gradient_error.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch
from grid_cells import cell_config

from dcco.core.algorithm import Algorithm
from dcco.core.client import client_update
from dcco.core.simulator import run_round
from dcco.run.evaluations import evaluate_model
from dcco.run.planning import plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import code_version, cpu_name
from dcco.run.splits import load_splits

GRID = Path(__file__).resolve().parent / "stale_fmnist.toml"
SETTINGS = {"non-iid-1": "non-iid-4-dcco-s0", "non-iid-4": "non-iid-4-dcco-s0"}
VARIANTS = {
    "anchored": {},
    "own": {"stale_statistics": "own"},
    "ema": {"aggregate_decay": 0.9},
    "own-ema": {"stale_statistics": "own", "aggregate_decay": 0.9},
    "head": {},
    "head-1d-adapted": {},
    "unit": {},
    "pipelined": {},
    "pipelined-warmup": {},
}
WARMUP = 50  # pipelined-warmup: fresh statistics for these rounds first
STUCK_ROUNDS = 20
COLLAPSED_LOSS = 128.0  # d: every correlation 0


def without_head_shift_scale(pt: Pretraining, pseudo: dict) -> dict:
    """The pseudo-gradient without the last projector layer's bias and the radial component
    of each of its output rows (the fresh loss's gradient is exactly 0 along both)."""
    layer = pt.model.projector[-1]
    name = next(n for n, m in pt.model.named_modules() if m is layer)
    out = dict(pseudo)
    out[f"{name}.bias"] = torch.zeros_like(pseudo[f"{name}.bias"])
    w, g = layer.weight.detach(), pseudo[f"{name}.weight"]
    out[f"{name}.weight"] = g - ((g * w).sum(1, keepdim=True) / (w * w).sum(1, keepdim=True)) * w
    return out


def run(cfg, train, test, variant: str, rounds: int) -> dict:
    pt = Pretraining.of(cfg, train)
    if variant == "unit":
        pt.model.unit_encodings = True
    if variant == "head-1d-adapted":
        for group in pt.optimizer.param_groups:
            group["exclude"] = False
    if variant.startswith("head"):
        apply = pt.apply

        def projected(result, lr, start):
            if result.exchanges == 1:
                result = replace(result,
                                 pseudo_gradient=without_head_shift_scale(pt, result.pseudo_gradient))
            return apply(result, lr, start)

        pt.apply = projected
    pipelined = variant.startswith("pipelined")
    if pipelined:
        previous_model = copy.deepcopy(pt.model)  # θ_{r-1}

        def own_clients_before(r):
            if r == 0 or (variant == "pipelined-warmup" and r < WARMUP):
                return None
            plan = plan_round(pt.cfg, pt.partition, r)
            x1, x2 = pt.views(plan, r)
            return run_round(previous_model, Algorithm(pt.algorithm.method), x1, x2,
                             plan.segments.to(pt.device), "reference").shared

        pt.previous = own_clients_before
    rows, end, stuck, last, began = [], "ran", 0, None, time.perf_counter()
    for _ in range(rounds):
        before = copy.deepcopy(pt.model.state_dict()) if pipelined else None
        m = pt.step()
        if before is not None:
            previous_model.load_state_dict(before)
        loss = float(m.loss)
        norm, name = max((float(p.detach().norm()), n) for n, p in pt.model.named_parameters()
                         if p.ndim <= 1)
        rows.append([m.round, loss, norm, name])
        if not math.isfinite(loss) or not math.isfinite(norm):
            end = "diverged"
            break
        first = rows[0][1]
        state = ("collapsed" if abs(loss - COLLAPSED_LOSS) < 0.01 else
                 "blown up" if loss > 2 * first else None)
        stuck = stuck + 1 if state is not None and state == last else int(state is not None)
        last = state
        if stuck >= STUCK_ROUNDS:
            end = state
            break
        if m.round % 25 == 0:
            print(f"  {variant} round {m.round}: loss {loss:.2f}, largest 1-D norm {norm:.3g} "
                  f"({name})", flush=True)
    record = {"variant": variant, "end": end, "rounds": len(rows),
              "seconds": round(time.perf_counter() - began, 1),
              "curve": rows, "linear@5000": None}
    if end != "diverged":
        pt.model.unit_encodings = False
        record["linear@5000"] = evaluate_model(pt.model, "linear", cfg.eval, cfg.train.seed,
                                               train, test, pt.device).accuracy
    print(f"{variant}: {end} after {len(rows)} rounds, linear@5000 "
          f"{record['linear@5000']}", flush=True)
    return record


def _flat(grads: dict) -> torch.Tensor:
    return torch.cat([v.flatten() for v in grads.values()])


def gradient_error(cfg, train, rounds: int) -> dict:
    """The pooled gradient of round ``rounds`` with stale statistics against fresh ones."""
    cfg = replace(cfg, train=replace(cfg.train, staleness=1, stale_after=10 ** 9))
    torch.manual_seed(0)
    pt = Pretraining.of(cfg, train)  # fresh rounds that also keep each round's aggregate
    for _ in range(rounds - 1):
        pt.step()
    before = {k: v.detach().clone() for k, v in pt.model.state_dict().items()}
    last_plan = plan_round(pt.cfg, pt.partition, rounds - 1)
    last_views = pt.views(last_plan, rounds - 1)
    pt.step()
    stale = pt.aggregate  # round rounds-1's clients at the model before its update
    plan = plan_round(pt.cfg, pt.partition, rounds)
    x1, x2 = pt.views(plan, rounds)
    segments = plan.segments.to(pt.device)
    method = pt.algorithm.method
    fresh = run_round(pt.model, Algorithm(method), x1, x2, segments, "reference")
    now = run_round(pt.model, Algorithm(method), *last_views, last_plan.segments,
                    "reference").shared  # other clients, current model: sampling alone
    current = pt.model.state_dict()
    pt.model.load_state_dict(before)
    lagged = run_round(pt.model, Algorithm(method), x1, x2, segments,
                       "reference").shared  # these clients, previous model: lag alone
    pt.model.load_state_dict(current)
    reference = _flat(fresh.pseudo_gradient)
    sizes = segments.counts.tolist()
    clients = [_flat(client_update(pt.model, method, a, b, fresh.shared, 1.0).delta)
               for a, b in zip(x1.split(sizes), x2.split(sizes), strict=True)]
    out = {"round": rounds, "clients": len(clients),
           "pooled_over_client_norm": float(reference.norm()) / (
               sum(float(c.norm()) for c in clients) / len(clients)),
           "errors": {}}
    for kind, shared in (("previous aggregate", stale), ("sampling alone", now),
                         ("lag alone", lagged)):
        for mix in ("anchored", "own"):
            alg = Algorithm(method, staleness=1, stale_statistics=mix)
            got = _flat(run_round(pt.model, alg, x1, x2, segments, "reference",
                                  previous=shared).pseudo_gradient)
            err = float((got - reference).norm() / reference.norm())
            cos = float(torch.nn.functional.cosine_similarity(got, reference, dim=0))
            out["errors"][f"{kind}, {mix}"] = {"relative_error": err, "cosine": cos}
            print(f"  {kind}, {mix}: |g - g_fresh| / |g_fresh| = {err:.3g}, cosine {cos:.3f}",
                  flush=True)
    print(f"  fresh round: pooled gradient / clients' mean gradient norm "
          f"{out['pooled_over_client_norm']:.4f} (K = {len(clients)})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--gradient-error", type=int, metavar="R",
                    help="measure the stale gradient's error after R fresh rounds instead")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    record = json.loads(args.out.read_text()) if args.out.exists() else {}
    record |= {"command": "python experiments/stale_variants.py --out " + str(args.out),
               "machine": f"{cpu_name()}, {platform.system()}", "code": code_version(),
               "grid": "experiments/stale_fmnist.toml scale small-stale, seed 0"}
    for setting in args.settings:
        cfg = cell_config(GRID, "small-stale", SETTINGS[setting], args.data_dir)
        if setting == "non-iid-1":  # 128 one-sample clients a round
            cfg = replace(cfg, data=replace(cfg.data, samples_per_client=1),
                          train=replace(cfg.train, clients_per_round=128))
        train, test = load_splits(cfg)
        if args.gradient_error:
            print(f"{setting}: gradient error after {args.gradient_error} fresh rounds")
            record.setdefault("gradient_error", {})[setting] = gradient_error(
                cfg, train, args.gradient_error)
            record["command"] = (f"python experiments/stale_variants.py --gradient-error "
                                 f"{args.gradient_error} --out {args.out}")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=1) + "\n")
            continue
        for variant in args.variants:
            print(f"{setting} {variant}", flush=True)
            torch.manual_seed(0)
            run_cfg = replace(cfg, train=replace(cfg.train, **VARIANTS[variant]))
            record.setdefault(setting, {})[variant] = run(run_cfg, train, test, variant,
                                                          args.rounds)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {args.out}")


if __name__ == "__main__":
    main()
