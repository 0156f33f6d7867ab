"""``dcco reproduce``: a grid's cells, checked before any folder exists, run here one after
another or side by side in a pool, within a time budget, then its table."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from dcco.cli.common import _PhaseProgress, _resume_with, _say
from dcco.cli.parser import _with_data_dir
from dcco.cli.signals import INTERRUPTED, Interrupts
from dcco.errors import UserError


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
    if args.fill and args.time_budget is None and args.deadline is None:
        raise UserError("--fill fills a time budget: give --time-budget MINUTES too")
    if not args.table_only:
        todo = [c for c in select_cells(cells, args.cells) if c.na is None]
        _say(f"{len(cells)} cells ({len(cells) - sum(c.na is None for c in cells)} n/a) into "
             f"{out}" + (f"; running {len(todo)} of them" if args.cells else "")
             + (f"; time budget {args.time_budget:g} min" if args.time_budget else ""))
        _resume_with(args, shlex.split(_reproduce_command(args))
                     + [x for c in args.cells for x in ("--cells", c)])
        from dcco.run.splits import load_splits

        splits = load_splits(grid.base) if todo else None
        if jobs is None and args.deadline is None:
            jobs = _auto_jobs(grid, todo)
        here = jobs == 1 or args.deadline is not None
        # every cell checked before any folder exists; kept for the cells run here
        checked = _check_cells(todo, splits, keep=here)
        if here:
            _reproduce_here(args, grid, cells, todo, splits, checked)
        else:
            _reproduce_pool(args, grid, cells, todo, out, jobs)
    if not args.no_table:
        _reproduce_table(args, grid, cells, out)
    interrupts = getattr(args, "interrupts", None)
    return 130 if interrupts is not None and interrupts.requested else 0


KEPT_CHECKS_BYTES = 1 << 30
"""How much of the checked cells' models ``_check_cells`` keeps for their pretraining (1
GiB of parameters and buffers); a cell past it is checked again when it starts."""


def _check_cells(todo: list, splits: tuple | None, keep: bool = True) -> dict[str, object]:
    """Every refusal of the cells to run (``dcco.run.setup.check_run``), before any of their
    folders is created; a refused cell is named. Returns each cell's ``CheckedRun`` by its
    folder's name, for its pretraining to take as it is (one check a cell), up to
    ``KEPT_CHECKS_BYTES`` of models; none with ``keep`` False (the cells run in processes of
    their own, each checking its cell once)."""
    from dcco.config import ConfigError
    from dcco.reproduce import SUPERVISED
    from dcco.run.setup import check_run

    pretraining = [c for c in todo if c.method != SUPERVISED]
    if not pretraining or splits is None:
        return {}
    kept: dict[str, object] = {}
    held = 0
    for cell in pretraining:
        try:
            checked = check_run(cell.cfg, splits[0], run_dir=cell.path)
        except ConfigError as e:
            raise ConfigError(f"cell {cell.path.name}: {e}") from None
        if not keep:
            continue
        held += sum(t.numel() * t.element_size() for t in checked.model.state_dict().values())
        if held <= KEPT_CHECKS_BYTES:
            kept[cell.path.name] = checked
    return kept


def _budget(args: argparse.Namespace):
    from dcco.reproduce.pool import Budget

    if args.deadline is not None:
        return Budget(args.deadline, fill=args.fill)
    return Budget.minutes(args.time_budget, fill=args.fill)


def _reproduce_here(args: argparse.Namespace, grid, cells: list, todo: list,
                    splits: tuple | None, checked: dict[str, object]) -> None:
    """The cells one after another in this process, within the budget; a cell's pretraining
    takes its ``checked`` run (``_check_cells``) as it is."""
    from dcco.reproduce import run_cell
    from dcco.reproduce.pool import reason_not_to_start
    from dcco.run.rundir import RunDirBusy

    budget = _budget(args)
    interrupts = getattr(args, "interrupts", None) or Interrupts()

    def stop() -> str | None:
        return budget.stop() or interrupts.stop()

    def pretrain(cfg, run, train, test, resume, stop=None):
        from dcco.run.loop import run_with_progress

        return run_with_progress(cfg, run, train, test, resume, not args.no_progress,
                                 stop, checked=checked.pop(run.path.name, None))

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
    from dcco.run.device_plan import resolve_device

    device = resolve_device(grid.base.train.device).type
    jobs = auto_jobs((lambda: peak_memory(todo[0].cfg)) if todo else None, device)
    _say(f"--jobs auto: {jobs} on {device}")
    return jobs


def _reproduce_pool(args: argparse.Namespace, grid, cells: list, todo: list, out: Path,
                    jobs: int) -> None:
    """The cells as up to ``jobs`` processes side by side, each this command for one cell."""
    from dcco.reproduce.pool import run_pool, threads_per_job
    from dcco.run.device_plan import resolve_device

    budget = _budget(args)
    device = resolve_device(grid.base.train.device).type

    def command(cell) -> list[str]:
        line = [sys.executable, "-m", "dcco", "reproduce", str(args.grid), "--scale",
                args.scale, "--out", str(out), "--cells", cell.path.name, "--no-table",
                "--no-progress"]
        if budget.deadline is not None:
            line += ["--deadline", repr(budget.deadline)] + (["--fill"] if budget.fill else [])
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
    if grid.tuning is not None:
        from dcco.reproduce.picks import picks, picks_markdown, write_picks

        chosen = picks(grid, cells)
        table = picks_markdown(grid, chosen)
        write_picks(out / "picks.json", grid, chosen)
        plot = None
    else:
        table = results_table(grid, cells)
        plot = plot_trend(grid, cells, out / "trend.png") if grid.evaluations else None
    sys.stdout.write("\n" + table)
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


