"""The GPU session's entry point, run on the CPU with a tiny scale and a one-minute budget,
detached: it returns at once, every phase is recorded with its outcome, the grid's cells stop
within the budget, and one small archive holds every record."""

from __future__ import annotations

import json
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
rounds = 6
clients_per_round = 4
knn_every = 0
log_every = 2

[base.eval]
probe_steps = 10
knn_k = 5
knn_bank = 100
knn_queries = 50

[scale.gpu]
set = []
"""

RECORDS = {"ladder": "records/round_cost_cpu.json", "profile": "records/round_profile_cpu.json",
           "precision": "records/precision_check_cpu.json"}


@pytest.mark.slow
def test_gpu_session__one_minute_detached_on_the_cpu(tmp_path, tiny_fmnist):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(data_dir=tiny_fmnist))
    out, cells = tmp_path / "session", tmp_path / "cells"
    started = subprocess.run(
        [sys.executable, "benchmarks/gpu_session.py", "run", "--minutes", "1", "--device",
         "cpu", "--detach", "--grid", str(grid), "--scale", "gpu", "--grid-out", str(cells),
         "--ladder-scale", "tiny", "--ladder-steps", "eager float32", "--profile-warmup", "1",
         "--precision-rounds", "4", "--ladder-minutes", "0.15", "--profile-minutes", "0.15",
         "--precision-minutes", "0.2", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    assert "in a new process session" in started.stdout
    # the session runs on after the command returned; its budget and each phase's grace
    # bound it, however busy the machine
    end = time.monotonic() + 600
    while not (out / "DONE").is_file() and time.monotonic() < end:
        time.sleep(1)
    assert (out / "DONE").is_file(), (out / "session.log").read_text()
    archive = Path((out / "DONE").read_text().strip())
    assert archive == out / "records.tar.gz" and archive.stat().st_size < 16 << 20
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        session = json.load(tar.extractfile("session.json"))
        machine = json.load(tar.extractfile("records/machine.json"))
    assert machine["cuda_available"] is False and machine["code"]["source_sha256"]
    assert [p["phase"] for p in session["phases"]] == ["ladder", "profile", "precision",
                                                       "grid"]
    for phase in session["phases"]:
        assert phase["outcome"] in ("ok", "interrupted at its time limit",
                                    "skipped: no time left"), phase
        if phase["phase"] in RECORDS and phase["outcome"] == "ok":
            assert RECORDS[phase["phase"]] in names, phase
    assert session["archive"]["bytes"] > 0 and "ended" in session
    # every cell the grid touched is in the archive with its small files, none half-written:
    # finished (a summary with every round) or unfinished (no summary)
    touched = [c for c in cells.iterdir() if c.is_dir() and not c.name.startswith(".")]
    for cell in touched:
        assert f"cells/{cell.name}/config.toml" in names
        summary = cell / "summary.json"
        if summary.is_file():
            assert json.loads(summary.read_text()).get("rounds") == 6
            assert f"cells/{cell.name}/summary.json" in names
    assert "session.log" in names

    # unpacked where the repository keeps records
    repo = tmp_path / "repo"
    subprocess.run([sys.executable, "benchmarks/gpu_session.py", "unpack", str(archive),
                    "--into", str(repo)], cwd=ROOT, check=True, capture_output=True, timeout=60)
    placed = {p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()}
    assert f"benchmarks/results/gpu_session_cpu-{session['started'][:10]}.json" in placed
    for cell in touched:
        assert f"experiments/results/cells/{cell.name}/config.toml" in placed
    assert not any(p.endswith(".log") for p in placed)
