"""The determinism promise (docs/results/reruns.md): the same config, seed, thread count,
machine and device give bit-identical runs, in fresh processes, for the shipped recipe's
optimiser (LARS at the `small` rate, where training amplifies any rounding difference)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

SRC = str(Path(__file__).parents[1] / "src")
LARS = ["--set", 'optim.optimizer="lars"', "--set", "optim.lr=1.5", "--set", "optim.warmup_rounds=2",
        "--set", "optim.weight_decay=1e-6"]


def pretrain(config: Path, run: Path, threads: int, method: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-m", "dcco.cli", "pretrain", str(config), "--run-dir", str(run),
         "--no-progress", "--set", f'train.method="{method}"', *LARS],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert (run / "version.json").read_text().count(f'"threads": "{threads}"') == 1
    return load_file(run / "checkpoint.safetensors")


@pytest.mark.parametrize(("method", "threads"), [("dcco", 1), ("dcco", 2),
                                                  ("contrastive_fedavg", 2)])
def test_same_seed_and_thread_count__two_processes_give_bit_identical_weights(
        tiny_config, tmp_path, method, threads):
    config = tiny_config(rounds=6, checkpoint_every=3)
    a = pretrain(config, tmp_path / "a", threads, method)
    b = pretrain(config, tmp_path / "b", threads, method)
    assert a.keys() == b.keys()
    assert len(a) > 10
    for key in a:
        assert a[key].equal(b[key]), f"{key} differs between two runs of one config"
