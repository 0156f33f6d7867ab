"""The GPU session's entry point, the 15-minute lease's plan run on the CPU with a tiny scale
and a two-minute budget, detached, through the same commands: it returns at once, every phase
is recorded with its outcome, the decisive cell starts first and stops at a checkpoint when the
budget ends, one small archive holds every record, and the unfinished cell's checkpoint comes
back in parts that ``unpack`` puts where the next lease resumes it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GRID = """
[grid]
methods = ["dcco", "centralized_cco"]
evaluations = ["linear@20"]
seeds = [0]

[[setting]]
name = "non-IID 4"
alpha = 0.0
samples_per_client = 4
clients_per_round = 4

[base.data]
dataset = "fashion_mnist"
data_dir = "{data_dir}"

[base.model]
widths = [4, 8, 8]
projector = [16, 16, 16]

[base.train]
rounds = 100000
clients_per_round = 4
knn_every = 0
log_every = 2
checkpoint_every = 2

[base.eval]
probe_steps = 10
knn_k = 5
knn_bank = 100
knn_queries = 50

[scale.gpu]
set = []

[scale.gpu-lars]
set = ['optim.optimizer="lars"', "optim.lr=0.5"]
"""

RECORDS = {"ladder": "records/round_cost_cpu.json", "profile": "records/round_profile_cpu.json",
           "pilot": "records/recipe_pilot.json"}


@pytest.mark.slow
def test_gpu_session__the_lease_plan_in_two_minutes_detached_on_the_cpu(tmp_path, tiny_fmnist):
    """The session as the device tool runs it: detached from a copy of the tree, which the
    next call's fresh copy of the working tree cannot disturb (here the tree it started in
    loses a module the moment it returns); the pilot picks a recipe by its rule, the
    precision check and the grid run at it, the decisive cell first."""
    import shutil

    repo = tmp_path / "repo"  # the working tree, as the device tool copies it
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache", ".gpu"))
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(data_dir=tiny_fmnist))
    out, cells = tmp_path / "session", tmp_path / "cells"
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    started = subprocess.run(
        [sys.executable, "benchmarks/gpu_session.py", "run", "--minutes", "2", "--device",
         "cpu", "--detach", "--grid", str(grid), "--scale", "gpu", "--grid-out", str(cells),
         "--ladder-scale", "tiny", "--precision-rounds", "4", "--pilot-scales", "gpu",
         "gpu-lars", "--pilot-rounds", "4", "--pilot-minutes", "0.75", "--out", str(out)],
        cwd=repo, capture_output=True, text=True, check=True, timeout=120, env=env)
    assert "in a new process session, from a copy of the tree" in started.stdout
    (repo / "src" / "dcco" / "run" / "checkpoint.py").unlink()  # the next call's copy: gone
    shutil.rmtree(repo / "benchmarks")
    # the session runs on after the command returned; its budget and each phase's grace
    # bound it, however busy the machine
    end = time.monotonic() + 900
    while not (out / "DONE").is_file() and time.monotonic() < end:
        time.sleep(1)
    assert (out / "DONE").is_file(), (out / "session.log").read_text()
    archive = Path((out / "DONE").read_text().strip())
    assert archive == out / "records.tar.gz" and archive.stat().st_size < 16 << 20
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        session = json.load(tar.extractfile("session.json"))
        machine = json.load(tar.extractfile("records/machine.json"))
        pilot = json.load(tar.extractfile("records/recipe_pilot.json"))
    assert session["tree"] == str((tmp_path / "session-tree").resolve())
    assert machine["cuda_available"] is False and machine["code"]["source_sha256"]
    phases = {p["phase"]: p for p in session["phases"]}
    assert list(phases) == ["ladder", "profile", "pilot", "precision", "grid"]
    assert phases["profile"]["outcome"] == "skipped: not asked for (0 minutes)"
    assert phases["ladder"]["minutes_allowed"] == pytest.approx(2 / 3)
    assert "--steps eager float32 --methods dcco contrastive_fedavg" in \
        phases["ladder"]["command"]
    assert phases["pilot"]["outcome"] == "ok", phases["pilot"]
    assert [c["scale"] for c in pilot["candidates"]] == ["gpu", "gpu-lars"]
    assert pilot["picked"] == session["scale"] and session["scale"] in ("gpu", "gpu-lars")
    assert f"--scale {session['scale']} --tag {session['scale']}" in \
        phases["precision"]["command"]
    assert f"--scale {session['scale']} " in phases["grid"]["command"]
    assert "--cells non-iid-4-dcco-s0 --cells centralized_cco-s0 --cells " \
        "non-iid-4-contrastive_fedavg-s0" in phases["grid"]["command"]
    for phase in session["phases"]:
        assert phase["outcome"] in ("ok", "interrupted at its time limit",
                                    "skipped: no time left",
                                    "skipped: not asked for (0 minutes)"), phase
        if phase["phase"] in RECORDS and phase["outcome"] == "ok":
            assert RECORDS[phase["phase"]] in names, phase
    assert session["archive"]["bytes"] > 0 and "ended" in session
    assert "session.log" in names
    # the decisive cell started first and stopped at a checkpoint (its rounds never end)
    first = cells / "non-iid-4-dcco-s0"
    assert f"cells/{first.name}/config.toml" in names
    stopped = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    summary = first / "summary.json"
    assert "stopped" in stopped[-1]
    assert not summary.is_file() or "final_loss" not in summary.read_text()
    parts = sorted(out.glob("checkpoints.tar.part*"))
    assert parts and all(p.stat().st_size <= 16 << 20 for p in parts)
    assert session["carry_budget_bytes"] > 0
    assert first.name in [c["cell"] for c in session["checkpoints"]["carried"]]
    assert session["checkpoints"]["left_behind"] == []  # tiny checkpoints

    # unpacked where the repository keeps records, the checkpoint where the cell resumes
    repo = tmp_path / "repo"
    done = subprocess.run([sys.executable, "benchmarks/gpu_session.py", "unpack", str(archive),
                           "--into", str(repo)], cwd=ROOT, check=True, capture_output=True,
                          text=True, timeout=60)
    placed = {p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()}
    stamp = session["started"][:16].replace(" ", "-").replace(":", "-")
    assert f"benchmarks/results/gpu_session_cpu-{stamp}.json" in placed
    carried = f"experiments/results/cells/{first.name}/checkpoint.safetensors"
    assert carried in placed and carried in done.stdout
    assert (repo / carried).read_bytes() == (first / "checkpoint.safetensors").read_bytes()
    assert not any(p.endswith(".log") for p in placed)
    assert f"benchmarks/results/recipe_pilot_cpu-{stamp}.json" in placed


def _session_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_session
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_session


def test_pack_checkpoints__the_most_advanced_that_fit_go__the_rest_are_named(tmp_path):
    gpu_session = _session_module()
    grid = tmp_path / "grid"
    for cell, rounds, size in (("a-s0", 300, 6000), ("b-s0", 200, 3000), ("c-s0", 100, 2000),
                               ("done-s0", 500, 1000)):
        (grid / cell).mkdir(parents=True)
        (grid / cell / "checkpoint.safetensors").write_bytes(b"x" * size)
        (grid / cell / "metrics.jsonl").write_text(
            json.dumps({"round": rounds, "loss": 1.0}) + "\n"
            + json.dumps({"round": rounds, "stopped": "time budget"}) + "\n")
    (grid / "done-s0" / "summary.json").write_text(json.dumps({"final_loss": 1.0}))
    out = tmp_path / "out"
    out.mkdir()
    record = gpu_session.pack_checkpoints(out, grid, budget=5500)
    # a-s0 is the most advanced but too large; b and c fit together; the finished cell stays
    assert [c["cell"] for c in record["carried"]] == ["b-s0", "c-s0"]
    assert record["left_behind"] == [{"cell": "a-s0", "bytes": 6000}]
    with tarfile.open(fileobj=io.BytesIO(
            b"".join(p.read_bytes() for p in sorted(out.glob("checkpoints.tar.part*"))))) as tar:
        assert sorted(tar.getnames()) == ["grid/b-s0/checkpoint.safetensors",
                                          "grid/c-s0/checkpoint.safetensors"]
    assert gpu_session.pack_checkpoints(out, grid, budget=100)["carried"] == []
    assert not list(out.glob("checkpoints.tar.part*"))


def test_carry_budget__what_the_device_tree_leaves_for_checkpoints():
    gpu_session = _session_module()
    tree = gpu_session.tree_bytes()
    assert 0 < tree < gpu_session.CARRY_LIMIT
    assert gpu_session.carry_budget() == max(
        0, gpu_session.CARRY_LIMIT - gpu_session.CARRY_MARGIN - tree)


def test_phase_shares__decided_once_on_a_gpu__asked_for_always():
    gpu_session = _session_module()
    committed = gpu_session.gpu_record("round_cost")
    assert committed is not None and committed.name.startswith("round_cost_nvidia")
    # the CPU (the dry run) always runs all three with their default shares
    assert gpu_session.phase_shares(9, False, None, None) == {
        "ladder": (3.0, None), "pilot": (2.25, None), "precision": (1.5, None)}
    assert gpu_session.phase_shares(2, False, None, None)["ladder"] == (2 / 3, None)
    # on a GPU, the committed records give their minutes to the cells
    on_gpu = gpu_session.phase_shares(9, True, None, None)
    assert on_gpu["ladder"] == (0.0, committed)
    # the precision check's record counts at any scale: the H100's, made at `gpu`, also
    # stands for the `gpu-warmup` grid that the third lease's pilot picked
    assert on_gpu["precision"][0] == 0.0
    assert on_gpu["precision"][1].name.startswith("precision_check_nvidia")
    pilot = gpu_session.gpu_record("recipe_pilot")  # none committed yet: the pilot runs
    assert on_gpu["pilot"] == ((0.0, pilot) if pilot else (2.25, None))
    # unless asked for
    assert gpu_session.phase_shares(9, True, 2.0, 1.0, 0.5) == {
        "ladder": (2.0, None), "pilot": (0.5, None), "precision": (1.0, None)}


def _archive(path: Path, session: dict, cells: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {"session.json": json.dumps(session).encode(), **cells}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_unpack__two_leases_of_one_day_keep_apart_and_a_record_is_never_overwritten(tmp_path):
    gpu_session = _session_module()
    repo = tmp_path / "repo"
    first = {"machine": "NVIDIA H100", "started": "2026-11-27 15:10:02"}
    second = {"machine": "NVIDIA H100", "started": "2026-11-27 17:02:33"}
    cell = "table1_fmnist-gpu/non-iid-4-dcco-s0/summary.json"
    a = _archive(tmp_path / "a.tar.gz", first, {cell: b'{"final_loss": 1}'})
    b = _archive(tmp_path / "b.tar.gz", second, {cell: b'{"final_loss": 2}'})
    assert gpu_session.main(["unpack", str(a), "--into", str(repo)]) == 0
    results = repo / "benchmarks" / "results"
    assert (results / "gpu_session_nvidia-h100-2026-11-27-15-10.json").is_file()
    # the second lease's cell would overwrite the first's: refused, and nothing is placed
    assert gpu_session.main(["unpack", str(b), "--into", str(repo)]) == 2
    assert not (results / "gpu_session_nvidia-h100-2026-11-27-17-02.json").exists()
    assert (repo / "experiments" / "results" / cell).read_bytes() == b'{"final_loss": 1}'
    # into a folder of its own, both are kept
    assert gpu_session.main(["unpack", str(b), "--into", str(repo), "--grid-folder",
                             "table1_fmnist-gpu-paper"]) == 0
    assert (results / "gpu_session_nvidia-h100-2026-11-27-17-02.json").is_file()
    kept = repo / "experiments" / "results" / "table1_fmnist-gpu-paper" / Path(cell).relative_to(
        "table1_fmnist-gpu")
    assert kept.read_bytes() == b'{"final_loss": 2}'
    # the same archive again changes nothing and is accepted
    assert gpu_session.main(["unpack", str(a), "--into", str(repo)]) == 0


def test_recipe_pilot__the_rule_picks_the_best_uncollapsed_and_the_first_of_a_tie():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from recipe_pilot import pick
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    runs = [{"scale": "gpu", "knn": 0.700, "final_loss": 400.0, "rounds": 300},
            {"scale": "gpu-paper", "knn": 0.800, "final_loss": 900.0, "rounds": 300,
             "collapse_warning": "collapse at round 40: ..."},
            {"scale": "gpu-lars", "knn": 0.704, "final_loss": 380.0, "rounds": 300},
            {"scale": "gpu-warmup", "knn": 0.71, "final_loss": float("nan"), "rounds": 300}]
    assert pick(runs)[0] == "gpu"          # gpu-lars is within 0.5 points: the first wins
    runs[2]["knn"] = 0.72
    assert pick(runs)[0] == "gpu-lars"     # the collapsed and the diverged never win
    chosen, why = pick([{"scale": "gpu", "why_not": "collapse at round 40"}])
    assert chosen is None and "collapse at round 40" in why


def test_cell_order__every_name_is_a_cell_of_the_gpu_grid__seeds_of_non_iid_4_before_16(
        tmp_path):
    from dcco.reproduce.grid import load_grid
    from dcco.reproduce.plan import plan_cells

    gpu_session = _session_module()
    names = {c.path.name for c in plan_cells(
        load_grid(ROOT / "experiments" / "table1_fmnist.toml", "gpu-warmup"), tmp_path)}
    named = [c for c in gpu_session.CELL_ORDER if "*" not in c]
    assert [c for c in named if c not in names] == []  # a misspelt name would never run
    assert len(set(named)) == len(named)
    assert named[:2] == ["non-iid-4-dcco-s0", "centralized_cco-s0"]
    last_seed = max(named.index(f"non-iid-4-{m}-s2") for m in ("dcco", "contrastive_fedavg"))
    assert last_seed < named.index("non-iid-16-dcco-s0")
