"""A trained encoder for the user's own code: ``load_encoder`` and ``export_encoder``.

``load_encoder(RUN_DIR)`` gives a plain ``torch.nn.Module`` in eval mode: one tower's backbone
(and optionally its projector), the weights of the run's checkpoint. ``export_encoder`` writes
those weights as ``FILE`` (safetensors, the dual encoder's keys) and ``FILE.json`` beside it
(the architecture, the input shape and the normalisation), which ``load_encoder`` also reads
without the run directory::

    import dcco
    encoder = dcco.load_encoder("runs/fmnist_small-dcco-...")   # or an exported .safetensors
    x = encoder.preprocess(uint8_images)                         # (B, C, H, W) uint8 → [−1, 1]
    with torch.no_grad():
        features = encoder(x)                                    # (B, encoder.output_dim)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from dcco.config import ModelConfig, from_dict
from dcco.data.augment import model_input
from dcco.errors import UserError
from dcco.models import DualEncoder, Head, build_dual_encoder
from dcco.run.checkpoint import (
    CheckpointError,
    atomic_write_text,
    checkpoint_meta,
    load_checkpoint,
    save_checkpoint,
)
from dcco.run.rundir import RunDir
from dcco.run.setup import head, projector

FORMAT = "dcco-encoder/1"
IMAGE_SHAPES = {"fashion_mnist": (1, (28, 28)), "cifar10": (3, (32, 32)),
                "cifar100": (3, (32, 32))}
"""Channels and (H, W) of each data set's images, for runs that did not record theirs."""
NORMALISATION = "x / 255, then (x − 0.5) / 0.5 per channel: inputs in [−1, 1]"
"""What the encoder expects of an image, as ``dcco.data.augment.eval_view`` computes it."""
FEATURES = "the stored values as they are (floats in the weights' dtype)"
"""What a tower of a modality that is not images expects (``dcco.data.augment.model_input``)."""
YOURS = "what your own augmentation gave in training (dcco.fit's augment): prepare inputs so"
"""What an encoder trained by ``dcco.fit`` with the user's augmentation expects."""


class Encoder(nn.Module):
    """One tower of a trained dual encoder: images (or a second modality's samples) → backbone
    features (or projections).

    Attributes
    ----------
    backbone : nn.Module
        The trained encoder (its features are the evaluations' inputs).
    projector : nn.Module | None
        The trained projector, applied after it when the encoder was loaded
        ``with_projector``; None otherwise.
    input_shape : tuple[int, ...]
        (C, H, W) of the images it was trained on (other sizes run too: the
        network ends in global average pooling), or the shape of one sample of another
        modality (paired data's second tower).
    normalisation : str (default: ``NORMALISATION``)
        What it expects of an input (``NORMALISATION`` for images,
        ``FEATURES`` otherwise); ``preprocess`` does it.
    output_dim : int
        The width of what ``forward`` returns.
    info : dict[str, Any]
        Where it came from (method, data set, run, round).
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module | None,
                 input_shape: tuple[int, ...], output_dim: int,
                 info: dict[str, Any], normalisation: str = NORMALISATION) -> None:
        super().__init__()
        self.backbone, self.projector = backbone, projector
        self.input_shape, self.output_dim, self.info = input_shape, output_dim, info
        self.normalisation = normalisation

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) float images (or a feature tower's features), as ``preprocess`` makes
        them → (B, output_dim)."""
        z = self.backbone(x)
        return z if self.projector is None else self.projector(z)

    def preprocess(self, images: Tensor) -> Tensor:
        """uint8 (B, C, H, W) images → the normalised float input, in the weights' dtype
        (other inputs as ``dcco.data.augment.model_input`` makes them). An encoder trained on your
        own augmentation's output has no dcco preprocessing: prepare its inputs as your
        augmentation did."""
        if self.normalisation == YOURS:
            raise UserError("this encoder was trained on your own augmentation's output; "
                            "prepare its inputs as your augmentation did (dcco's "
                            "preprocess would normalise them another way)")
        return model_input(images, next(self.parameters()).dtype)

    def extra_repr(self) -> str:
        return f"input_shape={self.input_shape}, output_dim={self.output_dim}"


