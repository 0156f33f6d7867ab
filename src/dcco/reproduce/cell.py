"""Running a cell: pretraining (or resuming) it and its missing evaluations, under its lock;
and what a cell has recorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from dcco.data.paired import Dataset
from dcco.errors import UserError
from dcco.evaluate import StepCallback
from dcco.reproduce.grid import SUPERVISED, Grid
from dcco.reproduce.plan import Cell
from dcco.run.collapse_response import pretraining_ended
from dcco.run.evaluations import eval_config_for, eval_key, evaluate_model, pretrained_model
from dcco.run.rundir import RunDir, record_split

Stop = Callable[[], "str | None"]
"""Asked between rounds and before each evaluation whether to stop now: a reason (e.g. "time
budget"), or None to go on."""


def run_cell(cell: Cell, evaluations: tuple[str, ...], splits: tuple[Dataset, Dataset],
             pretrain: Callable[..., dict], say: Callable[[str], None],
             progress: StepCallback | None = None, stop: Stop | None = None) -> str:
    """Pretrain (or resume) one cell and run its missing evaluations, holding the cell's
    lock (``RunDirBusy`` if another process holds it); ``progress`` is told how each
    evaluation advances.

    ``pretrain(cfg, run, train, test, resume, stop)`` runs the pretraining
    (``dcco.run.loop.run_pretraining``'s arguments). When ``stop`` gives a reason, pretraining
    ends at a checkpoint (``pretraining_loop``) and no further evaluation starts; the cell is
    left unfinished, and the next call resumes it.

    A cell whose training diverges (``Diverged`` from ``Pretraining.check_finite``)
    gets a ``{"round", "diverged"}`` record in its metrics and is not run again: training is
    deterministic, so a rerun would diverge alike (delete the cell's folder to retry it with
    other settings).

    Returns:
        "finished", "stopped" (the stop's reason is in the cell's metrics), "diverged" or
        "n/a".
    """
    if cell.na is not None:
        return "n/a"
    cell.path.mkdir(parents=True, exist_ok=True)
    with RunDir(cell.path).lock():
        run, existed = RunDir.open_or_create(cell.path, cell.cfg)
        if not existed:
            record_split(run, cell.cfg, *splits)
        return _run_cell(cell, run, existed, evaluations, splits, pretrain, say, progress,
                         stop or (lambda: None))


def _run_cell(cell: Cell, run: RunDir, existed: bool, evaluations: tuple[str, ...],
              splits: tuple[Dataset, Dataset], pretrain: Callable[..., dict],
              say: Callable[[str], None], progress: StepCallback | None, stop: Stop) -> str:
    from dcco.evaluate import labelled_subset, supervised_from_scratch
    from dcco.run.device_plan import resolve_device
    from dcco.run.pretraining import Diverged

    train, test = splits
    device = resolve_device(cell.cfg.train.device)
    if cell.method != SUPERVISED and not pretrained(cell):
        if (record := divergence(run)) is not None:
            say(f"[{cell.path.name}] diverged before, at round {record['round']}; not run "
                f"again (delete its folder to retry)")
            return "diverged"
        if (reason := stop()) is not None:
            say(f"[{cell.path.name}] not resumed: {reason}")
            return "stopped"
        say(f"[{cell.path.name}] pretraining" + (" (resuming)" if existed else ""))
        try:
            record = pretrain(cell.cfg, run, train, test, existed, stop)
        except Diverged as e:
            run.append_metrics({"round": e.round, "diverged": str(e)})
            say(f"[{cell.path.name}] diverged: {e}")
            return "diverged"
        if record.get("stopped"):
            say(f"[{cell.path.name}] stopped at round {record['rounds']} of "
                f"{cell.cfg.train.rounds} ({record['stopped']}); the next run resumes it")
            return "stopped"
    done = _current(run.summary())
    for e in cell.evaluations(evaluations):
        protocol, labels = e.split("@")[0], int(e.split("@")[1])
        key = eval_key(SUPERVISED if cell.method == SUPERVISED else protocol, labels)
        if key in done:  # one supervised run serves every protocol with these labels
            continue
        if (reason := stop()) is not None:
            say(f"[{cell.path.name}] {e} not started: {reason}")
            return "stopped"
        ecfg = eval_config_for(cell.cfg, labels)
        if cell.method == SUPERVISED:
            say(f"[{cell.path.name}] supervised from scratch, {labels} labels"
                + _stale_note(run, key))
            ids = labelled_subset(train.labels, labels, train.num_classes, cell.seed)
            result = supervised_from_scratch(cell.cfg.model, train.images.shape[1], train, test,
                                             ids, ecfg, cell.seed, device, progress)
            run.update_summary(method=SUPERVISED, evaluations={key: asdict(result)})
        else:
            what = {"retrieval": "test pairs", "knn": "bank images", "case_linear": "labelled cases",
                    "case_finetune": "labelled cases"}.get(protocol, "labels")
            if not run.checkpoint_path.is_file():  # e.g. a checkout that keeps small files only
                raise UserError(
                    f"[{cell.path.name}] its pretraining finished, but its checkpoint "
                    f"{run.checkpoint_path} is gone, so its {e} evaluation cannot run; delete "
                    f"the folder {cell.path} to pretrain the cell again (at the thread count "
                    f"of its version.json it comes back bit for bit)")
            say(f"[{cell.path.name}] {protocol} evaluation, {labels} {what}"
                + _stale_note(run, key))
            model = pretrained_model(cell.cfg, run, train.input_shapes, device)
            result = evaluate_model(model, protocol, ecfg, cell.seed, train, test, device,
                                    progress, cell.method)
            run.update_summary(evaluations={key: asdict(result)})
        done = _current(run.summary())
    return "finished"


def divergence(run: RunDir) -> dict | None:
    """The cell's ``{"round", "diverged"}`` record, if its training diverged."""
    return next((r for r in run.metrics() if "diverged" in r), None)


def pretrained(cell: Cell) -> bool:
    """Whether the cell's pretraining has finished: its summary records every round, or a
    stop at its collapse (``train.on_collapse``)."""
    return pretraining_ended(RunDir(cell.path).summary(), cell.cfg.train.rounds)


def _stale_note(run: RunDir, key: str) -> str:
    recorded = run.summary().get("evaluations", {})
    return (" (again: the recorded one predates the protocol's current revision)"
            if key in recorded else "")


def _current(summary: dict) -> dict[str, dict]:
    """A summary's evaluations made under their protocol's current revision."""
    from dcco.evaluate import is_current

    return {k: e for k, e in summary.get("evaluations", {}).items() if is_current(e)}


def cell_accuracy(cell: Cell, evaluation: str) -> float | None:
    """The recorded accuracy of one evaluation of a cell, or None if not run yet."""
    if cell.na is not None or not (cell.path / "summary.json").is_file():
        return None
    protocol, labels = evaluation.split("@")
    key = eval_key(SUPERVISED if cell.method == SUPERVISED else protocol, int(labels))
    entry = _current(RunDir(cell.path).summary()).get(key)
    return None if entry is None else entry["accuracy"]


def is_complete(grid: Grid, cells: list[Cell]) -> bool:
    return all(c.na is not None or cell_accuracy(c, e) is not None
               for c in cells for e in c.evaluations(grid.evaluations))

