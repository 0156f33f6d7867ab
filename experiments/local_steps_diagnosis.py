"""Why several local steps do not pay in DCCO: clients' gradients are large and cancel.

Trains the local-steps grid's n = 16 cell (experiments/local_steps_fmnist.toml, scale small:
8 one-class clients of 16 a round, LARS lr 1.5, one local step) for ``--rounds`` rounds, then,
on the next round's clients, measures per parameter tensor:

- ``client_over_weight``: the clients' mean gradient norm over the tensor's norm (how far a
  raw SGD step of lr 1 would move it);
- ``pooled_over_client``: the norm of the round's pooled gradient (their sample-weighted
  average, the paper's round) over the clients' mean gradient norm: near 1 if clients agree,
  near 1/sqrt(K) for unrelated directions, below that where they cancel.

It then runs E = 4 local steps on all of each client's samples with the layer-wise optimiser
at several local lrs and reports the mean gradient's cosine with the one-step round's.

    python experiments/local_steps_diagnosis.py --out experiments/results/local_steps_diagnosis.json
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import replace
from pathlib import Path

import torch
from grid_cells import cell_config

from dcco.core.client import client_update, trainable_parameters
from dcco.core.simulator import run_round
from dcco.run.planning import plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import code_version, cpu_name
from dcco.run.splits import load_splits

GRID = Path(__file__).resolve().parent / "local_steps_fmnist.toml"


def flat(values) -> torch.Tensor:
    return torch.cat([v.flatten() for v in values])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = cell_config(GRID, "small", "non-iid-16-dcco-s0", args.data_dir)
    train, _ = load_splits(cfg)
    torch.manual_seed(0)
    pt = Pretraining.of(cfg, train)
    for _ in range(args.rounds):
        pt.step()
    plan = plan_round(pt.cfg, pt.partition, args.rounds)
    x1, x2 = pt.views(plan, args.rounds)
    one = run_round(pt.model, pt.algorithm, x1, x2, plan.segments, "reference")
    sizes = plan.segments.counts.tolist()
    named = trainable_parameters(pt.model)
    clients = [client_update(pt.model, pt.algorithm.method, a, b, one.shared, 1.0).delta
               for a, b in zip(x1.split(sizes), x2.split(sizes), strict=True)]
    tensors = []
    for name, p in named:
        client_norm = sum(float(c[name].norm()) for c in clients) / len(clients)
        pooled = float(one.pseudo_gradient[name].norm())
        if client_norm > 0 and float(p.norm()) > 0:
            tensors.append({"tensor": name, "client_over_weight": client_norm / float(p.norm()),
                            "pooled_over_client": pooled / client_norm})
    tensors.sort(key=lambda t: -t["client_over_weight"])
    whole_pooled = float(flat(one.pseudo_gradient.values()).norm())
    whole_client = sum(float(flat(c.values()).norm()) for c in clients) / len(clients)
    base = replace(pt.algorithm, local_steps=4, local_optimizer="layerwise",
                   pseudo_gradient="mean_gradient", local_statistics="own")
    reference = flat(one.pseudo_gradient.values())
    cosines = {}
    for lr in (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7):
        r = run_round(pt.model, replace(base, local_lr=lr), x1, x2, plan.segments, "reference")
        cosines[f"{lr:g}"] = float(torch.nn.functional.cosine_similarity(
            flat(r.pseudo_gradient.values()), reference, dim=0))
        print(f"E = 4, layer-wise, local lr {lr:g}: cosine with the one-step round "
              f"{cosines[f'{lr:g}']:.3f}", flush=True)
    record = {"command": f"python experiments/local_steps_diagnosis.py --rounds {args.rounds} "
                         f"--out {args.out}",
              "machine": f"{cpu_name()}, {platform.system()}", "code": code_version(),
              "cell": f"local_steps_fmnist.toml small non-iid-16-dcco-s0 after {args.rounds} "
                      "rounds", "clients": len(clients),
              "whole_model": {"pooled_over_client": whole_pooled / whole_client},
              "tensors": tensors, "layerwise_e4_cosine": cosines}
    print(f"whole model: pooled gradient / clients' mean gradient norm "
          f"{whole_pooled / whole_client:.3f} (K = {len(clients)}: unrelated directions "
          f"would give {len(clients) ** -0.5:.3f})")
    for t in tensors[:5]:
        print(f"  {t['tensor']}: client gradient / weight {t['client_over_weight']:.3g}, "
              f"pooled / client {t['pooled_over_client']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {args.out}")


if __name__ == "__main__":
    main()
