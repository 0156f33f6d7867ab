"""Many cells side by side on one machine, within a time budget.

One cell at a time leaves a large GPU mostly idle (on an H100 five `full` cells ran at about
23 rounds/s together, against 17 for one alone), and a lent machine's time ends at a fixed
hour. ``run_pool`` keeps up to N cell processes going, starts a cell only if its expected
time fits in what is left of the budget, and lets every process stop at a checkpoint when the
budget ends (``Budget.stop``, asked between rounds and before each evaluation): a cell is
then either finished or unfinished with a checkpoint and a ``stopped`` record in its metrics,
and the next command resumes it. Processes share the output folder and its per-cell locks,
as several ``dcco reproduce`` commands do.

The estimate of a cell's time (``expected_seconds``) uses only what was measured on this
machine: the rounds per second its own metrics logged, else those of the grid's other cells of
the same method (then of any method), plus the seconds its missing evaluations took in other
cells. Where nothing has been measured yet the cell starts, and its first logged rounds give
the estimate for the rest; where one part is measured and another not (its evaluation, before
any cell has finished one here), the measured part alone decides when it is already too long.
``--fill`` starts cells whatever their estimate (``Budget.fill``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dcco.config import RunConfig
from dcco.reproduce.cell import cell_accuracy, pretrained
from dcco.reproduce.grid import SUPERVISED
from dcco.reproduce.plan import Cell
from dcco.run.evaluations import eval_key
from dcco.run.rundir import RunDir, RunDirBusy, code_version

TIME_BUDGET = "time budget"
"""The reason a cell records when the budget ends."""
STOP_FILE_ENV = "DCCO_STOP_FILE"
"""The environment variable that names a cell process's stop file: once it exists, the cell
stops at its next checkpoint (``dcco.cli.Interrupts``)."""
SAME_SIGNAL_S = 3.0
"""A second SIGINT or SIGTERM within this many seconds of the first is the same one (a
terminal's Ctrl-C reaches a grid and its cells alike); a later one stops at once."""


@dataclass
class Budget:
    """A deadline in wall-clock seconds (``time.time()``); None: no limit. With ``fill``,
    cells start until the deadline whether or not they are expected to finish by it (a grid
    longer than one session: what they did is kept at their checkpoints)."""

    deadline: float | None = None
    clock: Callable[[], float] = field(default=time.time, repr=False)
    fill: bool = False

    @classmethod
    def minutes(cls, minutes: float | None, clock: Callable[[], float] = time.time,
                fill: bool = False) -> Budget:
        return cls(None if minutes is None else clock() + 60 * minutes, clock, fill)

    def left(self) -> float:
        """Seconds left (infinite without a deadline)."""
        return float("inf") if self.deadline is None else self.deadline - self.clock()

    def stop(self) -> str | None:
        """``TIME_BUDGET`` once the deadline has passed, else None (``cell.Stop``)."""
        return TIME_BUDGET if self.left() <= 0 else None


# ------------------------------------------------------------------------------ estimates


def _this_machine() -> tuple[str, str]:
    info = code_version()
    return info["cpu"], info["gpu"]


def _ran_here(path: Path, here: tuple[str, str]) -> bool:
    """Whether the run in ``path`` was made on a machine like this one (same CPU and GPU in
    its version.json)."""
    try:
        info = json.loads((path / "version.json").read_text())
    except (OSError, ValueError):
        return False
    return (info.get("cpu"), info.get("gpu")) == here


def progress_of(cell: Cell) -> tuple[int, float | None]:
    """(rounds done, the last logged rounds per second) from the cell's metrics; rounds done
    is the last logged round (a checkpoint may lie up to one logging window behind)."""
    logged = [r for r in RunDir(cell.path).metrics() if "rounds_per_sec" in r]
    if not logged:
        return 0, None
    return int(logged[-1]["round"]), float(logged[-1]["rounds_per_sec"])


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _missing_evaluations(cell: Cell, evaluations: tuple[str, ...]) -> list[str]:
    """The summary keys of the evaluations the cell has not recorded yet."""
    keys = []
    for e in cell.evaluations(evaluations):
        if cell_accuracy(cell, e) is None:
            protocol, labels = e.split("@")
            keys.append(eval_key(SUPERVISED if cell.method == SUPERVISED else protocol,
                                 int(labels)))
    return list(dict.fromkeys(keys))


def expected_seconds(cell: Cell, evaluations: tuple[str, ...], peers: list[Cell],
                     here: tuple[str, str] | None = None,
                     at_least: bool = False) -> float | None:
    """The seconds the cell still needs on this machine (pretraining left, then its missing
    evaluations), from measurements made here (see the module docstring); None where some
    part has no measurement yet, or with ``at_least``, a lower bound: the parts measured
    (None where none is)."""
    here = here or _this_machine()
    local = [p for p in peers if p.na is None and _ran_here(p.path, here)]
    seconds, measured = 0.0, False
    if cell.method != SUPERVISED and not pretrained(cell):
        done, rate = progress_of(cell) if _ran_here(cell.path, here) else (0, None)
        if rate is None:
            same = [r for p in local if p.method == cell.method
                    and (r := progress_of(p)[1]) is not None]
            rate = _median(same) or _median([r for p in local
                                             if (r := progress_of(p)[1]) is not None])
        if rate is None:
            if not at_least:
                return None
        else:
            seconds += max(cell.cfg.train.rounds - done, 0) / rate
            measured = True
    for key in _missing_evaluations(cell, evaluations):
        took = {p.method: [] for p in local}
        for p in local:
            entry = RunDir(p.path).summary().get("evaluations", {}).get(key)
            if entry is not None and "seconds" in entry:
                took[p.method].append(float(entry["seconds"]))
        known = _median(took.get(cell.method, [])) or _median(
            [s for values in took.values() for s in values])
        if known is None:
            if not at_least:
                return None
        else:
            seconds += known
            measured = True
    return seconds if measured or not at_least else None


def reason_not_to_start(cell: Cell, evaluations: tuple[str, ...], peers: list[Cell],
                        budget: Budget) -> str | None:
    """Why the cell should not start now (the budget is spent, or, unless the budget fills
    its time, its expected time does not fit in what is left), or None."""
    left = budget.left()
    if left <= 0:
        return "the time budget is spent"
    if budget.deadline is None or budget.fill:
        return None
    expected = expected_seconds(cell, evaluations, peers)
    if expected is not None and expected > left:
        return (f"expected to need {expected / 60:.1f} min here, {left / 60:.1f} min of the "
                f"budget left")
    least = None if expected is not None else expected_seconds(cell, evaluations, peers,
                                                               at_least=True)
    if least is not None and least > left:  # an evaluation not measured yet only adds
        return (f"expected to need at least {least / 60:.1f} min here, {left / 60:.1f} min "
                f"of the budget left")
    return None


# ------------------------------------------------------------------------------ the pool


def is_busy(cell: Cell) -> bool:
    """Whether another process holds the cell's lock right now."""
    if not cell.path.is_dir():
        return False
    try:
        with RunDir(cell.path).lock():
            return False
    except RunDirBusy:
        return True


def outcome_of(cell: Cell, evaluations: tuple[str, ...], returncode: int) -> str:
    """What a finished cell process did, from the cell's records and its exit status."""
    if not _missing_evaluations(cell, evaluations):
        return "finished"
    metrics = RunDir(cell.path).metrics()
    last = metrics[-1] if metrics else {}
    if returncode in (0, 130) and "stopped" in last:  # 130: stopped on a signal (dcco.cli)
        return f"stopped at round {last['round']} of {cell.cfg.train.rounds}"
    if returncode in (0, 130):
        return ("unfinished (busy in another process, stopped before an evaluation, or "
                "interrupted)")
    return f"failed (exit status {returncode})"


@dataclass
class _Running:
    cell: Cell
    process: subprocess.Popen
    started: float
    log: Path


def run_pool(cells: list[Cell], evaluations: tuple[str, ...], jobs: int, budget: Budget,
             command: Callable[[Cell], list[str]], say: Callable[[str], None], logs: Path,
             peers: list[Cell] | None = None, poll: float = 1.0, status_every: float = 60.0,
             grace: float | None = None, env: dict[str, str] | None = None,
             stop: Callable[[], str | None] | None = None) -> dict[str, str]:
    """Run ``cells`` as up to ``jobs`` processes at once within ``budget``.

    Args:
        cells: the cells to run, in order (n/a cells are left out by the caller).
        evaluations: the grid's evaluations (to tell a finished cell).
        jobs: processes at once, ≥ 1.
        budget: the deadline; every process gets it and stops itself at a checkpoint.
        command: the command line of one cell's process (it must honour the deadline).
        say: where progress lines go: one per cell started and finished, and one every
            ``status_every`` seconds with the cells running, their rounds per second together
            and the time left.
        logs: folder of the processes' output, one ``<cell>.log`` each.
        peers: every cell of the grid, for the estimates (default: ``cells``).
        poll: seconds between looks at the processes.
        grace: seconds after the deadline before a process that has not stopped is
            interrupted (SIGINT; SIGKILL 30 s later); default max(120, 5 % of the budget).
        env: the processes' environment (default: this one's).
        stop: asked every ``poll`` seconds; once it gives a reason (the command was
            interrupted), no further cell starts and each running process is asked to stop
            at its next checkpoint by its stop file (``<logs>/<cell>.stop``, named in its
            environment by ``STOP_FILE_ENV``; ``dcco.cli.Interrupts`` reads it). A
            ``KeyboardInterrupt`` here (a second signal) stops them at once (``_interrupt``).

    Returns:
        Cell folder name → outcome ("finished", "stopped at round r of R", "not started: …",
        "busy in another process", "failed …").
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    peers = peers or cells
    logs.mkdir(parents=True, exist_ok=True)
    pending, running, outcomes = list(cells), [], {}
    total = len(pending)
    if grace is None:
        grace = max(120.0, 0.05 * max(budget.left(), 0.0)) if budget.deadline else 0.0
    last_status, stopping = time.monotonic(), False
    try:
        while pending or running:
            if stop is not None and not stopping and (reason := stop()) is not None:
                stopping = True
                for cell in pending:
                    outcomes[cell.path.name] = f"not started: {reason}"
                pending.clear()
                for r in running:
                    _stop_file(logs, r.cell).touch()
                say(f"{reason}: {len(running)} running cells stop at their next checkpoint")
            for r in [r for r in running if r.process.poll() is not None]:
                running.remove(r)
                outcome = outcome_of(r.cell, evaluations, r.process.returncode)
                outcomes[r.cell.path.name] = outcome
                say(f"[{r.cell.path.name}] {outcome} after "
                    f"{(time.monotonic() - r.started) / 60:.1f} min ({len(outcomes)} of "
                    f"{total} done)" + ("" if outcome == "finished" else f"; log {r.log}"))
            while pending and len(running) < jobs:
                cell = pending.pop(0)
                reason = reason_not_to_start(cell, evaluations, peers, budget)
                if reason is None and is_busy(cell):
                    reason = "busy in another process"
                if reason is not None:
                    outcomes[cell.path.name] = (reason if reason.startswith("busy")
                                                else f"not started: {reason}")
                    say(f"[{cell.path.name}] {outcomes[cell.path.name]}")
                    continue
                log = logs / f"{cell.path.name}.log"
                _stop_file(logs, cell).unlink(missing_ok=True)
                cell_env = (env if env is not None else dict(os.environ)) | {
                    STOP_FILE_ENV: str(_stop_file(logs, cell))}
                with open(log, "a") as fh:
                    process = subprocess.Popen(command(cell), stdout=fh,
                                               stderr=subprocess.STDOUT, env=cell_env)
                running.append(_Running(cell, process, time.monotonic(), log))
                say(f"[{cell.path.name}] started ({len(running)} running)")
            if running and time.monotonic() - last_status >= status_every:
                last_status = time.monotonic()
                say(status_line(running, len(pending), budget))
            if budget.deadline is not None and budget.left() < -grace:
                _interrupt(running)
            if pending or running:
                time.sleep(poll)
    except KeyboardInterrupt:
        _interrupt(running)
        raise
    return outcomes


def status_line(running: list[_Running], pending: int, budget: Budget) -> str:
    """One line: the cells running with their rounds, rounds/s together, time left."""
    parts, together = [], 0.0
    for r in running:
        done, rate = progress_of(r.cell)
        together += rate or 0.0
        parts.append(f"{r.cell.path.name} {done}/{r.cell.cfg.train.rounds}")
    left = budget.left()
    when = "no time limit" if left == float("inf") else f"{max(left, 0) / 60:.1f} min left"
    return (f"{len(running)} running ({', '.join(parts)}), {together:.1f} rounds/s together, "
            f"{pending} waiting, {when}")


def _stop_file(logs: Path, cell: Cell) -> Path:
    return logs / f"{cell.path.name}.stop"


def _interrupt(running: list[_Running]) -> None:
    """Stop every running process at once: SIGINT twice, further apart than
    ``SAME_SIGNAL_S`` (the first only asks for a checkpoint), then SIGKILL to
    those still alive 30 s later (their checkpoints are atomic)."""
    for second in (False, True):
        alive = [r for r in running if r.process.poll() is None]
        if second and alive:
            time.sleep(SAME_SIGNAL_S + 0.5)
        for r in alive:
            if r.process.poll() is None:
                r.process.send_signal(signal.SIGINT)
    end = time.monotonic() + 30
    for r in running:
        try:
            r.process.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            r.process.kill()
            r.process.wait()


# ------------------------------------------------------------------------------ --jobs auto


def threads_per_job(jobs: int, device_type: str) -> dict[str, str]:
    """Environment for cell processes sharing a CPU: the cores split between them
    (``OMP_NUM_THREADS``), since N processes each using every core oversubscribe it; on an
    accelerator, nothing to change."""
    if device_type != "cpu":
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}


def jobs_for_memory(free_bytes: int, peak_bytes: int, cpus: int, most: int = 8) -> int:
    """How many cell processes fit one accelerator: its free memory over one cell's peak
    (with 15 % and 1 GiB per process kept back for the CUDA context and fragmentation),
    at most one per two CPU cores (each process's Python loop and data need a core), and at
    most ``most``."""
    per_cell = peak_bytes + (1 << 30)
    by_memory = int(0.85 * free_bytes // per_cell)
    return max(1, min(by_memory, max(cpus // 2, 1), most))


def auto_jobs(measure_peak: Callable[[], tuple[int, int]] | None, device_type: str) -> int:
    """``--jobs auto``: one process on a CPU (one process already uses every core; two
    processes measured 0.70× one on 2 cores, docs/distributed.md); on CUDA,
    ``jobs_for_memory`` from ``measure_peak()`` → (free bytes before, one cell's peak
    bytes), a few rounds of the first cell measured in a child process."""
    if device_type != "cuda" or measure_peak is None:
        return 1
    free, peak = measure_peak()
    return jobs_for_memory(free, peak, os.cpu_count() or 1)


def peak_memory(cfg: RunConfig, rounds: int = 3) -> tuple[int, int]:
    """(free accelerator bytes before, peak bytes reserved) of ``rounds`` rounds of ``cfg``,
    measured in a fresh process so that this one holds no accelerator memory afterwards."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_peak_memory_here, (cfg, rounds))


def _peak_memory_here(cfg: RunConfig, rounds: int) -> tuple[int, int]:
    import torch

    from dcco.core.disk_states import DiskClientStates
    from dcco.run.pretraining import Pretraining
    from dcco.run.splits import load_splits

    free, _ = torch.cuda.mem_get_info()
    # the clients' store (FedU, FedEMA, MoCo) sized for these rounds; on disk, a temporary
    # folder, deleted here (the pool ends this process without its finalizers)
    pt = Pretraining.of(cfg, load_splits(cfg)[0], rounds_to_run=rounds)
    try:
        for _ in range(min(rounds, cfg.train.rounds)):
            pt.step()
        torch.cuda.synchronize()
        return int(free), int(torch.cuda.max_memory_reserved())
    finally:
        if isinstance(pt.client_states, DiskClientStates):
            shutil.rmtree(pt.client_states.directory, ignore_errors=True)
