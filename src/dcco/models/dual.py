"""The dual encoder: two inputs to two encodings through one shared network or two towers, with
BYOL's and SimSiam's predictor and target (``Head``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.models.layers import Projector, has_batch_norm
from dcco.models.resnet import ResNet


@dataclass(frozen=True)
class Head:
    """What BYOL and SimSiam add to a shared dual encoder (``dcco.methods.predictive``).

    Attributes:
        predictor: the predictor MLP's widths; the last is the projection width d. Empty:
            none (MoCo's key encoder, a target network without a predictor).
        target: where the regression targets come from: "stopgrad", the online projections
            with their gradient stopped (SimSiam); "ema", a moving-average copy of the online
            backbone and projector (BYOL's target network, ``DualEncoder.update_target``).
    """

    predictor: tuple[int, ...]
    target: Literal["stopgrad", "ema"]


def clip_scale(z: Tensor, bound: float) -> Tensor:
    """Each row's factor min(1, bound / ‖z‖) that clips it to L2 norm ``bound`` (FedSC's
    z ← z if ‖z‖ < √μ, else √μ z/‖z‖): (N, d) → (N, 1). Its gradient is zero where a row is
    within the bound, and finite for a zero row."""
    norm = torch.linalg.vector_norm(z, dim=1, keepdim=True)
    return bound / norm.clamp_min(bound)


@contextmanager
def buffers_kept(module: nn.Module) -> Iterator[None]:
    """Restores a module's buffers (batch norm's running statistics) on exit, so that
    forwards made to measure (a client's statistics, the collapse probe) leave the model as it
    was."""
    saved = {n: b.detach().clone() for n, b in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(saved[n])


class DualEncoder(nn.Module):
    """Encodes a pair of inputs (X, Y) into a pair of encodings (F, G) (paper §3).

    With one tower (``second`` None) both inputs go through the same backbone and projector, in
    one forward pass over the concatenated batch (each view on its own with batch norm, which
    would otherwise normalise the two views together); otherwise Y has its own backbone and
    projector (``backbone2``, ``projector2``).

    With a predictor (BYOL, SimSiam) the encodings are predictions and their targets side by
    side: F = [q(z₁), y₁] and G = [q(z₂), y₂], each (N, 2d), where z are the online
    projections, q the predictor and y the targets: z with its gradient stopped (SimSiam), or
    the target network's projections (BYOL), which take no gradient either. The loss pairs
    q(z₁) with y₂ and q(z₂) with y₁.

    Args:
        backbone, projector: the first tower (the only one when shared). A backbone is any
            module mapping a batch of inputs to (N, feature_dim) features, with a
            ``feature_dim`` attribute (``ResNet``, ``MLP``, or the user's own, e.g. a text
            encoder: docs/multimodal.md).
        second: the second tower's (backbone, projector), or None for a shared network; its
            input may have another shape and kind than the first's.
        predictor: the predictor head, or None.
        target: BYOL's target network, (backbone, projector) copies whose parameters take no
            gradient, or None.
    """

    autocast_dtype: torch.dtype | None = None
    """Training forwards run the backbones under autocast to this dtype (bf16 precision,
    ``dcco.core.precision``); the projectors, and ``encode``/``features``, stay in the weights'
    dtype."""
    channels_last: bool = False
    """Training forwards feed the backbones NHWC (channels-last) inputs."""
    unit_encodings: bool = False
    """Training forwards return F and G scaled to unit L2 norm per sample: what bounds a
    client's statistics under differential privacy (``dcco.core.privacy``)."""
    encoding_bound: float | None = None
    """Training forwards scale each sample's F and G down to at most this L2 norm (FedSC's
    clipping at √μ, ``ModelConfig.clip_encodings``); None: no clipping. Unit encodings, when
    set, come first (and are within any bound ≥ 1)."""

    def __init__(self, backbone: nn.Module, projector: Projector,
                 second: tuple[nn.Module, Projector] | None = None,
                 predictor: Projector | None = None,
                 target: tuple[ResNet, Projector] | None = None) -> None:
        super().__init__()
        self.backbone, self.projector = backbone, projector
        self.backbone2 = second[0] if second else None
        self.projector2 = second[1] if second else None
        if second and second[1].out_dim != projector.out_dim:
            raise ValueError(f"DualEncoder towers must project to one dimension, got "
                             f"{projector.out_dim} and {second[1].out_dim}")
        if (predictor is not None or target is not None) and second is not None:
            raise ValueError("a predictor or target network needs a shared dual encoder "
                             "(model.shared = true)")
        if predictor is not None and (predictor.in_dim, predictor.out_dim) != (
                projector.out_dim, projector.out_dim):
            raise ValueError(f"the predictor must map the projection width "
                             f"{projector.out_dim} to itself, got {predictor.in_dim} → "
                             f"{predictor.out_dim}")
        self.predictor = predictor
        self.target = None
        if target is not None:
            self.target = nn.Sequential(*target)
            self.target.requires_grad_(False)
        self.batch_norm = has_batch_norm(self)
        """Whether a forward normalises over its batch (``ModelConfig.norm = "bn"``)."""

    @property
    def shared(self) -> bool:
        """Whether both inputs go through one network."""
        return self.backbone2 is None

    @property
    def feature_dim(self) -> int:
        """Backbone output width (of the first tower)."""
        return self.backbone.feature_dim

    @property
    def projection_dim(self) -> int:
        """d, the width of the projections (F and G are 2d wide with a predictor or a
        target network)."""
        return self.projector.out_dim

    def _tower(self, tower: int) -> tuple[nn.Module, nn.Module]:
        if tower not in (0, 1):
            raise ValueError(f"DualEncoder tower must be 0 or 1, got {tower!r}")
        if tower == 0 or self.shared:
            return self.backbone, self.projector
        return self.backbone2, self.projector2

    def forward(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        """Projections of both inputs (with a predictor, predictions and targets).

        Args:
            x1, x2: images (N1, C, H, W) and (N2, C, H, W); with two towers, each its own
                tower's input (shapes and kinds may differ).

        Returns:
            F (N1, d) and G (N2, d); (N1, 2d) and (N2, 2d) with a predictor or a target
            network.
        """
        if not self.shared:
            return (self._unit(self.projector(self._backbone_features(self.backbone, x1))),
                    self._unit(self.projector2(self._backbone_features(self.backbone2, x2))))
        z1, z2 = self._pair(lambda x: self.projector(self._backbone_features(self.backbone, x)),
                            x1, x2)
        if self.predictor is None and self.target is None:
            return self._unit(z1), self._unit(z2)
        # MoCo's key encoder comes without a predictor: its queries are the projections
        q1, q2 = self._pair(self.predictor, z1, z2) if self.predictor is not None else (z1, z2)
        if self.target is None:
            y1, y2 = z1.detach(), z2.detach()
        else:
            backbone, projector = self.target
            with torch.no_grad():
                y1, y2 = self._pair(lambda x: projector(self._backbone_features(backbone, x)),
                                    x1, x2)
        return (self._unit(torch.cat([q1, y1], dim=1)),
                self._unit(torch.cat([q2, y2], dim=1)))

    def _pair(self, fn, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """``fn`` of both views: one call on the concatenated batch, or one call per view
        with batch norm (each view normalised on its own, as BYOL and SimSiam do)."""
        if self.batch_norm:
            return fn(a), fn(b)
        out = fn(torch.cat([a, b]))
        return out[: a.shape[0]], out[a.shape[0]:]

    @torch.no_grad()
    def update_target(self, tau: float) -> None:
        """BYOL's target update: ξ ← τ ξ + (1 − τ) θ for every target parameter ξ and its
        online parameter θ (backbone and projector; the target's batch-norm statistics are
        its own)."""
        if self.target is None:
            raise ValueError("this dual encoder has no target network")
        online = [*self.backbone.parameters(), *self.projector.parameters()]
        for xi, theta in zip(self.target.parameters(), online, strict=True):
            xi.lerp_(theta, 1.0 - tau)

    def target_pairs(self) -> list[tuple[str, str]]:
        """(target parameter name, online parameter name) for each parameter of BYOL's target
        network, in the order ``update_target`` pairs them: ``target.0.*`` with
        ``backbone.*``, ``target.1.*`` with ``projector.*``."""
        if self.target is None:
            raise ValueError("this dual encoder has no target network")
        online = [*(f"backbone.{n}" for n, _ in self.backbone.named_parameters()),
                  *(f"projector.{n}" for n, _ in self.projector.named_parameters())]
        target = [f"target.{n}" for n, _ in self.target.named_parameters()]
        return list(zip(target, online, strict=True))

    def _unit(self, z: Tensor) -> Tensor:
        """The encodings as the loss sees them: unit norm under differential privacy, clipped
        to ``encoding_bound``, or as they are."""
        if self.unit_encodings:
            return F.normalize(z, dim=1)
        if self.encoding_bound is None:
            return z
        return z * clip_scale(z, self.encoding_bound)

    def _backbone_features(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """A training forward's backbone features: under autocast to ``autocast_dtype`` if
        set, returned in the weights' dtype for the projector."""
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.autocast_dtype is None:
            return backbone(x)
        with torch.autocast(x.device.type, dtype=self.autocast_dtype):
            h = backbone(x)
        return h.to(self.projector[-1].weight.dtype)

    def encode(self, x: Tensor, tower: int = 0) -> Tensor:
        """Projections of one input through one tower: (N, C, H, W) → (N, d)."""
        backbone, projector = self._tower(tower)
        return projector(backbone(x))

    def features(self, x: Tensor, tower: int = 0) -> Tensor:
        """Backbone features, the projector discarded (for evaluation): (N, C, H, W) →
        (N, feature_dim)."""
        return self._tower(tower)[0](x)
