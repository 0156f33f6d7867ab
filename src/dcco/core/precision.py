"""How the encoders compute: numeric precision, compilation and memory format.

Three settings of ``[train]`` (``dcco.config.TrainConfig``) choose them, and ``prepare_model``
applies them to a dual encoder in place, so that parameter names, checkpoints, the
pseudo-gradient's keys and Flower's weights are those of the eager float32 model:

- ``precision``: ``float32``; ``bf16``, bfloat16 autocast around the backbones (the
  projectors, the master weights, the server optimiser, and everything from the statistics on
  stay as they are: projectors in float32, statistics and losses in float64); ``float64``, for
  the exactness tests. A backbone is nearly all of a round's arithmetic (at the paper's
  Fashion-MNIST scale, 665 of 670 GFLOP of a forward), so keeping the projector in float32
  costs nothing and keeps the encodings, whose cross-correlation is the loss, at full
  precision.
- ``compile``: ``off``; ``on``, ``torch.compile`` of the dual encoder's forward, in place
  (``nn.Module.compile``: no ``_orig_mod.`` wrapper, the same ``state_dict``); ``cudagraphs``,
  the same with inductor's CUDA graphs (mode ``reduce-overhead``), for CUDA runs whose round
  has one shape (every client of the same size; a new shape records a new graph).
- ``channels_last``: the backbones' weights and inputs in NHWC memory format.

``auto`` picks, per device, the fastest configuration measured to be safe there (``AUTO``);
``resolve`` turns it into a concrete setting before a run directory is written, so a run's
``config.toml`` says what it computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dcco.config.sections import Compile, Precision

PARAM_DTYPES = {"float32": torch.float32, "bf16": torch.float32, "float64": torch.float64}
"""The dtype of the master weights (and of the augmented views) under each precision."""
AUTOCAST_DTYPES = {"float32": None, "bf16": torch.bfloat16, "float64": None}
"""The autocast dtype of the backbones under each precision (None: no autocast)."""

AUTO: dict[str, tuple[str, str]] = {
    "cpu": ("float32", "off"),
    "cuda": ("float32", "on"),
}
"""What ``auto`` resolves to, by device type: (precision, compile): the fastest configuration
measured to be safe there (docs/performance.md).

CPU: float32 and eager. bf16 is 1.8× faster on a CPU with AVX-512 BF16, and moved k-NN by
−0.9 points in one small-scale check; compilation gained nothing there. float32 stays the
CPU default, where the committed results and the bit-exact tests run. CUDA: float32 and
``torch.compile`` (numerically eager's, 1e-5). On an H100 (2026-11-27,
``benchmarks/results/round_cost_nvidia-h100-80gb-hbm3.md``) compilation halved a `full`-scale
round and bf16 alone saved a tenth; ``benchmarks/precision_check.py`` could not resolve bf16's
effect on the k-NN monitor there (four 600-round pairs from −4.1 to +4.5 points; one seed's
float32 run moved 2 points between runs), so bf16 is not the CUDA default. Where Triton is
missing, CUDA compilation is off. Compilation is also off, under ``auto``, for
rounds that run client by client (``reference`` backend, several local steps, minibatches),
where each client's shape would compile anew."""


@dataclass(frozen=True)
class Speed:
    """A concrete precision, compile mode and memory format."""

    precision: str = "float32"
    compile: str = "off"
    channels_last: bool = False

    @property
    def param_dtype(self) -> torch.dtype:
        return PARAM_DTYPES[self.precision]

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES[self.precision]

    @property
    def compiled(self) -> bool:
        return self.compile != "off"


def can_compile(device_type: str) -> bool:
    """Whether ``torch.compile`` (inductor) can build kernels for this device type here."""
    if device_type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:  # pragma: no cover - very old torch
            return False
        return bool(has_triton())
    return device_type == "cpu"


def resolve(precision: str, compile: str, device_type: str,
            batched: bool = True) -> tuple[str, str]:
    """``auto`` replaced by ``AUTO``'s choice for ``device_type`` ("cpu", "cuda", ...);
    ``batched``: whether a round runs as one batch (else ``auto`` compiles nothing)."""
    auto_precision, auto_compile = AUTO.get(device_type, ("float32", "off"))
    if precision == "auto":
        precision = auto_precision
    if compile == "auto":
        compile = auto_compile if can_compile(device_type) and batched else "off"
    return precision, compile


def check(speed: Speed, device_type: str) -> None:
    """Refuse a combination the device cannot run, naming the key (``ValueError``)."""
    if speed.compile == "cudagraphs" and device_type != "cuda":
        raise ValueError(f"train.compile = 'cudagraphs' needs a CUDA device, got "
                         f"{device_type!r}; use 'on' or 'off'")
    if speed.compiled and not can_compile(device_type):
        raise ValueError(f"train.compile = {speed.compile!r} needs torch.compile for "
                         f"{device_type!r} (Triton on CUDA), which this installation lacks; "
                         f"use train.compile = 'off'")


def prepare_model(model: nn.Module, speed: Speed, device: torch.device | str) -> nn.Module:
    """Put a dual encoder on ``device`` with ``speed``'s weights dtype, autocast, memory format
    and compilation, in place (parameter names and ``state_dict`` keys unchanged).

    Returns:
        ``model`` itself.
    """
    device = torch.device(device)
    check(speed, device.type)
    if device.type == "cuda":  # a round's shapes repeat: let cuDNN pick its fastest kernels
        torch.backends.cudnn.benchmark = True
    model.to(device, speed.param_dtype)
    model.autocast_dtype = speed.autocast_dtype
    if speed.channels_last:
        model.to(memory_format=torch.channels_last)
        model.channels_last = True
    if speed.compiled:
        if device.type == "cpu":
            model.compile(options=CPU_COMPILE_OPTIONS)
        else:
            model.compile(mode="reduce-overhead" if speed.compile == "cudagraphs" else None)
    return model


CPU_COMPILE_OPTIONS = {"layout_optimization": False}
"""Inductor's options for a CPU compile. Its layout optimisation (convolutions' activations
and weights turned NHWC on its own) writes out of bounds in the backward pass of dcco's
ResNets on an AVX2-only CPU with torch 2.13 (heap corruption or a pseudo-gradient 30-60 %
off; tests/test_precision.py caught it on CI's machine). Without it, the compiled round
agrees with eager to 5e-6. ``train.channels_last`` still gives NHWC where it is asked for."""


__all__ = ["AUTO", "Compile", "Precision", "Speed", "can_compile", "check", "prepare_model",
           "resolve"]
