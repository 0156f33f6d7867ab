"""The ``dcco`` command line: pretrain, evaluate, supervised, compare, demo, reproduce.

The only module that parses arguments and prints. Errors in user input (``UserError``: config
keys, data files, run directories, arguments) end with a one-line message naming the problem
and exit status 2; a run whose loss or weights turn non-finite ends with one line saying so
and exit status 3; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from typing_extensions import Self

from dcco import __version__
from dcco.errors import UserError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="run config, a TOML file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.rounds=200 "
                        "--set model.widths=[16,32,64]; repeatable")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="where to write the run (default: runs/<config>-<method>-<time>)")
    _add_data_dir(p)


def _add_tensorboard(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard scalars into each run directory "
                        "(sets train.tensorboard; needs pip install 'dcco[tensorboard]')")


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="the folder of the data set's files (sets data.data_dir); it is then "
                        "the only place searched. Default: the config's data.data_dir, else "
                        "$DCCO_DATA, ~/.cache/dcco and /usr/share/datasets/fashion-mnist")


def _with_data_dir(overrides: list[str], data_dir: Path | None,
                   tensorboard: bool = False) -> list[str]:
    """``overrides`` plus ``data.data_dir`` when ``--data-dir`` was given, and
    ``train.tensorboard`` with ``--tensorboard``."""
    from dcco.config import to_toml_value

    extra = [] if data_dir is None else [f"data.data_dir={to_toml_value(str(data_dir))}"]
    return [*overrides, *extra, *(["train.tensorboard=true"] if tensorboard else [])]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dcco",
        description="Federated training of dual encoders on small non-IID clients: DCCO "
                    "(Vemulapalli et al., ICLR 2023) and its baselines.",
    )
    parser.add_argument("--version", action="version", version=f"dcco {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pretrain", help="pretrain an encoder with a federated or centralized method",
                       description="Pretrain a dual encoder. Writes config, metrics, atomic "
                                   "checkpoints, a summary and plots into a run directory.")
    p.add_argument("config", type=Path, nargs="?", help="run config, a TOML file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.rounds=200; repeatable")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="where to write the run (default: runs/<config>-<method>-<time>)")
    _add_data_dir(p)
    _add_tensorboard(p)
    p.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                   help="continue an interrupted run from its last checkpoint (bit-identical on CPU)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress output (by default: a live bar on a terminal, a plain "
                        "line every 10%% or 30 s in a log)")

    p = sub.add_parser("config", help="print every setting: its key, type, default and doc",
                       description="Print the reference of every config setting (section, "
                                   "key, type, default, one line of doc), generated from the "
                                   "code; docs/config.md is its Markdown.")
    p.add_argument("--list", action="store_true", required=True,
                   help="list every setting (the only action)")
    p.add_argument("--markdown", action="store_true",
                   help="as Markdown tables (docs/config.md) instead of one line a key")

    p = sub.add_parser("evaluate", help="evaluate a pretrained run: linear probe, finetuning, "
                                        "k-NN, retrieval or the case protocols",
                       description="Evaluate the encoder of a run directory on its data set's "
                                   "test split; the projector is discarded. The result is added "
                                   "to the run's summary.json.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--protocol", choices=["linear", "finetune", "linear_y", "retrieval", "knn",
                                          "case_linear", "case_finetune"],
                   default="linear",
                   help="linear: frozen encoder + LARS linear classifier; finetune: whole "
                        "network with Adam; knn: the pretraining monitor (weighted k-NN in the "
                        "space of eval.knn_features); for paired data, linear_y: the linear "
                        "probe of the second tower, retrieval: cross-modal recall@1 and @5; "
                        "for data in natural clients, case_linear and case_finetune: each "
                        "case's images pooled, scored per case (default: linear)")
    p.add_argument("--labels", type=int, default=None,
                   help="labelled training samples, class-balanced (default: eval.labels of "
                        "the run's config; 500 uses the paper's 500-label probe settings); for "
                        "retrieval, the test pairs in the gallery; for knn, the bank's "
                        "training images (seeded, not class-balanced); for the case "
                        "protocols, labelled cases")
    _add_data_dir(p)
    p.add_argument("--no-progress", action="store_true", help="no progress output")

    p = sub.add_parser("supervised", help="supervised training from scratch on the labelled subset",
                       description="Train the same encoder architecture from scratch on the "
                                   "labelled subset (the paper's supervised baseline).")
    _add_config_args(p)
    p.add_argument("--labels", type=int, default=None, help="labelled training samples")
    p.add_argument("--no-progress", action="store_true", help="no progress output")

    p = sub.add_parser("compare", help="one table across runs (Markdown and CSV)",
                       description="Print one table across run directories and write it as "
                                   "Markdown and CSV, with a bar chart per evaluation.")
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=None, metavar="PREFIX",
                   help="output prefix: writes PREFIX.md, PREFIX.csv and PREFIX-<evaluation>.png "
                        "(default: comparison-<time>)")
    p.add_argument("--force", action="store_true",
                   help="overwrite the output files if they exist (refused otherwise)")
    p.add_argument("--tensorboard", action="store_true",
                   help="also print the command that shows these runs in TensorBoard")

    p = sub.add_parser("export", help="write a run's trained encoder for use elsewhere",
                       description="Write the trained dual encoder of a run directory as "
                                   "FILE.safetensors and its architecture as FILE.json; "
                                   "dcco.load_encoder(FILE.safetensors) reads them back "
                                   "without the run directory.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="where to write (.safetensors is added if missing; never overwrites)")

    p = sub.add_parser("reproduce", help="run a declarative experiment grid (paper Table 1)",
                       description="Run every cell of a grid file, skipping finished cells "
                                   "and resuming interrupted ones, then write the results table "
                                   "(mean ± std over seeds) and a plot.")
    p.add_argument("grid", type=Path, help="grid file, e.g. experiments/table1_fmnist.toml")
    p.add_argument("--scale", default="small", help="which [scale.NAME] to use (default: small)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder of the cells' run directories (default: runs/<grid>-<scale>)")
    p.add_argument("--results", type=Path, default=None,
                   help="also write the results section into this Markdown file "
                        "(e.g. docs/results.md)")
    p.add_argument("--cells", action="append", default=[], metavar="PATTERN",
                   help="run only the cells whose folder name matches this shell pattern "
                        "(repeatable), e.g. '*-s2' or 'non-iid-*-dcco-*'; the table still "
                        "covers the whole grid. Cells another process is working on are "
                        "skipped, so two processes can share one --out")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing; render the table from the finished cells")
    p.add_argument("--jobs", default="1", metavar="N",
                   help="cells run side by side, each in its own process (default 1: in this "
                        "process); 'auto': as many as the accelerator's free memory holds, "
                        "measured on the first cell (1 on a CPU)")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="stop within this many minutes: a cell starts only if its expected "
                        "time (measured here) fits in what is left, and running cells stop at "
                        "a checkpoint when it ends; the same command later resumes them")
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    _add_data_dir(p)
    _add_tensorboard(p)
    p.add_argument("--no-progress", action="store_true", help="no progress output")

    p = sub.add_parser("demo", help="the main job: all methods on non-IID Fashion-MNIST, ~5 min on 2 cores",
                       description="Pretrain dcco, cco_fedavg, contrastive_fedavg and "
                                   "centralized_cco with the same budget on Fashion-MNIST with "
                                   "one-class clients, evaluate each with a linear probe, and "
                                   "compare with supervised-from-scratch and a random encoder.")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="output folder (default: runs/demo-<time>); give an interrupted "
                        "demo's folder to resume it")
    _add_data_dir(p)
    _add_tensorboard(p)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.KEY=VALUE", help="override a value of the demo config")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    return parser


def _default_run_dir(stem: str, method: str) -> Path:
    return Path("runs") / f"{stem}-{method}-{_now()}"


def _now() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _say(text: str) -> None:
    print(text, flush=True)


def _resume_with(args: argparse.Namespace, command: list[str]) -> None:
    """Record the command that continues this one, for ``main`` to show if Ctrl-C stops it;
    each command records it once it knows (the run directory, the demo folder)."""
    args.resume_hint = shlex.join(command)


class _PhaseProgress:
    """A progress callback (``evaluate.StepCallback``) that shows one bar per phase of an
    evaluation (feature batches, probe steps, ...), each closed when the next begins."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.phase: str | None = None
        self.bar = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        from dcco.progress import Progress

        if (phase != self.phase or self.bar is None or done < self.bar.done
                or total != self.bar.total):
            self.close()
            self.phase = phase
            self.bar = Progress(total, label=phase, enabled=None if self.enabled else False)
        self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pretrain_with_progress(cfg, run, train, test, resume: bool, progress: bool,
                            stop=None) -> dict:
    from dcco.train import run_with_progress

    return run_with_progress(cfg, run, train, test, resume, progress, stop)


