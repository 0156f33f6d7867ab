"""The ``dcco`` command line: pretrain, evaluate, supervised, compare, demo.

The only module that parses arguments and prints. Errors in user input (config keys, data
files, run directories) end with a one-line message naming the problem and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from dcco import __version__


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="run config, a TOML file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.rounds=200 "
                        "--set model.widths=[16,32,64]; repeatable")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="where to write the run (default: runs/<config>-<method>-<time>)")


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
    p.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                   help="continue an interrupted run from its last checkpoint (bit-identical on CPU)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")

    p = sub.add_parser("evaluate", help="evaluate a pretrained run (linear probe or finetuning)",
                       description="Evaluate the encoder of a run directory on its data set's "
                                   "test split; the projector is discarded. The result is added "
                                   "to the run's summary.json.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--protocol", choices=["linear", "finetune"], default="linear",
                   help="linear: frozen encoder + LARS linear classifier; finetune: whole "
                        "network with Adam (default: linear)")
    p.add_argument("--labels", type=int, default=None,
                   help="labelled training samples, class-balanced (default: eval.labels of "
                        "the run's config; 500 uses the paper's 500-label probe settings)")

    p = sub.add_parser("supervised", help="supervised training from scratch on the labelled subset",
                       description="Train the same encoder architecture from scratch on the "
                                   "labelled subset (the paper's supervised baseline).")
    _add_config_args(p)
    p.add_argument("--labels", type=int, default=None, help="labelled training samples")

    p = sub.add_parser("compare", help="one table across runs (Markdown and CSV)",
                       description="Print one table across run directories and write it as "
                                   "Markdown and CSV.")
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=Path("comparison"),
                   help="output prefix: writes PREFIX.md and PREFIX.csv (default: comparison)")

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
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")

    p = sub.add_parser("demo", help="the main job: all methods on non-IID Fashion-MNIST, ~10 min",
                       description="Pretrain dcco, cco_fedavg, contrastive_fedavg and "
                                   "centralized_cco with the same budget on Fashion-MNIST with "
                                   "one-class clients, evaluate each with a linear probe, and "
                                   "compare with supervised-from-scratch and a random encoder.")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="output folder (default: runs/demo-<time>)")
    p.add_argument("--data-dir", type=Path, default=None, help="where the data set lives")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.KEY=VALUE", help="override a value of the demo config")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")
    return parser


def _default_run_dir(stem: str, method: str) -> Path:
    return Path("runs") / f"{stem}-{method}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _say(text: str) -> None:
    print(text, flush=True)


def _pretrain_with_progress(cfg, run, train, test, resume: bool, progress: bool) -> dict:
    from dcco.progress import Progress
    from dcco.report import plot_run_curves
    from dcco.train import run_pretraining

    bar = Progress(cfg.train.rounds, label="round", enabled=None if progress else False)

    def on_round(m, latest):
        extra = {"loss": m.loss}
        if "knn" in latest:
            extra["knn"] = latest["knn"]
        bar.update(m.round, **extra)

    with bar:
        summary = run_pretraining(cfg, run, train, test, resume=resume, on_round=on_round)
    plot_run_curves(run)
    return summary


def cmd_pretrain(args: argparse.Namespace) -> int:
    from dcco.config import load_config
    from dcco.experiments import load_splits
    from dcco.rundir import RunDir

    if args.resume is not None:
        if args.config is not None or args.overrides:
            raise ValueError("--resume takes the config stored in the run directory; "
                             "do not pass CONFIG or --set with it")
        run = RunDir.open(args.resume)
        cfg = run.config()
        _say(f"resuming {run.path} ({cfg.train.method})")
    else:
        if args.config is None:
            raise ValueError("pretrain needs a CONFIG file (or --resume RUN_DIR)")
        cfg = load_config(args.config, args.overrides)
        path = args.run_dir or _default_run_dir(args.config.stem, cfg.train.method)
        run = RunDir.create(path, cfg)
        _say(f"pretraining {cfg.train.method} into {run.path}")
    train, test = load_splits(cfg)
    summary = _pretrain_with_progress(cfg, run, train, test, args.resume is not None,
                                      not args.no_progress)
    knn = summary.get("knn")
    _say(f"done: {summary['rounds']} rounds, final loss {summary['final_loss']:.4g}"
         + (f", k-NN accuracy {100 * knn:.1f}%" if knn is not None else "")
         + f"; run directory {run.path}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dcco.experiments import evaluate_run
    from dcco.rundir import RunDir

    run = RunDir.open(args.run_dir)
    result = evaluate_run(run, args.protocol, args.labels)
    _say(f"{run.path}: {args.protocol} evaluation with {result.num_labels} labels: "
         f"test accuracy {100 * result.accuracy:.2f}% ({result.seconds:.0f} s)")
    return 0


def cmd_supervised(args: argparse.Namespace) -> int:
    from dcco.config import load_config
    from dcco.experiments import supervised_run
    from dcco.rundir import RunDir

    cfg = load_config(args.config, args.overrides)
    run = RunDir.create(args.run_dir or _default_run_dir(args.config.stem, "supervised"), cfg)
    result = supervised_run(cfg, run, args.labels)
    _say(f"supervised from scratch with {result.num_labels} labels: test accuracy "
         f"{100 * result.accuracy:.2f}%; run directory {run.path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from dcco.report import comparison_rows, plot_comparison, text_table, write_tables
    from dcco.rundir import RunDir

    runs = [RunDir.open(p) for p in args.run_dirs]
    header, rows = comparison_rows(runs)
    sys.stdout.write(text_table(header, rows))
    md, csv_path = write_tables(header, rows, args.out)
    plots = plot_comparison(runs, args.out)
    _say(f"wrote {md}, {csv_path}" + "".join(f", {p}" for p in plots))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dcco.demo import run_demo

    out = args.run_dir or Path("runs") / f"demo-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    def pretrain(cfg, run, train, test, resume):
        return _pretrain_with_progress(cfg, run, train, test, resume, not args.no_progress)

    table = run_demo(out, pretrain, data_dir=args.data_dir, overrides=args.overrides, say=_say)
    sys.stdout.write("\n" + table)
    _say(f"\ntotal {time.perf_counter() - start:.0f} s; table, plots and runs in {out}")
    return 0


def _reproduce_command(args: argparse.Namespace) -> str:
    """The command that regenerates the results: the grid, scale, output folder and results
    file, without the flags that only change what this invocation runs or prints (--cells,
    --table-only, --no-progress): rerunning it finishes the missing cells and rewrites the
    same block."""
    parts = ["dcco reproduce", str(args.grid), "--scale", args.scale]
    if args.out is not None:
        parts += ["--out", str(args.out)]
    if args.results is not None:
        parts += ["--results", str(args.results)]
    return " ".join(parts)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from dcco.experiments import load_splits
    from dcco.reproduce import (
        load_grid,
        plan_cells,
        plot_trend,
        results_markdown,
        results_table,
        run_cell,
        select_cells,
        write_section,
    )
    from dcco.rundir import RunDirBusy

    grid = load_grid(args.grid, args.scale)
    out = args.out or Path("runs") / f"{args.grid.stem}-{args.scale}"
    cells = plan_cells(grid, out)
    if not args.table_only:
        splits = load_splits(grid.base)
        todo = [c for c in select_cells(cells, args.cells) if c.na is None]
        _say(f"{len(cells)} cells ({len(cells) - sum(c.na is None for c in cells)} n/a) into "
             f"{out}" + (f"; running {len(todo)} of them" if args.cells else ""))

        def pretrain(cfg, run, train, test, resume):
            return _pretrain_with_progress(cfg, run, train, test, resume, not args.no_progress)

        busy = []
        for i, cell in enumerate(todo, 1):
            try:
                run_cell(cell, grid.evaluations, splits, pretrain,
                         lambda s, i=i: _say(f"({i}/{len(todo)}) {s}"))
            except RunDirBusy:
                _say(f"({i}/{len(todo)}) [{cell.path.name}] skipped: another process is "
                     f"working on it")
                busy.append(cell.path.name)
        if busy:
            _say(f"{len(busy)} cells were busy in another process; rerun to finish them")
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
    return 0


COMMANDS = {"pretrain": cmd_pretrain, "evaluate": cmd_evaluate, "supervised": cmd_supervised,
            "compare": cmd_compare, "demo": cmd_demo, "reproduce": cmd_reproduce}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("\ninterrupted; resume a pretraining with dcco pretrain --resume RUN_DIR",
              file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, json.JSONDecodeError) as e:
        # ConfigError, DataError, RunDirError and CheckpointError are ValueErrors: user input.
        print(f"dcco {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
