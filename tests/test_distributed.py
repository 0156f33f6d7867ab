"""A round's clients across processes with torch.distributed (gloo, 2 CPU ranks): the
all-reduced round equals the single-process one, for every method, with clients of uneven
sizes split unevenly; and ``torchrun -m dcco pretrain`` trains the same model as one
process."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dcco.config import load_config
from dcco.core.distributed import share
from dcco.core.simulator import run_round
from dcco.core.statistics_cache import StatisticsCache
from dcco.methods import Segments
from dcco.models import build_dual_encoder
from dcco.run.checkpoint import checkpoint_state, load_checkpoint
from dcco.run.setup import head, projector

ROOT = Path(__file__).resolve().parent.parent
HELPER = ROOT / "tests" / "helpers" / "dist_round.py"


def _torchrun(args: list[str], tmp_path: Path, timeout: float = 600,
              env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=os.environ | {"OMP_NUM_THREADS": "1"} | (env or {}), check=False)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_share__splits_clients_contiguously_and_unevenly():
    assert [share(5, r, 2) for r in range(2)] == [slice(0, 3), slice(3, 5)]
    assert [share(7, r, 3) for r in range(3)] == [slice(0, 3), slice(3, 5), slice(5, 7)]
    with pytest.raises(ValueError, match="at least one"):
        share(1, 0, 2)


def test_two_ranks__every_methods_round_equals_the_single_process_round(tmp_path):
    """Pseudo-gradient to a relative 1e-12 (float64), loss likewise, for every method and
    both executors (the batched one also in groups that keep their graphs), and under
    L-DAWA's aggregation (each rank's clients scaled before the all-reduce); centralized CCO
    split over the ranks runs as DCCO over them; FedSC's rounds with the server's cache of
    absent clients (``train.absent_statistics = "cached"``) likewise, round after round."""
    from helpers.dist_round import METHODS, algorithm, case

    out = tmp_path / "rounds.pt"
    done = _torchrun([str(HELPER), str(out)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(out)
    for name in METHODS:
        method, sizes, model, (x1, x2) = case(name)
        segments = Segments.from_counts(sizes if method.federated else [sum(sizes)])
        for backend in ("batched", "reference", "grouped-kept"):
            # each executor against itself in one process: the executors differ from each
            # other by up to ~1e-12 on their own (CCO on 2-sample FedAvg clients divides by
            # a 2-sample variance), which is not what this test is about; "grouped-kept":
            # the batched one in groups of 4 samples keeping their graphs (max_batch "auto")
            expected = run_round(model, algorithm(name, method) if method.federated else method,
                                 x1, x2, segments,
                                 "batched" if backend == "grouped-kept" else backend)
            flat = torch.cat([v.flatten() for v in expected.pseudo_gradient.values()])
            assert flat.norm() > 0
            r = got[f"{name}/{backend}"]
            mine = torch.cat([r["pseudo"][k].flatten() for k in expected.pseudo_gradient])
            assert float((mine - flat).norm() / flat.norm()) <= 1e-12, (name, backend)
            assert r["loss"] == pytest.approx(float(expected.loss), rel=1e-12), (name, backend)
    # FedSC's partial participation: the ranks exchange their clients' statistics one by one
    # and each keeps the server's cache of absent clients; from round 2 on, the aggregate
    # holds clients absent from the round, so the round is not the one without the cache
    from helpers.dist_round import CACHED_ROUNDS, views

    for backend in ("batched", "reference"):
        cache = StatisticsCache()
        for r, (clients, sizes) in enumerate(CACHED_ROUNDS):
            method, _, model, _ = case("fedsc")
            x1, x2 = views(sum(sizes), seed=r)
            segments = Segments.from_counts(sizes)
            expected = run_round(model, method, x1, x2, segments, backend,
                                 absent=functools.partial(cache.merge_round, clients))
            flat = torch.cat([v.flatten() for v in expected.pseudo_gradient.values()])
            got_r = got[f"fedsc-cached/{backend}/{r}"]
            mine = torch.cat([got_r["pseudo"][k].flatten() for k in expected.pseudo_gradient])
            assert float((mine - flat).norm() / flat.norm()) <= 1e-12, (backend, r)
            assert got_r["loss"] == pytest.approx(float(expected.loss), rel=1e-12)
            dropped = run_round(model, method, x1, x2, segments, backend)
            other = torch.cat([v.flatten() for v in dropped.pseudo_gradient.values()])
            assert (float((other - flat).norm() / flat.norm()) > 1e-6) == (r > 0), (backend, r)


@pytest.mark.slow
@pytest.mark.parametrize("method,optimiser,tolerance,extra", [
    ("dcco", "lars", 1e-10, []), ("centralized_cco", "lars", 1e-10, []),
    ("dcco", "adam", 1e-5, []),
    ("fedsc", "lars", 1e-10, ["--set", 'train.absent_statistics="cached"']),
    ("fedema", "sgd", 1e-10, ["--set", "data.num_clients=6", "--set", "optim.lr=1.0",
                              "--set", "train.local_steps=2", "--set", "train.local_lr=0.05"])],
    ids=["dcco-lars", "centralized_cco-lars", "dcco-adam", "fedsc-cached-lars",
         "fedema-kept-models"])
def test_torchrun_pretrain__trains_the_single_process_model(tmp_path, tiny_config, method,
                                                            optimiser, tolerance, extra):
    """``torchrun --nproc_per_node 2 -m dcco pretrain`` (float64, 5 rounds): rank 0 writes
    the run, and its final weights equal a single process's within the stated tolerance,
    relative to the largest weight. The ranks' shares are summed in another order than one
    process sums its clients, which changes the pseudo-gradient in its last digits (1e-12,
    above); LARS carries that through, Adam's first steps divide by |g| and amplify it in
    near-zero gradients (to about 1e-7 here). FedSC with the server's cache of absent
    clients, FedEMA with its clients' kept models: every rank keeps the same copy, saved
    with the checkpoint by rank 0."""
    config = tiny_config(method=method, rounds=5, checkpoint_every=5)
    sets = ["--set", 'train.precision="float64"', "--set", f'optim.optimizer="{optimiser}"',
            "--set", f"optim.lr={0.5 if optimiser == 'lars' else 0.005}", "--no-progress",
            *extra]
    done = _torchrun(["-m", "dcco", "pretrain", str(config), "--run-dir",
                      str(tmp_path / "two"), *sets], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "dcco", "pretrain", str(config), "--run-dir",
                          str(tmp_path / "one"), *sets], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path, check=False)
    assert one.returncode == 0, one.stderr[-3000:]
    cfg = load_config(tmp_path / "one" / "config.toml")
    nets = []
    for name in ("one", "two"):
        net = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0, head=head(cfg)).double()
        assert load_checkpoint(tmp_path / name / "checkpoint.safetensors", net) == 5
        nets.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    assert float((nets[0] - nets[1]).abs().max()) <= tolerance * float(nets[0].abs().max())
    if extra:  # the cache of every client seen (4 a round, 5 rounds), as one process keeps
        caches = [checkpoint_state(tmp_path / name / "checkpoint.safetensors")  # it; or the
                  for name in ("one", "two")]  # clients' kept models
        assert (len(caches[1]["cache.clients"]) > 4 if method == "fedsc" else
                sum(len(v) for k, v in caches[1].items() if k.endswith(".clients")) == 6)
        assert caches[0].keys() == caches[1].keys()
        assert all(torch.allclose(caches[0][k], caches[1][k], rtol=1e-10, atol=0)
                   for k in caches[0])
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").open()]
    assert [r["round"] for r in records if "loss" in r] == [2, 4, 5]  # one writer, no repeats
    # the collapse figures: of the all-reduced S_A for a federated method, of the probe batch
    # (at the last round) for a centralized one, as one process has them
    single = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").open()]
    figures = ("dead_dims", "corr_diag", "eff_rank")
    for a, b in zip([r for r in records if "loss" in r], [r for r in single if "loss" in r],
                    strict=True):
        shares = method not in ("centralized_cco", "fedema")  # the others: a probe batch's
        assert ("eff_rank" in a) == ("eff_rank" in b) == (shares or a["round"] == 5), (a, b)
        for key in figures if "eff_rank" in a else ():
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-9), key


@pytest.mark.slow
def test_a_killed_rank__stops_the_run_with_an_error_and_the_checkpoint_resumes(tmp_path,
                                                                               tiny_config):
    """SIGKILL of rank 1 after a checkpoint: the run ends with an error (torchrun's agent
    stops the other rank; a rank blocked in a collective would time out after
    DCCO_DIST_TIMEOUT), and ``--resume`` on 2 ranks reaches the configured rounds."""
    import signal
    import time

    config = tiny_config(rounds=150, checkpoint_every=2)
    run = tmp_path / "run"
    mark = f"DCCO_TEST_RUN={tmp_path}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), "-m", "dcco", "pretrain", str(config),
           "--run-dir", str(run), "--no-progress"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "DCCO_DIST_TIMEOUT": "30",
                        "DCCO_TEST_RUN": str(tmp_path)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoint.safetensors").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        victims = [pid for pid in _pids_with(mark) if "RANK=1" in _environ(pid)]
        assert victims
        os.kill(victims[0], signal.SIGKILL)
        # the launcher ends the job instead of hanging for gloo's 30-minute timeout; the wait
        # is a bound on a hang, not a speed asserted (a busy machine takes its time)
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert _pids_with(mark) == []
    cfg = load_config(run / "config.toml")
    net = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0)
    saved = load_checkpoint(run / "checkpoint.safetensors", net)
    assert 2 <= saved < 150

    resumed = _torchrun(["-m", "dcco", "pretrain", "--resume", str(run), "--no-progress"],
                        tmp_path, env={"DCCO_DIST_TIMEOUT": "30"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["rounds"] == 150


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode(
            errors="replace")
    except OSError:
        return ""


def _pids_with(mark: str) -> list[int]:
    pids = []
    for p in Path("/proc").glob("[0-9]*"):
        if p.name != str(os.getpid()) and mark in _environ(int(p.name)).splitlines():
            try:
                if (p / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(p.name))
            except (OSError, IndexError):
                pass
    return pids