def cmd_pretrain(args: argparse.Namespace) -> int:
    from dcco import distributed

    if distributed.launched():
        return _pretrain_distributed(args)
    return _pretrain(args)


def _pretrain_distributed(args: argparse.Namespace) -> int:
    """``torchrun --nproc_per_node N -m dcco pretrain ...``: every rank trains its share of
    each round (``dcco.distributed``). Rank 0 creates or opens the run directory, shows
    progress and writes everything; it sends the directory's path to the other ranks, which
    read the config (and the checkpoint, when resuming) from it."""
    import torch.distributed as dist

    from dcco import distributed
    from dcco.experiments import load_splits
    from dcco.rundir import RunDir
    from dcco.train import run_pretraining

    distributed.init_from_env(_device_type_of(args))
    rank, _ = distributed.rank_and_size()
    try:
        if rank == 0:
            told = False

            def tell(run: RunDir) -> None:
                nonlocal told
                dist.broadcast_object_list([str(run.path)], src=0)
                told = True

            try:
                status = _pretrain(args, on_run=tell)
            except BaseException:
                if not told:  # the others wait for a path: tell them there is none
                    dist.broadcast_object_list([None], src=0)
                raise
            if told:
                dist.barrier()  # see below
            return status
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return 2  # rank 0 reports why
        run = RunDir.open(box[0])
        cfg = run.config()
        train, test = load_splits(cfg)
        run_pretraining(cfg, run, train, test, resume=True)
        # wait for rank 0's summary and evaluation: a rank that tears its process group down
        # and exits while another still holds its connections was seen to abort in gloo
        # ("terminate called without an active exception", SIGABRT) in about 1 run in 10
        dist.barrier()
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _device_type_of(args: argparse.Namespace) -> str:
    """The device type a pretraining would use (for the process group's backend)."""
    from dcco.config import load_config
    from dcco.rundir import RunDir
    from dcco.train import resolve_device

    try:
        cfg = (RunDir.open(args.resume).config() if args.resume is not None
               else load_config(args.config) if args.config is not None else None)
    except UserError:
        return "cpu"  # the run itself will report the error
    return resolve_device(cfg.train.device).type if cfg is not None else "cpu"


