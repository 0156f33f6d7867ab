"""``dcco demo``: the README's main job, all methods on non-IID Fashion-MNIST in about 5
minutes on 2 CPU cores.

Pretrains dcco, cco_fedavg, contrastive_fedavg and centralized_cco with the same budget
(rounds × images per round) on one-class clients (α = 0), evaluates each encoder with a linear
probe at 50 labels and at ``eval.labels`` (1,000), and compares them with supervised training
from scratch on the same labels, a randomly initialised encoder and the raw pixels. An
interrupted demo resumes: finished parts are kept, an interrupted pretraining continues from
its checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from dcco.config import RunConfig, load_config
from dcco.config.recipes import DEMO
from dcco.errors import UserError
from dcco.evaluate import StepCallback, is_current
from dcco.run.checkpoint import atomic_write_text
from dcco.run.collapse_response import pretraining_ended
from dcco.run.evaluations import (
    eval_key,
    evaluate_run,
    random_encoder_run,
    raw_pixels_run,
    supervised_run,
    with_method,
)
from dcco.run.report import (
    family,
    knn_cell,
    markdown_table,
    plot_accuracy_bars,
    plot_loss_curves,
    write_tables,
)
from dcco.run.rundir import RunDir
from dcco.run.setup import check_run, resolved
from dcco.run.splits import load_splits

METHODS = ("dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco")

DEMO_CONFIG = DEMO
"""The demo's recipe (``dcco.config.recipes.DEMO``; configs/demo_fmnist.toml as a file)."""


FLOORS = {"supervised": supervised_run, "random_init": random_encoder_run,
          "raw_pixels": raw_pixels_run}
"""The parts that pretrain nothing: supervised training from scratch on the labels, a
randomly initialised encoder's probe, and the raw pixels' probe."""
PARTS = (*METHODS, *FLOORS)
"""The demo folder's run directories, one per part."""
FEW_LABELS = 50
"""The demo's few-label probe, beside ``eval.labels``: the paper's claim over supervised
training is about few labels (docs/results/demo.md)."""


def label_counts(cfg: RunConfig) -> tuple[int, ...]:
    """The label counts the demo probes at: ``FEW_LABELS`` (at most ``eval.labels``) and
    ``eval.labels``."""
    return tuple(sorted({min(FEW_LABELS, cfg.eval.labels), cfg.eval.labels}))

FILES = ("results.md", "results.csv", "accuracy.png", "loss.png", "demo_config.json")
"""The demo folder's own files."""


def _protocol(part: str) -> str:
    """The evaluation a part records: supervised training, or the linear probe."""
    return "supervised" if part == "supervised" else "linear"


