"""Cells within a time budget and side by side: a stopped cell is unfinished at a checkpoint,
never half-written, and the next command resumes it to the records of an uninterrupted run;
the estimates that decide whether a cell starts; `--jobs` and `--time-budget` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.grids import tiny_grid
from safetensors.torch import load_file

from dcco.cli import main
from dcco.reproduce import cell_accuracy, load_grid, plan_cells, run_cell
from dcco.reproduce.pool import (
    TIME_BUDGET,
    Budget,
    auto_jobs,
    expected_seconds,
    jobs_for_memory,
    reason_not_to_start,
    threads_per_job,
)
from dcco.run.loop import run_pretraining
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import RunDir, code_version
from dcco.run.splits import load_splits


def _grid(tmp_path: Path, data_dir: Path, rounds: int) -> Path:
    return tiny_grid(tmp_path, data_dir, rounds, ["dcco", "supervised"])


def _pretrain(cfg, run, train, test, resume, stop):
    return run_pretraining(cfg, run, train, test, resume, stop=stop)


def _loss_records(run: RunDir) -> list[dict]:
    """The metrics an uninterrupted run also writes: logged rounds without their timing."""
    return [{k: v for k, v in r.items() if k != "rounds_per_sec"} for r in run.metrics()
            if "loss" in r]


def _same_run(a: Path, b: Path) -> None:
    """Two finished cells hold the same records: logged losses, weights and optimiser state,
    final loss and evaluation."""
    ra, rb = RunDir(a), RunDir(b)
    assert _loss_records(ra) == _loss_records(rb)
    wa, wb = load_file(ra.checkpoint_path), load_file(rb.checkpoint_path)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = ra.summary(), rb.summary()
    assert sa["final_loss"] == sb["final_loss"] and sa["rounds"] == sb["rounds"]
    assert sa["evaluations"]["linear@20"]["accuracy"] == sb["evaluations"]["linear@20"][
        "accuracy"]


def test_run_cell__stopped_at_a_checkpoint_then_resumed_equals_an_uninterrupted_run(
        tmp_path, tiny_fmnist):
    grid = load_grid(_grid(tmp_path, tiny_fmnist, 8), "tiny")
    cell, = (c for c in plan_cells(grid, tmp_path / "stopped") if c.method == "dcco")
    ref, = (c for c in plan_cells(grid, tmp_path / "whole") if c.method == "dcco")
    splits = load_splits(grid.base)
    said: list[str] = []

    def stop() -> str | None:  # once round 4 is logged, as a deadline would
        logged = [r["round"] for r in RunDir(cell.path).metrics() if "loss" in r]
        return TIME_BUDGET if logged and logged[-1] >= 4 else None

    assert run_cell(cell, grid.evaluations, splits, _pretrain, said.append, stop=stop) == \
        "stopped"
    run = RunDir(cell.path)
    # unfinished and never half-written: no summary, a checkpoint at the round it stopped
    assert run.summary() == {} and run.checkpoint_path.is_file()
    assert [r for r in run.metrics() if "stopped" in r] == [{"round": 4,
                                                             "stopped": TIME_BUDGET}]
    assert max(r["round"] for r in run.metrics()) == 4
    assert cell_accuracy(cell, "linear@20") is None
    assert any("stopped at round 4 of 8 (time budget)" in s for s in said)
    # a stop that still holds starts nothing
    assert run_cell(cell, grid.evaluations, splits, _pretrain, said.append,
                    stop=lambda: TIME_BUDGET) == "stopped"
    assert "not resumed: time budget" in said[-1]

    assert run_cell(cell, grid.evaluations, splits, _pretrain, said.append) == "finished"
    assert run_cell(ref, grid.evaluations, splits, _pretrain, said.append) == "finished"
    _same_run(cell.path, ref.path)


def test_run_cell__a_stop_before_an_evaluation_leaves_the_cell_unfinished(tmp_path,
                                                                          tiny_fmnist):
    grid = load_grid(_grid(tmp_path, tiny_fmnist, 2), "tiny")
    cell, = (c for c in plan_cells(grid, tmp_path / "out") if c.method == "dcco")
    splits = load_splits(grid.base)
    said: list[str] = []
    stop = (lambda: TIME_BUDGET if RunDir(cell.path).summary().get("rounds") == 2 else None)
    assert run_cell(cell, grid.evaluations, splits, _pretrain, said.append, stop=stop) == \
        "stopped"
    assert RunDir(cell.path).summary()["rounds"] == 2
    assert cell_accuracy(cell, "linear@20") is None
    assert said[-1].endswith("linear@20 not started: time budget")
    assert run_cell(cell, grid.evaluations, splits, _pretrain, said.append) == "finished"
    assert cell_accuracy(cell, "linear@20") is not None


def _fake_cell(cell, rounds_logged: int | None, rate: float | None, machine: dict,
               evaluations: dict | None = None, finished: bool = False):
    cell.path.mkdir(parents=True)
    (cell.path / "version.json").write_text(json.dumps(machine))
    run = RunDir(cell.path)
    if rate is not None:
        run.append_metrics({"round": rounds_logged, "loss": 1.0, "rounds_per_sec": rate})
    if finished or evaluations:
        run.update_summary(rounds=cell.cfg.train.rounds if finished else None,
                           evaluations=evaluations or {})


def test_expected_seconds__from_what_was_measured_on_this_machine(tmp_path, tiny_fmnist):
    grid = load_grid(_grid(tmp_path, tiny_fmnist, 1000), "tiny")
    grid = replace(grid, settings=grid.settings + (replace(grid.settings[0], name="IID 4",
                                                           samples_per_client=4),))
    cells = {c.path.name: c for c in plan_cells(grid, tmp_path / "out")}
    here = code_version()
    info = {"cpu": here["cpu"], "gpu": here["gpu"]}
    elsewhere = {"cpu": "another CPU", "gpu": "none"}
    a, b, sup = cells["iid-2-dcco-s0"], cells["iid-4-dcco-s0"], cells["supervised-s0"]
    evaluations = grid.evaluations
    assert expected_seconds(a, evaluations, list(cells.values())) is None  # nothing measured
    # a cell measured elsewhere tells nothing about this machine
    _fake_cell(b, 1000, 500.0, elsewhere,
               {"linear@20": {"accuracy": 0.5, "seconds": 7.0, "revision": 1}}, True)
    assert expected_seconds(a, evaluations, list(cells.values())) is None
    # measured here: 400 of 1000 rounds at 10 rounds/s; its evaluation not yet: at least 60 s
    _fake_cell(a, 400, 10.0, info)
    assert expected_seconds(a, evaluations, list(cells.values())) is None
    assert expected_seconds(a, evaluations, list(cells.values()), at_least=True) == \
        pytest.approx(60.0)
    assert "expected to need at least 1.0 min here, 0.5 min of the budget left" in \
        reason_not_to_start(a, evaluations, list(cells.values()), Budget.minutes(0.5))
    # and an evaluation of 7 s measured here
    (b.path / "version.json").write_text(json.dumps(info))
    assert expected_seconds(a, evaluations, list(cells.values())) == pytest.approx(
        600 / 10.0 + 7.0)
    # supervised cells: only their evaluation, which no cell has measured here yet
    assert expected_seconds(sup, evaluations, list(cells.values())) is None

    clock = [1000.0]
    budget = Budget.minutes(1.0, clock=lambda: clock[0])
    assert budget.left() == 60.0 and budget.stop() is None
    assert "expected to need 1.1 min here, 1.0 min of the budget left" in reason_not_to_start(
        a, evaluations, list(cells.values()), budget)
    filled = replace(budget, fill=True)  # --fill: it starts, to stop at a checkpoint
    assert reason_not_to_start(a, evaluations, list(cells.values()), filled) is None
    clock[0] -= 10  # 70 s left
    assert reason_not_to_start(a, evaluations, list(cells.values()), budget) is None
    clock[0] += 80
    assert budget.stop() == TIME_BUDGET
    assert reason_not_to_start(a, evaluations, list(cells.values()),
                               budget) == "the time budget is spent"
    assert reason_not_to_start(a, evaluations, list(cells.values()),
                               filled) == "the time budget is spent"
    assert reason_not_to_start(a, evaluations, list(cells.values()), Budget()) is None


def test_jobs__auto_from_memory_and_cores():
    gib = 1 << 30
    assert jobs_for_memory(free_bytes=78 * gib, peak_bytes=4 * gib, cpus=16) == 8
    assert jobs_for_memory(free_bytes=78 * gib, peak_bytes=4 * gib, cpus=6) == 3
    assert jobs_for_memory(free_bytes=20 * gib, peak_bytes=4 * gib, cpus=16) == 3
    assert jobs_for_memory(free_bytes=2 * gib, peak_bytes=4 * gib, cpus=16) == 1
    assert auto_jobs(None, "cpu") == 1
    assert auto_jobs(lambda: (78 * gib, 4 * gib), "cpu") == 1  # one process uses every core
    measured = auto_jobs(lambda: (78 * gib, 4 * gib), "cuda")
    assert 1 <= measured <= 8
    assert threads_per_job(2, "cuda") == {}
    assert int(threads_per_job(64, "cpu")["OMP_NUM_THREADS"]) == 1


def _rounds_per_second(grid_path: Path) -> float:
    """Tiny rounds per second of the grid's dcco cell on this machine, now, on one thread
    (as a cell process of two on this CPU runs)."""
    grid = load_grid(grid_path, "tiny")
    cell, = (c for c in plan_cells(grid, grid_path.parent / "probe") if c.method == "dcco")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pt = Pretraining.of(cell.cfg, load_splits(grid.base)[0])
        pt.step()
        best = 0.0
        for _ in range(3):  # the fastest of three: a busy moment only slows a reading
            start = time.perf_counter()
            for _ in range(5):
                pt.step()
            best = max(best, 5 / (time.perf_counter() - start))
        return best
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_reproduce_jobs__budget_stops_a_cell_and_the_next_command_resumes_it(tmp_path,
                                                                              tiny_fmnist,
                                                                              capsys):
    """Real processes, sized by this machine's speed now (so that a busy machine only makes
    the stop more certain): the budget gives the dcco cell's process its start-up and a few
    seconds, and the cell needs longer than the whole budget. A budget that ended before the
    cell's process had trained a round (its start-up slower than the probe's, the machine
    busier than when it was measured) is doubled, and a cell that finished within it (the
    machine quieter than when it was measured) gets twice the rounds; the command then runs
    again from nothing, at most four times: the stop of a cell that trains is what is
    tested."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import dcco.cli, dcco.run.loop, dcco.reproduce"],
                   check=True)
    startup = time.perf_counter() - start
    rate = _rounds_per_second(_grid(tmp_path, tiny_fmnist, 10))
    # cannot finish within the budget, even at 1.6 x the fastest speed measured (CI saw a
    # cell process run 1.9 x faster than a mean of 10 rounds here, on a busy machine)
    budget, speedup = 2 * startup + 5, 1.6
    for attempt in range(4):
        rounds = 2 * int(speedup * rate * (budget + 4) / 2)
        grid = _grid(tmp_path, tiny_fmnist, rounds)
        out = tmp_path / f"out-{attempt}"
        args = ["reproduce", str(grid), "--scale", "tiny", "--out", str(out), "--jobs", "2",
                "--no-progress"]
        assert main(args + ["--time-budget", f"{budget / 60:.4f}"]) == 0
        said = capsys.readouterr().out
        dcco_cell, supervised = out / "iid-2-dcco-s0", out / "supervised-s0"
        run = RunDir(dcco_cell)
        if run.summary():  # it ran faster than measured and finished: more rounds
            speedup *= 2
        elif any("loss" in r for r in run.metrics()) or run.checkpoint_path.is_file():
            break  # the cell trained before its budget ended
        else:
            budget *= 2
    stops = [r for r in run.metrics() if "stopped" in r]
    assert run.summary() == {} and run.checkpoint_path.is_file(), said
    assert len(stops) == 1 and 0 < stops[0]["round"] < rounds and stops[0]["stopped"] == \
        TIME_BUDGET
    assert f"[iid-2-dcco-s0] stopped at round {stops[0]['round']} of {rounds}" in said
    assert "[supervised-s0] finished" in said
    assert "1 of 2 cells finished; the same command resumes the others" in said
    assert "supervised@20" in RunDir(supervised).summary()["evaluations"]
    assert (out / "results.md").is_file() and (out / ".logs" / "iid-2-dcco-s0.log").is_file()

    assert main(args) == 0
    said = capsys.readouterr().out
    assert "[iid-2-dcco-s0] finished" in said and "2 of 2 cells finished" in said
    # the same records as an uninterrupted run of the cell (in a process of its own, on the
    # same thread count)
    assert main(["reproduce", str(grid), "--scale", "tiny", "--out", str(tmp_path / "whole"),
                 "--jobs", "2", "--cells", "iid-2-dcco-s0", "--no-progress"]) == 0
    _same_run(dcco_cell, tmp_path / "whole" / "iid-2-dcco-s0")


