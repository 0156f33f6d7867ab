"""configs/fedsc_cifar10.toml, FedSC's own setting (Jing et al. 2024), read as written and run
at a tiny size on generated cifar-10-batches-py files: one-class clients, the Fixup network,
the clipped encodings and FedSC's local recipe, end to end through ``dcco pretrain``."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np

from dcco.cli import main
from dcco.config import load_config
from dcco.core.client import LocalSGD
from dcco.run.algorithms import algorithm_of
from dcco.run.setup import projector

PRESET = Path(__file__).parents[1] / "configs" / "fedsc_cifar10.toml"


def _write_cifar10(root: Path, per_class: int) -> None:
    """cifar-10-batches-py in its real format: five training pickles and a test pickle of
    uint8 rows (R, G, B planes) and labels, ``per_class`` training images of each class."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    labels = np.tile(np.arange(10), per_class)
    for i, part in enumerate(np.array_split(labels, 5)):
        with open(folder / f"data_batch_{i + 1}", "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 256, (part.size, 3072), dtype=np.uint8),
                         b"labels": part.tolist()}, fh)
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({b"data": rng.integers(0, 256, (40, 3072), dtype=np.uint8),
                     b"labels": (np.arange(40) % 10).tolist()}, fh)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, fh)


def test_fedsc_cifar10_preset__fedscs_setting_as_written():
    cfg = load_config(PRESET)
    d, m, t = cfg.data, cfg.model, cfg.train
    assert (d.dataset, d.alpha, d.samples_per_client, d.num_clients) == ("cifar10", 0.0, 5000, 10)
    assert (m.arch, m.norm, m.stage_widths, m.clip_encodings) == (
        "resnet20_fixup", "none", (128, 256, 512), 2.0)
    assert projector(cfg) == (1024, 512)
    assert (t.method, t.rounds, t.clients_per_round, t.local_lr) == ("fedsc", 200, 10, 0.03)
    assert (t.local_steps, t.local_batch, t.local_statistics, t.own_weight) == (
        50, 512, "own", "fedsc")
    assert algorithm_of(cfg).local_sgd == LocalSGD(0.9, 5e-4, 3.0) and t.local_lr_schedule == "cosine"
    assert (cfg.optim.optimizer, cfg.optim.lr, cfg.optim.schedule) == ("sgd", 1.0, "constant")
    assert cfg.augment.crop_scale == (0.2, 1.0) and cfg.augment.blur_p == (0.0, 0.0)


def test_fedsc_cifar10_preset__runs_at_a_tiny_size_on_cifar10_files(tmp_path):
    _write_cifar10(tmp_path, per_class=8)
    run = tmp_path / "run"
    overrides = {"data.data_dir": f'"{tmp_path}"', "data.samples_per_client": "6",
                 "train.rounds": "2", "train.local_steps": "3", "train.local_batch": "4",
                 "model.widths": "[4, 8, 8]", "model.projector": "[32, 16]",
                 "eval.labels": "20", "eval.probe_steps": "5", "eval.knn_bank": "50",
                 "eval.knn_queries": "20", "train.knn_every": "0", "train.log_every": "1"}
    args = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    assert main(["pretrain", str(PRESET), "--run-dir", str(run), "--no-progress", *args]) == 0
    assert (run / "checkpoint.safetensors").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in rows if "loss" in r]
    assert len(rounds) == 2 and all(np.isfinite(r["loss"]) for r in rounds)
    assert all(r["clients"] == 10 and r["samples"] == 60 for r in rounds)  # all, every round