def _pretrain(args: argparse.Namespace, on_run=None) -> int:
    """``dcco pretrain`` in this process; ``on_run(run)`` is called once the run directory
    exists, before the first round."""
    from dcco.config import load_config
    from dcco.experiments import load_splits, record_split
    from dcco.rundir import RunDir
    from dcco.train import check_run

    if args.resume is not None:
        if args.config is not None or args.overrides or args.data_dir is not None \
                or args.tensorboard:
            raise UserError("--resume takes the config stored in the run directory; do not "
                            "pass CONFIG, --set, --data-dir or --tensorboard with it")
        run = RunDir.open(args.resume)
        cfg = run.config()
        train, test = load_splits(cfg)
        _say(f"resuming {run.path} ({cfg.train.method})")
    else:
        if args.config is None:
            raise UserError("pretrain needs a CONFIG file (or --resume RUN_DIR)")
        cfg = load_config(args.config, _with_data_dir(args.overrides, args.data_dir,
                                                      args.tensorboard))
        train, test = load_splits(cfg)  # data errors before any run directory exists
        check_run(cfg, train)
        path = args.run_dir or _default_run_dir(args.config.stem, cfg.train.method)
        run = RunDir.create(path, cfg)
        record_split(run, cfg, train, test)
        _say(f"pretraining {cfg.train.method} into {run.path}")
    _resume_with(args, ["dcco", "pretrain", "--resume", str(run.path)])
    if on_run is not None:
        on_run(run)
    interrupts = getattr(args, "interrupts", None)
    summary = _pretrain_with_progress(cfg, run, train, test, args.resume is not None,
                                      not args.no_progress,
                                      interrupts.stop if interrupts is not None else None)
    if "stopped" in summary:
        _say(f"stopped at round {summary['rounds']} ({summary['stopped']}), checkpoint "
             f"saved; continue with: dcco pretrain --resume {shlex.quote(str(run.path))}")
        return 130
    knn, privacy = summary.get("knn"), summary.get("privacy")
    _say(f"done: {summary['rounds']} rounds, final loss {summary['final_loss']:.4g}"
         + (f", {summary.get('knn_monitor', 'k-NN')}: {100 * knn:.1f}%" if knn is not None
            else "")
         + (f", (ε = {privacy['epsilon']:.3g}, δ = {privacy['delta']:g})-DP for each client"
            f" (σ = {privacy['noise_multiplier']:.3g})" if privacy else "")
         + f"; run directory {run.path}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dcco.config import load_config
    from dcco.experiments import evaluate_run, load_splits
    from dcco.rundir import RunDir

    run = RunDir.open(args.run_dir)
    splits = None
    if args.data_dir is not None:
        splits = load_splits(load_config(run.config_path, _with_data_dir([], args.data_dir)))
    with _PhaseProgress(not args.no_progress) as progress:
        result = evaluate_run(run, args.protocol, args.labels, splits, progress)
    if result.protocol == "retrieval":
        d = result.details
        _say(f"{run.path}: retrieval in a gallery of {result.num_test} test pairs "
             f"({d['similarity']}): X→Y recall@1 {100 * d['x_to_y']['recall@1']:.2f}%, "
             f"@5 {100 * d['x_to_y']['recall@5']:.2f}%; Y→X recall@1 "
             f"{100 * d['y_to_x']['recall@1']:.2f}%, @5 {100 * d['y_to_x']['recall@5']:.2f}% "
             f"({result.seconds:.0f} s)")
        return 0
    if result.protocol == "knn":
        _say(f"{run.path}: {result.details['monitor']}: test accuracy "
             f"{100 * result.accuracy:.2f}% ({result.seconds:.0f} s)")
        return 0
    _say(f"{run.path}: {args.protocol} evaluation with {result.num_labels} labels: "
         f"test accuracy {100 * result.accuracy:.2f}% ({result.seconds:.0f} s)")
    return 0


def cmd_supervised(args: argparse.Namespace) -> int:
    from dcco.config import load_config
    from dcco.experiments import load_splits, supervised_run
    from dcco.rundir import RunDir

    cfg = load_config(args.config, _with_data_dir(args.overrides, args.data_dir))
    splits = load_splits(cfg)
    if splits[0].paired:
        raise UserError("supervised from scratch trains an image classifier; paired data "
                        "sets have no supervised baseline in dcco")
    run = RunDir.create(args.run_dir or _default_run_dir(args.config.stem, "supervised"), cfg)
    with _PhaseProgress(not args.no_progress) as progress:
        result = supervised_run(cfg, run, args.labels, splits, progress)
    _say(f"supervised from scratch with {result.num_labels} labels: test accuracy "
         f"{100 * result.accuracy:.2f}%; run directory {run.path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from dcco.report import (
        comparison_plot_paths,
        comparison_rows,
        plot_comparison,
        text_table,
        write_tables,
    )
    from dcco.rundir import RunDir

    runs = [RunDir.open(p) for p in args.run_dirs]
    prefix = args.out or Path(f"comparison-{_now()}")
    header, rows = comparison_rows(runs)
    targets = [prefix.with_suffix(".md"), prefix.with_suffix(".csv"),
               *comparison_plot_paths(runs, prefix)]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not args.force:
        raise UserError(f"{', '.join(existing)} already exist; choose another --out PREFIX, or "
                        f"pass --force to overwrite")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.write(text_table(header, rows))
    md, csv_path = write_tables(header, rows, prefix)
    plots = plot_comparison(runs, prefix)
    _say(f"wrote {md}, {csv_path}" + "".join(f", {p}" for p in plots))
    if args.tensorboard:
        from dcco.scalars import tensorboard_command

        missing = [str(r.path) for r in runs if not (r.path / "tensorboard").is_dir()]
        if missing:
            _say(f"no TensorBoard scalars in {', '.join(missing)} (they ran without "
                 f"train.tensorboard)")
        _say(tensorboard_command([r.path for r in runs]))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dcco.demo import run_demo

    out = args.run_dir or Path("runs") / f"demo-{_now()}"
    again = ["dcco", "demo", "--run-dir", str(out)]
    if args.data_dir is not None:
        again += ["--data-dir", str(args.data_dir)]
    if args.tensorboard:
        again += ["--tensorboard"]
    _resume_with(args, again + [x for o in args.overrides for x in ("--set", o)])
    start = time.perf_counter()

    def pretrain(cfg, run, train, test, resume):
        return _pretrain_with_progress(cfg, run, train, test, resume, not args.no_progress)

    with _PhaseProgress(not args.no_progress) as progress:
        table = run_demo(out, pretrain, data_dir=args.data_dir,
                         overrides=_with_data_dir(args.overrides, None, args.tensorboard),
                         say=_say, progress=progress)
    sys.stdout.write("\n" + table)
    _say(f"\ntotal {time.perf_counter() - start:.0f} s; table, plots and runs in {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from dcco.encoders import export_encoder

    weights, meta = export_encoder(args.run_dir, args.out)
    arch = json.loads(meta.read_text())
    _say(f"wrote {weights} and {meta}: {arch['info']['method']} encoder, input "
         f"{tuple(arch['input_shape'])}; load it with dcco.load_encoder({str(weights)!r})")
    return 0


def _reproduce_command(args: argparse.Namespace) -> str:
    """The command that regenerates the results: the grid, scale, output folder and results
    file, without the flags that only change what this invocation runs or prints (--cells,
    --table-only, --jobs, --time-budget, --no-progress): rerunning it finishes the missing
    cells and rewrites the same block."""
    parts = ["dcco reproduce", str(args.grid), "--scale", args.scale]
    if args.out is not None:
        parts += ["--out", str(args.out)]
    if args.results is not None:
        parts += ["--results", str(args.results)]
    if args.data_dir is not None:
        parts += ["--data-dir", str(args.data_dir)]
    return " ".join(parts)


def _jobs(value: str) -> int | None:
    """--jobs: a count ≥ 1, or None for 'auto'."""
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"--jobs must be a whole number >= 1 or 'auto', got {value!r}")
    return int(value)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from dcco.reproduce import load_grid, plan_cells, select_cells

    grid = load_grid(args.grid, args.scale,
                     _with_data_dir([], args.data_dir, args.tensorboard))
    out = args.out or Path("runs") / f"{args.grid.stem}-{args.scale}"
    cells = plan_cells(grid, out)
    jobs = _jobs(args.jobs)
    if args.time_budget is not None and not args.time_budget > 0:
        raise UserError(f"--time-budget must be > 0 minutes, got {args.time_budget}")
    if not args.table_only:
        todo = [c for c in select_cells(cells, args.cells) if c.na is None]
        _say(f"{len(cells)} cells ({len(cells) - sum(c.na is None for c in cells)} n/a) into "
             f"{out}" + (f"; running {len(todo)} of them" if args.cells else "")
             + (f"; time budget {args.time_budget:g} min" if args.time_budget else ""))
        _resume_with(args, shlex.split(_reproduce_command(args))
                     + [x for c in args.cells for x in ("--cells", c)])
        _check_cells(grid, todo)
        if jobs is None and args.deadline is None:
            jobs = _auto_jobs(grid, todo)
        if jobs == 1 or args.deadline is not None:
            _reproduce_here(args, grid, cells, todo)
        else:
            _reproduce_pool(args, grid, cells, todo, out, jobs)
    if not args.no_table:
        _reproduce_table(args, grid, cells, out)
    interrupts = getattr(args, "interrupts", None)
    return 130 if interrupts is not None and interrupts.requested else 0


def _check_cells(grid, todo: list) -> None:
    """Every refusal of the cells to run (``dcco.train.check_run``), before any of their
    folders is created; a refused cell is named."""
    from dcco.config import ConfigError
    from dcco.experiments import load_splits
    from dcco.reproduce import SUPERVISED
    from dcco.train import check_run

    pretraining = [c for c in todo if c.method != SUPERVISED]
    if not pretraining:
        return
    train = load_splits(grid.base)[0]
    for cell in pretraining:
        try:
            check_run(cell.cfg, train)
        except ConfigError as e:
            raise ConfigError(f"cell {cell.path.name}: {e}") from None


def _budget(args: argparse.Namespace):
    from dcco.reproduce.pool import Budget

    if args.deadline is not None:
        return Budget(args.deadline)
    return Budget.minutes(args.time_budget)


def _reproduce_here(args: argparse.Namespace, grid, cells: list, todo: list) -> None:
    """The cells one after another in this process, within the budget."""
    from dcco.experiments import load_splits
    from dcco.reproduce import run_cell
    from dcco.reproduce.pool import reason_not_to_start
    from dcco.rundir import RunDirBusy

    budget = _budget(args)
    splits = load_splits(grid.base)
    interrupts = getattr(args, "interrupts", None) or Interrupts()

    def stop() -> str | None:
        return budget.stop() or interrupts.stop()

    def pretrain(cfg, run, train, test, resume, stop=None):
        return _pretrain_with_progress(cfg, run, train, test, resume, not args.no_progress,
                                       stop)

    busy, stopped, diverged = [], [], []
    with _PhaseProgress(not args.no_progress) as progress:
        for i, cell in enumerate(todo, 1):
            reason = (INTERRUPTED if interrupts.requested else
                      reason_not_to_start(cell, grid.evaluations, cells, budget))
            if reason is not None:
                _say(f"({i}/{len(todo)}) [{cell.path.name}] not started: {reason}")
                stopped.append(cell.path.name)
                continue
            try:
                outcome = run_cell(cell, grid.evaluations, splits, pretrain,
                                   lambda s, i=i: _say(f"({i}/{len(todo)}) {s}"), progress,
                                   stop=stop)
                if outcome == "stopped":
                    stopped.append(cell.path.name)
                elif outcome == "diverged":
                    diverged.append(cell.path.name)
            except RunDirBusy:
                _say(f"({i}/{len(todo)}) [{cell.path.name}] skipped: another process is "
                     f"working on it")
                busy.append(cell.path.name)
            progress.close()
    if busy:
        _say(f"{len(busy)} cells were busy in another process; rerun to finish them")
    if stopped:
        why = "on a signal" if interrupts.requested else "when the time budget ended"
        _say(f"{len(stopped)} cells unfinished {why}; the same command resumes them")
    if diverged:
        _say(f"{len(diverged)} cells diverged ({', '.join(diverged)}): their metrics.jsonl "
             f"says at which round; the table leaves them out")


def _auto_jobs(grid, todo: list) -> int:
    """--jobs auto, said."""
    from dcco.reproduce.pool import auto_jobs, peak_memory
    from dcco.train import resolve_device

    device = resolve_device(grid.base.train.device).type
    jobs = auto_jobs((lambda: peak_memory(todo[0].cfg)) if todo else None, device)
    _say(f"--jobs auto: {jobs} on {device}")
    return jobs


def _reproduce_pool(args: argparse.Namespace, grid, cells: list, todo: list, out: Path,
                    jobs: int) -> None:
    """The cells as up to ``jobs`` processes side by side, each this command for one cell."""
    from dcco.reproduce.pool import run_pool, threads_per_job
    from dcco.train import resolve_device

    budget = _budget(args)
    device = resolve_device(grid.base.train.device).type

    def command(cell) -> list[str]:
        line = [sys.executable, "-m", "dcco", "reproduce", str(args.grid), "--scale",
                args.scale, "--out", str(out), "--cells", cell.path.name, "--no-table",
                "--no-progress"]
        if budget.deadline is not None:
            line += ["--deadline", repr(budget.deadline)]
        if args.data_dir is not None:
            line += ["--data-dir", str(args.data_dir)]
        return line + (["--tensorboard"] if args.tensorboard else [])

    interrupts = getattr(args, "interrupts", None)
    outcomes = run_pool(todo, grid.evaluations, jobs, budget, command, _say, out / ".logs",
                        peers=cells, env=os.environ | threads_per_job(jobs, device),
                        stop=interrupts.stop if interrupts is not None else None)
    finished = sum(o == "finished" for o in outcomes.values())
    _say(f"{finished} of {len(todo)} cells finished"
         + ("" if finished == len(todo) else "; the same command resumes the others"))


def _reproduce_table(args: argparse.Namespace, grid, cells: list, out: Path) -> None:
    from dcco.reproduce import plot_trend, results_markdown, results_table, write_section

    out.mkdir(parents=True, exist_ok=True)
    table = results_table(grid, cells)
    sys.stdout.write("\n" + table)
    plot = plot_trend(grid, cells, out / "trend.png") if grid.evaluations else None
    command = _reproduce_command(args)
    text = results_markdown(grid, cells, command, None)
    (out / "results.md").write_text(text)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        if plot is not None:
            target = args.results.parent / f"{args.grid.stem}-{args.scale}-trend.png"
            target.write_bytes(plot.read_bytes())
            text = results_markdown(grid, cells, command, target.name)
        write_section(args.results, text, tag=f"reproduce:{args.grid.stem}:{args.scale}")
        _say(f"wrote {args.results}")


def cmd_config(args: argparse.Namespace) -> int:
    from dcco.config_reference import reference

    print(reference(markdown=args.markdown), end="")
    return 0


COMMANDS = {"config": cmd_config, "pretrain": cmd_pretrain, "evaluate": cmd_evaluate, "supervised": cmd_supervised,
            "compare": cmd_compare, "demo": cmd_demo, "reproduce": cmd_reproduce,
            "export": cmd_export}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments; an unknown option is reported with its command's usage (argparse
    reports it with the top-level usage, which does not list the command's options)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


INTERRUPTED = "interrupted"
"""The reason a run or a grid stopped on a signal (``metrics.jsonl``'s ``stopped``)."""


class Interrupts:
    """SIGINT and SIGTERM, as ``pretrain`` and ``reproduce`` see them: the first asks the work
    to stop at its next checkpoint (a run at the end of its logging window, with a checkpoint
    and a ``stopped`` record, as a time budget stops it; a grid starts no further cell and
    asks its cells to stop); the second stops at once (``KeyboardInterrupt``: what was done
    since the last checkpoint is lost). A signal within ``SAME_SIGNAL_S`` seconds of the
    first counts as the same one (a terminal's Ctrl-C reaches a grid's cells too). A grid
    asks its cells by a file (named by ``STOP_FILE_ENV`` in their environment;
    ``dcco.reproduce.pool``), which a cell's ``stop`` reads: a file cannot be lost as a
    signal can, at a process's start."""

    def __init__(self) -> None:
        from dcco.reproduce.pool import SAME_SIGNAL_S, STOP_FILE_ENV

        self.requested, self._at, self.same_s = False, 0.0, SAME_SIGNAL_S
        self.stop_file = os.environ.get(STOP_FILE_ENV)

    def handle(self, signum: int, frame: object) -> None:
        if self.requested:
            if time.monotonic() - self._at > self.same_s:
                raise KeyboardInterrupt
            return
        self.requested, self._at = True, time.monotonic()
        # os.write, not print: a signal that lands inside a print would make print re-enter
        os.write(2, f"\n{signal.Signals(signum).name}: stopping at the next checkpoint; "
                    f"interrupt again to stop at once (losing what was done since)\n".encode())

    def stop(self) -> str | None:
        """``INTERRUPTED`` once a signal came or the grid asked, else None (a run's
        ``stop``)."""
        if not self.requested and self.stop_file and os.path.exists(self.stop_file):
            self.requested = True
        return INTERRUPTED if self.requested else None


@contextlib.contextmanager
def _interruptible(interrupts: Interrupts | None) -> Iterator[None]:
    """``interrupts`` handles SIGINT and SIGTERM while a command runs (None: SIGINT raises
    ``KeyboardInterrupt``, SIGTERM ends the process, as by default), then the previous
    handlers come back (the CLI may run in a caller's process). A process that a
    non-interactive shell starts in the background (``nohup dcco reproduce ... &``) inherits
    SIGINT ignored, and Python leaves it so: without this, ``kill -INT`` would not reach it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if interrupts is None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    else:
        for s in old:
            signal.signal(s, interrupts.handle)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # one of torchrun's ranks (dcco.distributed.launched, without importing torch here)
    torchrun_rank = args.command == "pretrain" and int(os.environ.get("WORLD_SIZE", "1")) > 1
    # the commands that stop at a checkpoint (torchrun's ranks do not: they must stop together)
    args.interrupts = Interrupts() if args.command == "reproduce" or (
        args.command == "pretrain" and not torchrun_rank) else None
    status = _run_command(args)
    if torchrun_rank:
        # A torchrun rank whose work is done and whose process group is destroyed leaves
        # without the interpreter's teardown: there gloo's threads were seen to abort the
        # process ("terminate called without an active exception", then SIGABRT or SIGSEGV)
        # in 1 exit in 9 (a loop of one command), after the run was complete, failing
        # torchrun's whole job; 0 in 60 since.
        # Everything a rank writes is written by now (checkpoints and records atomically).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; bad input, an interrupt and divergence become exit codes."""
    try:
        with _interruptible(args.interrupts):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        hint = getattr(args, "resume_hint", None)
        print("\ninterrupted" + (f"; continue with: {hint}" if hint else ""), file=sys.stderr)
        return 130
    except UserError as e:
        # ConfigError, DataError, RunDirError, CheckpointError: bad input, named in the
        # message. Anything else is a bug and keeps its traceback.
        print(f"dcco {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # Pretraining.check_finite: the run diverged
        print(f"dcco {args.command}: training diverged: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