def test_reproduce__bad_jobs_and_budgets_are_refused_by_name(tmp_path, tiny_fmnist, capsys):
    grid = _grid(tmp_path, tiny_fmnist, 2)
    base = ["reproduce", str(grid), "--scale", "tiny", "--out", str(tmp_path / "out"),
            "--no-progress"]
    assert main(base + ["--jobs", "0"]) == 2
    assert "--jobs must be a whole number >= 1 or 'auto', got '0'" in capsys.readouterr().err
    assert main(base + ["--jobs", "many"]) == 2
    assert main(base + ["--time-budget", "0"]) == 2
    assert "--time-budget must be > 0 minutes" in capsys.readouterr().err
    assert main(base + ["--fill"]) == 2
    assert "--fill fills a time budget: give --time-budget" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_reproduce_jobs__a_signal_stops_the_running_cells_at_a_checkpoint(tmp_path, tiny_fmnist):
    """``dcco reproduce --jobs 2`` started in the background from a script (SIGINT ignored):
    one ``kill -INT`` to it reaches its cells (by their stop files), each stops at a
    checkpoint with an ``interrupted`` record, and the command exits 130 (resuming a
    stopped cell is the time budget's test above)."""
    import os
    import signal

    grid = _grid(tmp_path, tiny_fmnist, 100_000)  # cannot finish before the signal
    out = tmp_path / "out"
    line = ["bash", "-c", 'trap "" INT; exec "$@"', "-",  # SIGINT ignored, as nohup & has it
            sys.executable, "-m", "dcco", "reproduce", str(grid), "--scale", "tiny", "--out",
            str(out), "--jobs", "2", "--no-progress"]
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.Popen(line, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    metrics = out / "iid-2-dcco-s0" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # wait for a few logged rounds
        if metrics.is_file() and sum(1 for _ in metrics.open()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    said, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    run = RunDir(out / "iid-2-dcco-s0")
    stops = [r for r in run.metrics() if "stopped" in r]
    assert [s["stopped"] for s in stops] == ["interrupted"] and run.checkpoint_path.is_file()
    assert "interrupted: " in said and "running cells stop at their next checkpoint" in said
    assert f"[iid-2-dcco-s0] stopped at round {stops[0]['round']} of 100000" in said


def test_outcome_of__only_a_last_stop_record_is_a_stop_and_exit_130_is_unfinished(tmp_path,
                                                                                  tiny_fmnist):
    from dcco.reproduce.pool import outcome_of

    grid = load_grid(_grid(tmp_path, tiny_fmnist, 10), "tiny")
    cell, = (c for c in plan_cells(grid, tmp_path / "out") if c.method == "dcco")
    run = RunDir.create(cell.path, cell.cfg)
    run.append_metrics({"round": 4, "stopped": "time budget"})
    assert outcome_of(cell, grid.evaluations, 130) == "stopped at round 4 of 10"
    run.append_metrics({"round": 6, "loss": 1.0})  # resumed, then ended without a record
    said = outcome_of(cell, grid.evaluations, 130)
    assert said.startswith("unfinished") and "interrupted" in said
    assert outcome_of(cell, grid.evaluations, -9) == "failed (exit status -9)"
