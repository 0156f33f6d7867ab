"""The commands but ``reproduce``: pretrain (in this process or as a torchrun rank),
evaluate, supervised, compare, demo, export, config."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from dcco.cli.common import _default_run_dir, _now, _PhaseProgress, _resume_with, _say
from dcco.cli.parser import _with_data_dir
from dcco.errors import UserError


def cmd_pretrain(args: argparse.Namespace) -> int:
    from dcco.core import distributed

    if distributed.launched():
        return _pretrain_distributed(args)
    return _pretrain(args)


def _pretrain_distributed(args: argparse.Namespace) -> int:
    """``torchrun --nproc_per_node N -m dcco pretrain ...``: every rank trains its share of
    each round (``dcco.core.distributed``). Rank 0 creates or opens the run directory, shows
    progress and writes everything; it sends the directory's path to the other ranks, which
    read the config (and the checkpoint, when resuming) from it."""
    import torch.distributed as dist

    from dcco.core import distributed
    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

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
    from dcco.run.device_plan import resolve_device
    from dcco.run.rundir import RunDir

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
    from dcco.run.rundir import RunDir, record_split
    from dcco.run.setup import check_run, resolved
    from dcco.run.splits import load_splits

    if args.resume is not None:
        if args.config is not None or args.overrides or args.data_dir is not None \
                or args.tensorboard:
            raise UserError("--resume takes the config stored in the run directory; do not "
                            "pass CONFIG, --set, --data-dir or --tensorboard with it")
        run = RunDir.open(args.resume)
        cfg = run.config()
        train, test = load_splits(cfg)
        checked = None  # checked once, against the run's client states, by the loop
        _say(f"resuming {run.path} ({cfg.train.method})")
    else:
        if args.config is None:
            raise UserError("pretrain needs a CONFIG file (or --resume RUN_DIR)")
        cfg = resolved(load_config(args.config, _with_data_dir(args.overrides, args.data_dir,
                                                               args.tensorboard)))
        train, test = load_splits(cfg)  # data errors before any run directory exists
        path = args.run_dir or _default_run_dir(args.config.stem, cfg.train.method)
        checked = check_run(cfg, train, run_dir=Path(path))
        run = RunDir.create(path, cfg)
        record_split(run, cfg, train, test)
        _say(f"pretraining {cfg.train.method} into {run.path}")
    _resume_with(args, ["dcco", "pretrain", "--resume", str(run.path)])
    if on_run is not None:
        on_run(run)
    from dcco.run.loop import run_with_progress

    interrupts = getattr(args, "interrupts", None)
    summary = run_with_progress(cfg, run, train, test, args.resume is not None,
                                not args.no_progress,
                                interrupts.stop if interrupts is not None else None,
                                checked=checked)
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
    from dcco.run.evaluations import evaluate_run
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

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
    from dcco.run.evaluations import supervised_run
    from dcco.run.rundir import RunDir
    from dcco.run.setup import resolved
    from dcco.run.splits import load_splits

    cfg = resolved(load_config(args.config, _with_data_dir(args.overrides, args.data_dir)))
    splits = load_splits(cfg)  # the config refused before any data is read
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
    from dcco.run.report import (
        comparison_plot_paths,
        comparison_rows,
        plot_comparison,
        text_table,
        write_tables,
    )
    from dcco.run.rundir import RunDir

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
        from dcco.run.scalars import tensorboard_command

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

    def pretrain(cfg, run, train, test, resume, checked):
        from dcco.run.loop import run_with_progress

        return run_with_progress(cfg, run, train, test, resume, not args.no_progress,
                                 checked=checked)

    with _PhaseProgress(not args.no_progress) as progress:
        table = run_demo(out, pretrain, data_dir=args.data_dir,
                         overrides=_with_data_dir(args.overrides, None, args.tensorboard),
                         say=_say, progress=progress)
    sys.stdout.write("\n" + table)
    _say(f"\ntotal {time.perf_counter() - start:.0f} s; table, plots and runs in {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from dcco.run.encoders import export_encoder

    weights, meta = export_encoder(args.run_dir, args.out)
    arch = json.loads(meta.read_text())
    _say(f"wrote {weights} and {meta}: {arch['info']['method']} encoder, input "
         f"{tuple(arch['input_shape'])}; load it with dcco.load_encoder({str(weights)!r})")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from dcco.config.reference import reference
    from dcco.fitting import defaults_section

    print(reference(markdown=args.markdown) + "\n" + defaults_section(args.markdown), end="")
    return 0


