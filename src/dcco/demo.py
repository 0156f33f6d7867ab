"""``dcco demo``: the README's main job, all methods on non-IID Fashion-MNIST in ~10 minutes.

Pretrains dcco, cco_fedavg, contrastive_fedavg and centralized_cco with the same budget
(rounds × images per round) on one-class clients (α = 0), evaluates each encoder with a linear
probe, and compares them with supervised training from scratch on the same labels and with a
randomly initialised encoder. An interrupted demo resumes: finished parts are kept, an
interrupted pretraining continues from its checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from dcco.augment import AugmentConfig
from dcco.checkpoint import atomic_write_text
from dcco.config import DataConfig, RunConfig, TrainConfig, load_config
from dcco.evaluate import EvalConfig, is_current
from dcco.experiments import (
    eval_key,
    evaluate_run,
    load_splits,
    random_encoder_run,
    supervised_run,
    with_method,
)
from dcco.models import ModelConfig
from dcco.optim import OptimConfig
from dcco.report import markdown_table, plot_accuracy_bars, plot_loss_curves, write_tables
from dcco.rundir import RunDir

METHODS = ("dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco")

DEMO_CONFIG = RunConfig(
    data=DataConfig(dataset="fashion_mnist", alpha=0.0, samples_per_client=4),
    model=ModelConfig(arch="resnet14", widths=(16, 32, 64), projector=(128, 128, 128)),
    augment=AugmentConfig(crop_scale=(0.25, 1.0)),
    train=TrainConfig(method="dcco", rounds=200, clients_per_round=32, log_every=10,
                      checkpoint_every=50, knn_every=100),
    optim=OptimConfig(name="lars", lr=1.5, weight_decay=1e-6, warmup_steps=10),
    eval=EvalConfig(labels=1000, probe_steps=300, probe_batch=256, scratch_epochs=30,
                    knn_bank=5000, knn_queries=1000),
)
"""A budget for 2 CPU cores; see README for what it shows."""


def run_demo(out: Path, pretrain: Callable[..., dict], data_dir: Path | None = None,
             overrides: list[str] | None = None,
             say: Callable[[str], None] = lambda s: None) -> str:
    """Run (or resume) the demo into ``out``; returns the results table as Markdown.

    Args:
        pretrain: ``pretrain(cfg, run, train, test, resume) -> summary``, e.g.
            ``dcco.train.run_pretraining`` wrapped with a progress bar by the CLI.
    """
    base = load_config(None, overrides, base=DEMO_CONFIG)
    if data_dir is not None:
        base = load_config(None, [f'data.data_dir="{data_dir}"'], base=base)
    out.mkdir(parents=True, exist_ok=True)
    train, test = load_splits(base)
    splits = (train, test)
    say(f"Fashion-MNIST: {len(train)} training images, {len(test)} test images; clients of "
        f"{base.data.samples_per_client} images, α = {base.data.alpha}; "
        f"{base.train.clients_per_round} clients per round, {base.train.rounds} rounds")
    key = eval_key("linear", base.eval.labels)
    rows, runs = [], []
    for method in METHODS:
        cfg = with_method(base, method)
        run, existed = RunDir.open_or_create(out / method, cfg)
        summary = run.summary()
        if summary.get("rounds") != cfg.train.rounds:
            say(f"\n[{method}] pretraining" + (" (resuming)" if existed else ""))
            summary = pretrain(cfg, run, train, test, existed)
        recorded = summary.get("evaluations", {})
        if key not in recorded or not is_current(recorded[key]):
            say(f"[{method}] linear probe with {cfg.eval.labels} labels")
            evaluate_run(run, "linear", None, splits)
            summary = run.summary()
        acc = summary["evaluations"][key]["accuracy"]
        say(f"[{method}] final loss {summary['final_loss']:.4g}, k-NN "
            f"{100 * summary['knn']:.1f}%, linear probe {100 * acc:.1f}%")
        rows.append((method, summary))
        runs.append(run)
    for name, fn in (("supervised", supervised_run), ("random_init", random_encoder_run)):
        run, _ = RunDir.open_or_create(out / name, base)
        recorded = run.summary().get("evaluations", {})
        if not recorded or not all(is_current(e) for e in recorded.values()):
            say(f"\n[{name}] " + ("supervised training from scratch" if name == "supervised"
                                  else "linear probe of a randomly initialised encoder"))
            fn(base, run, None, splits)
        rows.append((name, run.summary()))
    return _write_results(out, base, rows, runs)


def _write_results(out: Path, cfg: RunConfig, rows: list, runs: list[RunDir]) -> str:
    header = ["method", "pretraining", "final loss", "k-NN (%)",
              f"test accuracy, {cfg.eval.labels} labels (%)"]
    table, labels, accs = [], [], []
    for name, s in rows:
        (evaluation,) = s["evaluations"].values()
        acc = evaluation["accuracy"]
        budget = (f"{s['rounds']} rounds" if s.get("rounds") else
                  "none (linear probe)" if name == "random_init" else "labels only")
        loss = f"{s['final_loss']:.4g}" if s.get("final_loss") is not None else "—"
        knn = f"{100 * s['knn']:.1f}" if s.get("knn") is not None else "—"
        table.append([name, budget, loss, knn, f"{100 * acc:.1f}"])
        labels.append(name)
        accs.append(acc)
    write_tables(header, table, out / "results")
    plot_accuracy_bars(labels, accs, out / "accuracy.png",
                       f"Fashion-MNIST, α={cfg.data.alpha}, {cfg.data.samples_per_client} "
                       f"images/client, linear probe ({cfg.eval.labels} labels)")
    plot_loss_curves(runs, out / "loss.png")
    atomic_write_text(out / "demo_config.json", json.dumps(asdict(cfg), indent=2) + "\n")
    return markdown_table(header, table)
