"""Evaluating runs: a run directory's encoder under every protocol, the supervised and the
random-encoder baselines, their results kept in the run's summary. Used by the CLI (``dcco
evaluate``, ``dcco supervised``, ``dcco demo``) and the reproduction harness; nothing here
prints."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Literal

import torch

from dcco.config import ConfigError, EvalConfig, RunConfig
from dcco.data.paired import Dataset
from dcco.errors import UserError
from dcco.evaluate import (
    EvalResult,
    StepCallback,
    finetune,
    finetune_cases,
    knn_accuracy,
    knn_description,
    labelled_cases,
    labelled_subset,
    linear_probe,
    linear_probe_cases,
    retrieval,
    supervised_from_scratch,
)
from dcco.methods.registry import METHODS
from dcco.models import DualEncoder
from dcco.run.checkpoint import load_checkpoint
from dcco.run.device_plan import resolve_device
from dcco.run.rundir import RunDir, RunDirError
from dcco.run.setup import build_model
from dcco.run.splits import load_splits

Protocol = Literal["linear", "finetune", "linear_y", "retrieval", "knn", "case_linear",
                   "case_finetune"]
CASE_PROTOCOLS = ("case_linear", "case_finetune")
"""Protocols of data in natural clients: a case's (client's) images pooled, scored per case."""
PAIRED_PROTOCOLS = ("linear_y", "retrieval")
"""Protocols of paired data only: the second tower's probe, and cross-modal retrieval."""


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


def pretrained_model(cfg: RunConfig, run: RunDir,
                     shapes: int | tuple[tuple[int, ...], tuple[int, ...]],
                     device: torch.device) -> DualEncoder:
    """The dual encoder stored in a run's checkpoint; ``shapes``: its data's
    ``input_shapes`` (or, for images, their channel count)."""
    model = build_model(cfg, shapes) if isinstance(shapes, int) else build_model(cfg, *shapes)
    load_checkpoint(run.checkpoint_path, model)
    return model.to(device)


def evaluate_model(model: DualEncoder, protocol: Protocol, ecfg: EvalConfig, seed: int,
                   train: Dataset, test: Dataset, device: torch.device,
                   progress: StepCallback | None = None, method: str | None = None) -> EvalResult:
    """Evaluate ``model``: a linear probe (of the first tower, or ``linear_y`` of the second)
    or full finetuning on ``ecfg.labels`` labelled samples, or cross-modal retrieval in a
    gallery of ``ecfg.labels`` test pairs, compared in the space of ``method``'s loss
    (``dcco.evaluate.Similarity``; standardized when None)."""
    if protocol in PAIRED_PROTOCOLS and not test.paired:
        raise UserError(f"the {protocol} evaluation needs paired data (two modalities, e.g. "
                        f"data.dataset = 'fashion_mnist_halves'); this data set holds images")
    if protocol == "retrieval":
        if ecfg.labels > len(test):
            raise UserError(f"retrieval@{ecfg.labels} asks for a gallery of {ecfg.labels} test "
                            f"pairs, but the test split holds {len(test)}")
        similarity = METHODS[method].similarity if method in METHODS else "standardized"
        return retrieval(model, test, ecfg.labels, seed, device, similarity,
                         ecfg.feature_batch, progress)
    if train.num_classes < 2:
        raise UserError(f"a {protocol} evaluation classifies, but {train.name!r} has "
                        f"{train.num_classes} class; it needs labels of at least 2 classes")
    if protocol == "knn":
        return knn_evaluation(model, ecfg, seed, train, test, device)
    if protocol in CASE_PROTOCOLS:
        return case_evaluation(model, protocol, ecfg, seed, train, test, device, progress)
    ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, seed)
    if protocol in ("linear", "linear_y"):
        return linear_probe(model, train, test, ids, ecfg, seed, device, progress,
                            tower=int(protocol == "linear_y"))
    if protocol == "finetune":
        if train.paired:
            raise UserError("finetune evaluates image encoders; for paired data use linear, "
                            "linear_y or retrieval")
        return finetune(model, train, test, ids, ecfg, seed, device, progress)[0]
    raise ValueError(f"unknown protocol {protocol!r}; choose linear, finetune, linear_y, "
                     f"retrieval, knn, case_linear or case_finetune")


def case_evaluation(model: DualEncoder, protocol: Protocol, ecfg: EvalConfig, seed: int,
                    train: Dataset, test: Dataset, device: torch.device,
                    progress: StepCallback | None = None) -> EvalResult:
    """The case-level probe or finetuning (the paper's DERM protocols) on ``ecfg.labels``
    labelled cases (class-balanced; all of them when that covers them), each case a client
    of the data (a lesion, a patient), scored per test case."""
    if getattr(train, "clients", None) is None or getattr(test, "clients", None) is None:
        raise UserError(f"{protocol} pools each case's images, and {train.name!r} has no case "
                        f"(client) id per image; use a data set with natural clients "
                        f"(client_table, ham10000, fed_cifar100, fed_emnist)")
    for split, what in ((train, "training"), (test, "test")):
        check_one_label_per_case(split, protocol, what)
    ids = labelled_cases(train.labels, train.clients, ecfg.labels, train.num_classes, seed)
    labelled = train.subset(ids)
    if protocol == "case_linear":
        result = linear_probe_cases(model, labelled, labelled.clients, test, test.clients,
                                    ecfg, seed, device)
        return replace(result, num_labels=int(labelled.clients.unique().numel()),
                       num_test=int(test.clients.unique().numel()))
    return finetune_cases(model, train, ids, test, ecfg, seed, device, progress)


