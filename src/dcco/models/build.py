"""Building a configured encoder: input checks, seeded initialisation from explicit streams."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from dcco.config import ModelConfig
from dcco.core.seeding import generator
from dcco.models.dual import DualEncoder, Head
from dcco.models.fixup import FixupResNet20
from dcco.models.layers import Projector
from dcco.models.resnet import MLP, ResNet, ResNet14, ResNet50, _Block

InputShape = int | tuple[int, ...]
"""A tower's input: the shape of one sample (C, H, W) for images or (D, ...) for features,
or, for images, the channel count alone."""


def check_inputs(cfg: ModelConfig, x_shape: InputShape, y_shape: InputShape | None) -> None:
    """Refuse towers that cannot read their inputs: one shared network for inputs of two
    shapes, or a ResNet tower for inputs that are not (C, H, W).

    Raises:
        ValueError: naming the key to change.
    """
    if cfg.shared and y_shape is not None and _dims(y_shape) != _dims(x_shape):
        raise ValueError(f"one shared network cannot read inputs of shapes {_dims(x_shape)} "
                         f"and {_dims(y_shape)}; set model.shared = false (two towers)")
    for tower, shape in enumerate((x_shape, y_shape)):
        if shape is not None and not (tower == 1 and cfg.shared):
            _check_tower_input(cfg, tower, shape)


def _check_tower_input(cfg: ModelConfig, tower: int, shape: InputShape) -> None:
    """Refuse an input tower ``tower`` cannot read: features (not (C, H, W)) for a ResNet, or
    a channel count alone for an mlp, which needs the whole shape."""
    arch = cfg.tower_arch(tower)
    if arch == "mlp" and isinstance(shape, int):
        raise ValueError("an mlp tower needs its input's full shape, not a channel count")
    if arch != "mlp" and not isinstance(shape, int) and len(_dims(shape)) != 3:
        raise ValueError(f"a {arch} tower reads images (C, H, W), but "
                         f"{'Y' if tower else 'X'} has shape {_dims(shape)}; use "
                         f"model.{'y_' if tower else ''}arch = 'mlp' for features")


def _dims(shape: InputShape) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _initialise(module: nn.Module, gen: torch.Generator) -> None:
    """Initialise every parameter of ``module`` from ``gen``, in module order.

    Convolutions: Kaiming normal, fan-out (He et al. 2015, torchvision's choice). Linears:
    weights and biases uniform in ±1/√fan_in (PyTorch's default scale; weight standardisation
    makes the scale irrelevant for hidden layers, and it keeps the last layer's outputs O(1)).
    Group (or batch) norm: scale 1, shift 0, except the last norm of each residual branch, whose
    scale starts at 0 (Goyal et al. 2017) so every block starts as its shortcut. A Fixup
    network (no norms) then takes Fixup's rescaling (``FixupResNet20.fixup_``), which starts
    every block as its shortcut too.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=gen)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            bound = 1 / math.sqrt(m.in_features)
            nn.init.uniform_(m.weight, -bound, bound, generator=gen)
            if m.bias is not None:
                nn.init.uniform_(m.bias, -bound, bound, generator=gen)
        elif isinstance(m, (nn.GroupNorm, nn.modules.batchnorm._BatchNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():  # after the loop above, which visits a block before its norms
        if isinstance(m, _Block) and isinstance(m.norms[-1], (nn.GroupNorm,
                                                               nn.modules.batchnorm._BatchNorm)):
            nn.init.zeros_(m.norms[-1].weight)
        elif isinstance(m, FixupResNet20):
            m.fixup_()


def _resnet(cfg: ModelConfig, shape: InputShape, tower: int = 0) -> ResNet | MLP | FixupResNet20:
    _check_tower_input(cfg, tower, shape)
    arch, widths, dims = cfg.tower_arch(tower), cfg.tower_widths(tower), _dims(shape)
    # torch's default init draws from the global RNG; ours replaces it, so leave the RNG as found
    with torch.random.fork_rng(devices=[]):
        if arch == "mlp":
            return MLP(math.prod(dims), widths, cfg.gn_groups, cfg.ws_eps, cfg.norm)
        if arch == "resnet20_fixup":
            return FixupResNet20(dims[0], widths)
        make = ResNet14 if arch == "resnet14" else ResNet50
        return make(dims[0], widths, cfg.gn_groups, cfg.ws_eps, cfg.norm)


def build_backbone(cfg: ModelConfig, in_channels: InputShape, seed: int,
                   tower: int = 0) -> ResNet | MLP | FixupResNet20:
    """Tower ``tower``'s configured backbone for inputs of ``in_channels`` (a channel count
    or a sample's shape), initialised from the stream ``(seed, "init", "backbone", tower)``.

    The global torch RNG is neither used nor advanced. The dual encoder's tower built from the
    same seed is this network, parameter for parameter.
    """
    net = _resnet(cfg, in_channels, tower)
    _initialise(net, generator(seed, "init", "backbone", tower))
    return net


def build_projector(cfg: ModelConfig, in_dim: int, dims: tuple[int, ...], seed: int,
                    tower: int = 0, name: str = "projector") -> Projector:
    """A projector (or predictor, ``name``) initialised from the stream
    ``(seed, "init", name, tower)``."""
    with torch.random.fork_rng(devices=[]):
        projector = Projector(in_dim, tuple(dims), cfg.gn_groups, cfg.ws_eps, cfg.norm)
    _initialise(projector, generator(seed, "init", name, tower))
    return projector


def build_dual_encoder(cfg: ModelConfig, in_channels: InputShape,
                       projector_dims: tuple[int, ...], seed: int, head: Head | None = None,
                       y_shape: InputShape | None = None) -> DualEncoder:
    """The dual encoder of ``cfg``, initialised reproducibly from ``seed``.

    Each tower's backbone and projector draw from their own stream
    (``(seed, "init", "backbone" | "projector", tower)``), so changing the projector leaves the
    backbone's initialisation unchanged; the global torch RNG is neither used nor advanced.

    Args:
        cfg: the architecture; ``cfg.projector`` is ignored in favour of ``projector_dims``.
        in_channels: the first input's channels, or one sample's shape (``InputShape``).
        projector_dims: the projector widths (the caller resolves the method's default).
        seed: the run seed.
        head: BYOL's or SimSiam's predictor (from ``(seed, "init", "predictor", 0)``) and
            target (BYOL's starts as a copy of the online network), or None.
        y_shape: the second input's, when it differs from the first (paired data, two
            towers); None: ``in_channels``.
    """
    check_inputs(cfg, in_channels, y_shape)
    towers = []
    for tower in range(1 if cfg.shared else 2):
        shape = y_shape if tower == 1 and y_shape is not None else in_channels
        backbone = build_backbone(cfg, shape, seed, tower)
        projector = build_projector(cfg, backbone.feature_dim, projector_dims, seed, tower)
        towers.append((backbone, projector))
    predictor, target = head_modules(cfg, head, *towers[0], seed)
    model = DualEncoder(*towers[0], second=towers[1] if len(towers) > 1 else None,
                        predictor=predictor, target=target)
    model.encoding_bound = cfg.clip_encodings
    return model


def head_modules(cfg: ModelConfig, head: Head | None, backbone: nn.Module,
                 projector: nn.Module, seed: int
                 ) -> tuple[Projector | None, tuple[nn.Module, nn.Module] | None]:
    """What ``head`` adds around a shared tower: its predictor, initialised from the stream
    ``(seed, "init", "predictor", 0)`` with ``cfg``'s norm (None: the head has none), and
    its target network, a copy of the backbone and projector as they are now (None: the
    targets are the online projections, SimSiam's). None, None without a head."""
    if head is None:
        return None, None
    predictor = build_projector(cfg, projector.out_dim, head.predictor, seed, 0,
                                name="predictor") if head.predictor else None
    target = ((copy.deepcopy(backbone), copy.deepcopy(projector)) if head.target == "ema"
              else None)
    return predictor, target
