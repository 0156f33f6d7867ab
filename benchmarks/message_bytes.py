"""Bytes a Flower round sends, measured from the messages, per method, with and without
SecAgg+; and what DCCO's statistics cost against the model at d = 128 and d = 1024.

Runs one round of each federated method through the real ServerApp logic and ClientApp (mods
included, so SecAgg+ runs for real) over ``dcco.flower.testing.inprocess.InProcessGrid``, whose
messages are the ones a deployment sends; ``MeteredGrid`` counts each message's content as
Flower serialises it (protobuf; transport framing aside). Config: the FMNIST small network
(widths 16/32/64, projector 128³, d = 128), K = 16 clients of 4 samples, 3 nodes.

Then, from the formula the tests check against these measurements
(``Algorithm.message_bytes``: model down, update up, statistics in float64), the cost of
⟨F Gᵀ⟩ against the model update at the paper's d = 1024 on its ResNet14, and at d = 128.

    python benchmarks/message_bytes.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dcco.config import ModelConfig, load_config
from dcco.core.algorithm import Algorithm
from dcco.core.client_state import kept_by_clients
from dcco.data.datasets import load_dataset
from dcco.flower.app.client_app import app as client_app
from dcco.flower.app.federation import Federation
from dcco.flower.app.nodes import node_data
from dcco.flower.appconfig import FlowerConfig, run_config_entries
from dcco.flower.testing.inprocess import InProcessGrid
from dcco.methods import build_method
from dcco.models import build_dual_encoder
from dcco.run.pretraining import Pretraining

METHODS = ["dcco", "dvicreg", "cco_fedavg", "contrastive_fedavg", "vicreg_fedavg", "byol_fedavg",
           "simsiam_fedavg", "moco_fedavg", "fedu", "fedema"]
NODES = 3


def measure(method: str, secure: bool, overrides: list[str]) -> dict:
    """One round's traffic (``MeteredGrid.take``) and the formula's per-client payload."""
    cfg = load_config(None, [f'train.method="{method}"', "model.widths=[16, 32, 64]",
                             "model.projector=[128, 128, 128]", "data.samples_per_client=4",
                             "train.clients_per_round=16", 'train.device="cpu"', *overrides])
    fcfg = FlowerConfig(min_nodes=NODES, secagg=secure)
    train = load_dataset(cfg.data.dataset, "train", cfg.data.data_dir)
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": NODES}
                                      for i in range(NODES)], run_config_entries(cfg, fcfg))
    pt = Pretraining.of(cfg, train, holds_client_states=False)  # as a Flower server
    fed = Federation(grid, pt, fcfg)
    fed.wait_for_nodes()
    agg = fed.collect()
    node_data.cache_clear()
    model_bytes = sum(p.numel() * p.element_size() for _, p in pt.params)
    kept = kept_by_clients(pt.model, pt.method)  # a stateful method's clients' own target
    state = sum(v.numel() * v.element_size() for k, v in pt.model.state_dict().items()
                if k not in kept) - model_bytes  # BYOL's target network, running statistics
    d = pt.model.projection_dim
    return {"method": method, "secagg": secure, "nodes": agg.traffic["nodes"],
            "clients": agg.clients, "exchanges": agg.result.exchanges if agg.result else None,
            "measured": agg.traffic, "model_bytes": model_bytes,
            "formula_per_client": pt.algorithm.message_bytes(d, d, model_bytes,
                                                             state_bytes=state)}


def statistics_cost() -> list[dict]:
    """⟨F Gᵀ⟩ and the rest of DCCO's statistics against the model update, by the formula."""
    rows = []
    for widths, d in (((64, 128, 256), 1024), ((64, 128, 256), 128), ((16, 32, 64), 128)):
        net = build_dual_encoder(ModelConfig(widths=widths), 1, (d, d, d), seed=0)
        model = sum(p.numel() * 4 for p in net.parameters())  # float32 weights
        dcco = Algorithm(build_method("dcco"))
        stats = dcco.method.stats.num_values(d, d) * 8
        rows.append({"widths": list(widths), "d": d, "model_bytes": model,
                     "stats_bytes": stats, "fg_bytes": d * d * 8,
                     "stats_over_model": stats / model})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="config overrides (e.g. data.data_dir)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    rows = [measure(m, s, args.set) for m in args.methods for s in (False, True)]
    lines = [("| method | SecAgg+ | exchanges | up per node | down per node | formula up per "
              "client | formula down per client |"), "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, f = r["measured"], r["formula_per_client"]
        lines.append(f"| {r['method']} | {'yes' if r['secagg'] else 'no'} | {r['exchanges']} | "
                     f"{t['per_node_up'] / 2**20:.2f} MiB | {t['per_node_down'] / 2**20:.2f} MiB"
                     f" | {f['up'] / 2**20:.2f} MiB | {f['down'] / 2**20:.2f} MiB |")
    cost = statistics_cost()
    lines += ["", ("| network | d | model (float32) | DCCO statistics (float64) | of which "
                   "⟨F Gᵀ⟩ | statistics / model |"), "|---|---:|---:|---:|---:|---:|"]
    for c in cost:
        lines.append(f"| ResNet14 {tuple(c['widths'])} | {c['d']} | "
                     f"{c['model_bytes'] / 2**20:.2f} MiB | {c['stats_bytes'] / 2**20:.2f} MiB | "
                     f"{c['fg_bytes'] / 2**20:.2f} MiB | {c['stats_over_model']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"command": "python benchmarks/message_bytes.py " + " ".join(sys.argv[1:]),
                  "nodes": NODES, "rows": rows, "statistics_cost": cost}
        (args.out / "message_bytes.json").write_text(json.dumps(record, indent=2) + "\n")
        (args.out / "message_bytes.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