def check_demo_folder(out: Path) -> None:
    """Refuse an ``out`` that is not a demo folder: a run directory of its own (the demo would
    nest its runs inside it), a file, or a folder holding anything but a demo's parts."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"{out} is a file, not a folder for the demo; choose another --run-dir")
    if (out / "config.toml").is_file():
        raise UserError(f"{out} is a pretraining run directory, not a demo folder; give the "
                        f"demo a new --run-dir (or an interrupted demo's folder to resume it)")
    strangers = sorted(p.name for p in out.iterdir()
                       if p.name not in PARTS and p.name not in FILES and p.name != ".lock")
    if strangers:
        raise UserError(f"{out} holds {', '.join(strangers[:5])}, which are not part of a demo; "
                        f"give the demo a new --run-dir (or an interrupted demo's folder to "
                        f"resume it)")


def run_demo(out: Path, pretrain: Callable[..., dict], data_dir: Path | None = None,
             overrides: list[str] | None = None,
             say: Callable[[str], None] = lambda s: None,
             progress: StepCallback | None = None) -> str:
    """Run (or resume) the demo into ``out``; returns the results table as Markdown.

    Args:
        pretrain: ``pretrain(cfg, run, train, test, resume, checked) -> summary``, e.g.
            ``dcco.run.loop.run_pretraining`` wrapped with a progress bar by the CLI;
            ``checked`` is the run's ``CheckedRun``, made before any folder was created.
        progress: told how each evaluation advances.

    Raises:
        UserError: ``out`` is not a demo folder (``check_demo_folder``), or a config or data
            problem.
    """
    check_demo_folder(out)
    base = resolved(load_config(None, overrides, base=DEMO_CONFIG))
    if data_dir is not None:
        base = replace(base, data=replace(base.data, data_dir=str(data_dir)))
    train, test = load_splits(base)
    # every refusal before the first file or folder; each run takes its check as it is
    checked = {method: check_run(with_method(base, method), train, run_dir=out / method)
               for method in METHODS}
    out.mkdir(parents=True, exist_ok=True)
    splits = (train, test)
    say(f"Fashion-MNIST: {len(train)} training images, {len(test)} test images; clients of "
        f"{base.data.samples_per_client} images, α = {base.data.alpha}; "
        f"{base.train.clients_per_round} clients per round, {base.train.rounds} rounds")
    counts = label_counts(base)
    rows, runs = [], []
    for method in METHODS:
        cfg = with_method(base, method)
        run, existed = RunDir.open_or_create(out / method, cfg)
        summary = run.summary()
        if not pretraining_ended(summary, cfg.train.rounds):
            say(f"\n[{method}] pretraining" + (" (resuming)" if existed else ""))
            summary = pretrain(cfg, run, train, test, existed, checked[method])
        for labels in _missing(run, "linear", counts):
            say(f"[{method}] linear probe with {labels} labels")
            evaluate_run(run, "linear", labels, splits, progress)
        summary = run.summary()
        probes = ", ".join(f"{100 * summary['evaluations'][eval_key('linear', n)]['accuracy']:.1f}"
                           f"% at {n} labels" for n in counts)
        say(f"[{method}] final loss {summary['final_loss']:.4g}, "
            f"{summary.get('knn_monitor', 'k-NN')}: {100 * summary['knn']:.1f}%, linear probe "
            f"{probes}")
        rows.append((method, summary))
        runs.append(run)
    for name, fn in FLOORS.items():
        run, _ = RunDir.open_or_create(out / name, base)
        for labels in _missing(run, _protocol(name), counts):
            say(f"\n[{name}] " + {"supervised": "supervised training from scratch",
                                  "random_init": "linear probe of a randomly initialised "
                                                 "encoder",
                                  "raw_pixels": "linear probe of the raw pixels"}[name]
                + f", {labels} labels")
            fn(base, run, labels, splits, progress)
        rows.append((name, run.summary()))
    return _write_results(out, base, rows, runs)


def _missing(run: RunDir, protocol: str, counts: tuple[int, ...]) -> list[int]:
    """The label counts whose evaluation the run has not recorded at its current revision."""
    recorded = run.summary().get("evaluations", {})
    return [n for n in counts if eval_key(protocol, n) not in recorded
            or not is_current(recorded[eval_key(protocol, n)])]


def _write_results(out: Path, cfg: RunConfig, rows: list, runs: list[RunDir]) -> str:
    counts = label_counts(cfg)
    header = ["method", "pretraining", "final loss", "standardized k-NN (%)",
              *(f"test accuracy, {n} labels (%)" for n in counts)]
    table, labels, accs = [], [], []
    for name, s in rows:
        probes = [s["evaluations"][eval_key(_protocol(name), n)]["accuracy"] for n in counts]
        rounds = s.get("rounds")
        budget = (f"{rounds} round{'s' if rounds != 1 else ''}" if rounds else
                  {"random_init": "none (linear probe)",
                   "raw_pixels": "none (the pixels, linear probe)"}.get(name, "labels only"))
        loss = f"{s['final_loss']:.4g}" if s.get("final_loss") is not None else "—"
        knn = knn_cell(s)
        table.append([name, budget, loss, knn, *(f"{100 * a:.1f}" for a in probes)])
        labels.append(name)
        accs.append(probes[-1])
    write_tables(header, table, out / "results")
    plot_accuracy_bars(labels, accs, out / "accuracy.png",
                       f"Fashion-MNIST, α={cfg.data.alpha}, {cfg.data.samples_per_client} "
                       f"images/client: test accuracy with {cfg.eval.labels} labels\n(linear "
                       f"probe; supervised: trained from scratch on the labels)",
                       families=[family(name) for name in labels])
    plot_loss_curves(runs, out / "loss.png",
                     f"demo pretraining loss, {cfg.train.rounds} rounds of "
                     f"{cfg.train.clients_per_round} clients × {cfg.data.samples_per_client} "
                     f"images")
    atomic_write_text(out / "demo_config.json", json.dumps(asdict(cfg), indent=2) + "\n")
    return markdown_table(header, table)
