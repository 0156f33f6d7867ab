"""Runs composed of the library's pieces: evaluate a run, supervised baselines, the demo.

Used by the CLI (``dcco evaluate``, ``dcco supervised``, ``dcco demo``) and the reproduction
harness. Results go into run directories; nothing here prints.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Literal

import torch

from dcco.checkpoint import load_checkpoint
from dcco.config import ConfigError, RunConfig
from dcco.data.datasets import ImageDataset, load_dataset
from dcco.evaluate import (
    EvalConfig,
    EvalResult,
    StepCallback,
    finetune,
    labelled_subset,
    linear_probe,
    supervised_from_scratch,
)
from dcco.models import DualEncoder
from dcco.rundir import RunDir, RunDirError
from dcco.train import resolve_device

Protocol = Literal["linear", "finetune"]


def load_splits(cfg: RunConfig) -> tuple[ImageDataset, ImageDataset]:
    """The training and test splits of the configured data set."""
    train = load_dataset(cfg.data.dataset, "train", cfg.data.data_dir)
    test = load_dataset(cfg.data.dataset, "test", cfg.data.data_dir)
    return train, test


def eval_key(protocol: str, labels: int) -> str:
    """The name of an evaluation in summary.json, e.g. ``linear@5000``."""
    return f"{protocol}@{labels}"


def eval_config_for(cfg: RunConfig, labels: int | None) -> EvalConfig:
    """The run's eval settings with ``labels`` labelled samples (paper settings for 500)."""
    if labels is None or labels == cfg.eval.labels:
        return cfg.eval
    try:
        return EvalConfig.for_labels(labels, base=cfg.eval)
    except ValueError as e:
        raise ConfigError(f"{labels} labels: {e}") from None


def pretrained_model(cfg: RunConfig, run: RunDir, in_channels: int,
                     device: torch.device) -> DualEncoder:
    """The dual encoder stored in a run's checkpoint."""
    model = cfg.build_model(in_channels)
    load_checkpoint(run.checkpoint_path, model)
    return model.to(device)


def evaluate_model(model: DualEncoder, protocol: Protocol, ecfg: EvalConfig, seed: int,
                   train: ImageDataset, test: ImageDataset, device: torch.device,
                   progress: StepCallback | None = None) -> EvalResult:
    """Linear probe or full finetuning of ``model`` on ``ecfg.labels`` labelled samples."""
    ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, seed)
    if protocol == "linear":
        return linear_probe(model, train, test, ids, ecfg, seed, device, progress)
    if protocol == "finetune":
        return finetune(model, train, test, ids, ecfg, seed, device, progress)[0]
    raise ValueError(f"unknown protocol {protocol!r}; choose 'linear' or 'finetune'")


def evaluate_run(run: RunDir, protocol: Protocol, labels: int | None = None,
                 splits: tuple[ImageDataset, ImageDataset] | None = None,
                 progress: StepCallback | None = None) -> EvalResult:
    """Evaluate a finished (or checkpointed) run and record the result in its summary."""
    cfg = run.config()
    if not run.checkpoint_path.is_file():
        raise RunDirError(f"{run.path} has no checkpoint yet; nothing to evaluate")
    train, test = splits or load_splits(cfg)
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    model = pretrained_model(cfg, run, train.images.shape[1], device)
    result = evaluate_model(model, protocol, ecfg, cfg.train.seed, train, test, device,
                            progress)
    run.update_summary(evaluations={eval_key(protocol, ecfg.labels): asdict(result)})
    return result


def supervised_run(cfg: RunConfig, run: RunDir, labels: int | None = None,
                   splits: tuple[ImageDataset, ImageDataset] | None = None,
                   progress: StepCallback | None = None) -> EvalResult:
    """Supervised training from scratch on the labelled subset, recorded like a run."""
    train, test = splits or load_splits(cfg)
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, cfg.train.seed)
    result = supervised_from_scratch(cfg.model, train.images.shape[1], train, test, ids, ecfg,
                                     cfg.train.seed, device, progress)
    run.update_summary(method="supervised", dataset=cfg.data.dataset, rounds=None,
                       evaluations={eval_key("supervised", ecfg.labels): asdict(result)})
    return result


def random_encoder_run(cfg: RunConfig, run: RunDir, labels: int | None = None,
                       splits: tuple[ImageDataset, ImageDataset] | None = None,
                       progress: StepCallback | None = None) -> EvalResult:
    """Linear probe of a randomly initialised encoder: the floor every method must beat."""
    train, test = splits or load_splits(cfg)
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    model = cfg.build_model(train.images.shape[1]).to(device)
    result = evaluate_model(model, "linear", ecfg, cfg.train.seed, train, test, device,
                            progress)
    run.update_summary(method="random_init", dataset=cfg.data.dataset, rounds=0,
                       evaluations={eval_key("linear", ecfg.labels): asdict(result)})
    return result


def with_method(cfg: RunConfig, method: str) -> RunConfig:
    """``cfg`` with another pretraining method (projector default follows the method)."""
    return replace(cfg, train=replace(cfg.train, method=method))