def check_one_label_per_case(data: Dataset, protocol: str, split: str = "training") -> None:
    """``UserError`` naming the first client whose images carry more than one label: a
    case-level protocol gives each case (client) one label, as a lesion's diagnosis."""
    keys, slot = torch.unique(data.clients, return_inverse=True)
    first = torch.full((keys.numel(),), -1, dtype=torch.int64).scatter_(0, slot, data.labels)
    clash = (first[slot] != data.labels).nonzero()
    if clash.numel():
        client = int(data.clients[clash[0, 0]])
        labels = sorted(set(data.labels[data.clients == client].tolist()))
        names = [data.class_names[i] if i < len(data.class_names) else str(i) for i in labels]
        raise UserError(
            f"{protocol} gives each case (client) one label, but client "
            f"{data.client_names[client]!r} of the {split} split holds images of "
            f"{len(labels)} labels ({', '.join(names[:5])}{', …' if len(names) > 5 else ''}); "
            f"the case protocols suit data whose clients are cases, as HAM10000's lesions; "
            f"for clients that are users or writers (fed_emnist, fed_cifar100) use linear or "
            f"finetune")


def knn_evaluation(model: DualEncoder, ecfg: EvalConfig, seed: int, train: Dataset,
                   test: Dataset, device: torch.device) -> EvalResult:
    """The k-NN monitor as an evaluation: a bank of ``ecfg.labels`` labelled training images
    (the monitor's ``knn_bank`` does not apply), ``ecfg.knn_queries`` test queries, in the
    space ``ecfg.knn_features``; ``details`` say which."""
    start = time.perf_counter()
    bank = min(ecfg.labels, len(train))
    queries = min(ecfg.knn_queries or len(test), len(test))
    acc = knn_accuracy(model, train, test, k=ecfg.knn_k, temperature=ecfg.knn_temperature,
                       bank_size=bank, num_queries=queries, seed=seed, device=device,
                       batch_size=ecfg.feature_batch, features=ecfg.knn_features)
    monitor = knn_description(replace(ecfg, knn_bank=bank, knn_queries=queries))
    return EvalResult(protocol="knn", accuracy=acc, num_labels=bank, steps=0,
                      seconds=time.perf_counter() - start, num_test=queries,
                      details={"features": ecfg.knn_features, "k": ecfg.knn_k,
                               "monitor": monitor})


def evaluate_run(run: RunDir, protocol: Protocol, labels: int | None = None,
                 splits: tuple[Dataset, Dataset] | None = None,
                 progress: StepCallback | None = None) -> EvalResult:
    """Evaluate a finished (or checkpointed) run and record the result in its summary."""
    cfg = run.config()
    if not run.checkpoint_path.is_file():
        raise RunDirError(f"{run.path} has no checkpoint yet; nothing to evaluate")
    train, test = splits or load_splits(cfg)
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    model = pretrained_model(cfg, run, train.input_shapes, device)
    result = evaluate_model(model, protocol, ecfg, cfg.train.seed, train, test, device,
                            progress, cfg.train.method)
    run.update_summary(evaluations={eval_key(protocol, ecfg.labels): asdict(result)})
    return result


def supervised_run(cfg: RunConfig, run: RunDir, labels: int | None = None,
                   splits: tuple[Dataset, Dataset] | None = None,
                   progress: StepCallback | None = None) -> EvalResult:
    """Supervised training from scratch on the labelled subset, recorded like a run."""
    train, test = splits or load_splits(cfg)
    if train.paired:
        raise UserError("supervised from scratch trains an image classifier; paired data "
                        "sets have no supervised baseline in dcco")
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, cfg.train.seed)
    result = supervised_from_scratch(cfg.model, train.images.shape[1], train, test, ids, ecfg,
                                     cfg.train.seed, device, progress)
    run.update_summary(method="supervised", dataset=cfg.data.dataset, rounds=None,
                       evaluations={eval_key("supervised", ecfg.labels): asdict(result)})
    return result


def random_encoder_run(cfg: RunConfig, run: RunDir, labels: int | None = None,
                       splits: tuple[Dataset, Dataset] | None = None,
                       progress: StepCallback | None = None) -> EvalResult:
    """Linear probe of a randomly initialised encoder: the floor every method must beat."""
    train, test = splits or load_splits(cfg)
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    model = build_model(cfg, *train.input_shapes).to(device)
    result = evaluate_model(model, "linear", ecfg, cfg.train.seed, train, test, device,
                            progress)
    run.update_summary(method="random_init", dataset=cfg.data.dataset, rounds=0,
                       evaluations={eval_key("linear", ecfg.labels): asdict(result)})
    return result


def raw_pixels_run(cfg: RunConfig, run: RunDir, labels: int | None = None,
                   splits: tuple[Dataset, Dataset] | None = None,
                   progress: StepCallback | None = None) -> EvalResult:
    """Linear probe of the raw inputs, flattened (no encoder): the floor a learnt encoder
    should pass, recorded like a run (method ``raw_pixels``)."""
    train, test = splits or load_splits(cfg)
    if train.paired:
        raise UserError("the raw-pixel probe reads images; paired data sets have none")
    device = resolve_device(cfg.train.device)
    ecfg = eval_config_for(cfg, labels)
    ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, cfg.train.seed)
    result = linear_probe(torch.nn.Flatten(), train, test, ids, ecfg, cfg.train.seed, device,
                          progress)
    run.update_summary(method="raw_pixels", dataset=cfg.data.dataset, rounds=0,
                       evaluations={eval_key("linear", ecfg.labels): asdict(result)})
    return result


def with_method(cfg: RunConfig, method: str) -> RunConfig:
    """``cfg`` with another pretraining method (projector default follows the method)."""
    return replace(cfg, train=replace(cfg.train, method=method))