def _architecture(model_cfg: ModelConfig, projector: tuple[int, ...], in_channels: int,
                  image_size: Sequence[int], info: dict[str, Any],
                  head: Head | None = None,
                  inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    inputs = inputs or {}
    arch = {"format": FORMAT, "model": asdict(model_cfg), "projector": list(projector),
            "input_shape": [in_channels, *image_size],
            "normalisation": _normalisation(inputs.get("input_kind", "images")), "info": info}
    if "input_shape_y" in inputs:  # paired data: the second tower's input
        arch["input_shape_y"] = list(inputs["input_shape_y"])
        arch["normalisation_y"] = _normalisation(inputs.get("input_kind_y", "images"))
    if head is not None:  # BYOL's and SimSiam's checkpoints hold a predictor (and target)
        arch["head"] = {"predictor": list(head.predictor), "target": head.target}
    return arch


def _normalisation(kind: str) -> str:
    return NORMALISATION if kind == "images" else FEATURES


def _run_architecture(run: RunDir) -> dict[str, Any]:
    """The architecture record of a run directory's encoder."""
    cfg = run.config()
    summary = run.summary()
    inputs = summary if "input_shape" in summary else {}  # recorded at the end of a run
    if not inputs and run.checkpoint_path.is_file():  # and with every checkpoint
        with contextlib.suppress(CheckpointError, KeyError, ValueError):
            inputs = checkpoint_meta(run.checkpoint_path)
    if "input_shape" in inputs:
        channels, *size = inputs["input_shape"]
    elif cfg.data.dataset in IMAGE_SHAPES:  # a run from before dcco recorded it
        channels, size = IMAGE_SHAPES[cfg.data.dataset]
    else:
        raise UserError(f"{run.path} records no input shapes (neither its summary nor its "
                        f"checkpoint); cannot rebuild its {cfg.data.dataset} towers")
    info = {"method": cfg.train.method, "dataset": cfg.data.dataset,
            "run": str(run.path), "rounds": summary.get("rounds"), "seed": cfg.train.seed}
    return _architecture(cfg.model, projector(cfg), channels, size, info, head(cfg),
                         {k: v for k, v in inputs.items() if k.startswith("input_")})


def _build(arch: dict[str, Any]) -> DualEncoder:
    model_cfg = from_dict(ModelConfig, arch["model"], "model")
    head = arch.get("head")
    head = Head(tuple(head["predictor"]), head["target"]) if head else None
    y_shape = arch.get("input_shape_y")
    return build_dual_encoder(model_cfg, tuple(arch["input_shape"]), tuple(arch["projector"]),
                              seed=0, head=head, y_shape=tuple(y_shape) if y_shape else None)


def user_model(run: RunDir) -> dict[str, Any] | None:
    """What ``dcco.fit`` recorded of a run that trained the user's own encoder (its class,
    feature width and projector), or None for a run of dcco's own towers."""
    return run.summary().get("user_model")


def _load_user_encoder(run: RunDir, record: dict[str, Any], module: nn.Module,
                       with_projector: bool) -> Encoder:
    from dcco.models.user_encoder import dual_encoder

    if not hasattr(module, "feature_dim"):
        module.feature_dim = int(record["feature_dim"])
    cfg = run.config()  # the method's predictor and target network are in the checkpoint too
    model = dual_encoder(module, record["projector"], method=cfg.train.method,
                         predictor=cfg.model.predictor)
    try:
        load_checkpoint(run.checkpoint_path, model)
    except CheckpointError as e:
        raise UserError(f"{e} (is {type(module).__name__} the encoder {run.path} trained, "
                        f"{record['class']}?)") from None
    meta = checkpoint_meta(run.checkpoint_path)
    info = {"method": cfg.train.method, "dataset": cfg.data.dataset, "run": str(run.path),
            "rounds": run.summary().get("rounds"), "seed": cfg.train.seed, "tower": 0}
    normalisation = (YOURS if record.get("augment", "yours") == "yours"
                     else _normalisation(meta.get("input_kind", "features")))
    encoder = Encoder(module, model.projector if with_projector else None,
                      tuple(meta.get("input_shape", ())),
                      model.projection_dim if with_projector else int(record["feature_dim"]),
                      info, normalisation)
    return encoder.eval()


def load_encoder(path: str | Path, tower: int = 0, with_projector: bool = False,
                 model: nn.Module | None = None) -> Encoder:
    """A trained encoder as a plain module in eval mode (float32, on the CPU).

    >>> import tempfile, torch, dcco
    >>> clients = {k: torch.randn(4, 8, generator=torch.Generator().manual_seed(k))
    ...            for k in range(8)}
    >>> trained = torch.nn.Linear(8, 16)
    >>> run = dcco.fit(trained, clients, rounds=2, clients_per_round=4, projector=(16, 16),
    ...                augment=lambda x: x + 0.1 * torch.randn_like(x), progress=False,
    ...                run_dir=tempfile.mkdtemp() + "/run").run_dir
    >>> encoder = dcco.load_encoder(run, model=torch.nn.Linear(8, 16))  # a fresh instance
    >>> torch.allclose(encoder(clients[0]), trained(clients[0]))
    True

    Parameters
    ----------
    path : str | Path
        A run directory (its ``checkpoint.safetensors``), or a file written by
        ``export_encoder`` / ``dcco export`` (its ``.json`` beside it).
    tower : int (default: 0)
        Which tower of a two-tower run (0: the one for the first input); a shared
        encoder has one.
    with_projector : bool (default: False)
        Also apply the projector (the encodings F the loss saw); by default
        the backbone's features, which the evaluations use.
    model : nn.Module | None (default: None)
        For a run of your own encoder (``dcco.fit``), a fresh instance of it, into
        which the trained weights are loaded (it becomes the returned encoder's
        ``backbone``); runs of dcco's towers rebuild them and take none.

    Raises
    ------
    UserError
        No run directory or exported encoder at ``path``, a corrupt file, or a
        tower the run does not have.
    """
    path = Path(path)
    if path.is_dir():
        run = RunDir.open(path)
        record = user_model(run)
        if record is not None:
            if model is None:
                raise UserError(f"{path} trained your own encoder ({record['class']}); pass a "
                                f"fresh one to load its weights into: dcco.load_encoder(path, "
                                f"model=YourEncoder())")
            if tower != 0:
                raise UserError(f"{path} has tower 0 only (one shared encoder); tower {tower} "
                                f"was asked for")
            if not run.checkpoint_path.is_file():
                raise UserError(f"{path} has no checkpoint yet; nothing to load")
            return _load_user_encoder(run, record, model, with_projector)
        arch, weights = _run_architecture(run), run.checkpoint_path
    else:
        meta = path.with_suffix(".json")
        if not path.is_file() or not meta.is_file():
            raise UserError(f"{path} is neither a dcco run directory nor an encoder written by "
                            f"`dcco export` (a .safetensors file with its .json beside it)")
        try:
            arch = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{meta} is unreadable: {e}") from None
        if arch.get("format") != FORMAT:
            raise UserError(f"{meta} is not a dcco encoder description "
                            f"(format {arch.get('format')!r})")
        weights = path
    if model is not None:
        raise UserError(f"{path} holds dcco's own towers, which load_encoder rebuilds; "
                        f"model= is for runs of your own encoder (dcco.fit)")
    model = _build(arch)
    try:
        load_checkpoint(weights, model)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    if tower not in (0, 1) or (tower == 1 and model.shared):
        towers = "tower 0 only (one shared encoder)" if model.shared else "towers 0 and 1"
        raise UserError(f"{path} has {towers}; tower {tower} was asked for")
    backbone, projector = model._tower(tower)
    suffix = "_y" if tower == 1 and "input_shape_y" in arch else ""
    encoder = Encoder(backbone, projector if with_projector else None,
                      tuple(arch[f"input_shape{suffix}"]),
                      model.projection_dim if with_projector else backbone.feature_dim,
                      dict(arch["info"]) | {"tower": tower},
                      arch.get(f"normalisation{suffix}", NORMALISATION))
    return encoder.eval()


def export_encoder(run_dir: str | Path, out: str | Path) -> tuple[Path, Path]:
    """Write a run's trained dual encoder as ``out`` (safetensors; add the suffix if it is
    missing) and its architecture as ``out`` with ``.json``, atomically; returns both paths.

    Parameters
    ----------
    run_dir : str | Path
        The run directory whose checkpoint is exported.
    out : str | Path
        The file to write (``.safetensors`` added if missing); its ``.json`` goes beside it.

    Returns
    -------
    tuple[Path, Path]
        The weights' file and the architecture's.

    Raises
    ------
    UserError
        Not a run directory, or it has no checkpoint yet, or ``out`` exists.
    """
    run = RunDir.open(run_dir)
    if not run.checkpoint_path.is_file():
        raise UserError(f"{run.path} has no checkpoint yet; nothing to export")
    if (record := user_model(run)) is not None:
        raise UserError(f"{run.path} trained your own encoder ({record['class']}), which only "
                        f"your code can rebuild: load it with dcco.load_encoder(RUN_DIR, "
                        f"model=YourEncoder()) and save its state_dict")
    out = Path(out)
    if out.suffix != ".safetensors":
        out = out.with_name(out.name + ".safetensors")
    meta = out.with_suffix(".json")
    for target in (out, meta):
        if target.exists():
            raise UserError(f"{target} already exists; choose another --out")
    arch = _run_architecture(run)
    model = _build(arch)
    load_checkpoint(run.checkpoint_path, model)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out, model, None, arch["info"]["rounds"] or 0, meta={"export": FORMAT})
    atomic_write_text(meta, json.dumps(arch, indent=2) + "\n")
    return out, meta


__all__ = ["NORMALISATION", "Encoder", "export_encoder", "load_encoder", "user_model"]
