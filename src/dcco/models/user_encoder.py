"""A user's encoder (or two towers) as a ``DualEncoder``: dcco's projector, and a method's
predictor and target network (``dcco.dual_encoder``, re-exported by ``dcco.api``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from dcco.config import USER
from dcco.errors import ArgumentError, arguments_of
from dcco.methods.predictive import PredictiveMethod
from dcco.methods.registry import METHODS
from dcco.models.build import build_projector, head_modules
from dcco.models.dual import DualEncoder, Head


class IdentityProjector(nn.Identity):
    """No projector: the encoder's output is the encoding (``projector=None``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.in_dim = self.out_dim = dim


def feature_dim(encoder: nn.Module, sample: Tensor | None) -> int:
    """The width of ``encoder``'s output: its ``feature_dim`` attribute, or measured by one
    forward of ``sample`` (one input, without its batch dimension) in eval mode, without
    gradients; the module's train/eval mode is restored."""
    width = getattr(encoder, "feature_dim", None)
    if isinstance(width, int):
        return width
    if sample is None:
        raise ArgumentError(f"encoder: {type(encoder).__name__} has no feature_dim attribute; "
                            f"give a sample input to measure its output width")
    was_training = encoder.training
    first = next(encoder.parameters(), None)
    if first is not None:  # the sample as the encoder's weights are: dtype and device
        sample = sample.to(first.device)
        if sample.is_floating_point():
            sample = sample.to(first.dtype)
    encoder.eval()
    try:
        with torch.no_grad():
            out = encoder(sample[None])
    except Exception as e:
        raise ArgumentError(f"encoder: {type(encoder).__name__} failed on one sample of shape "
                            f"{tuple(sample.shape)} (measuring its output width): "
                            f"{type(e).__name__}: {e}") from e
    finally:
        encoder.train(was_training)
    if not isinstance(out, Tensor) or out.ndim != 2:
        raise ArgumentError(f"encoder: {type(encoder).__name__} must map a batch to (N, d) "
                            f"encodings; "
                            f"one sample of shape {tuple(sample.shape)} gave "
                            f"{tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
    return int(out.shape[1])


def dual_encoder(encoder: nn.Module, projector: Iterable[int] | None = USER.projector, *,
                 second: nn.Module | None = None, sample: Tensor | None = None,
                 sample_y: Tensor | None = None, seed: int = 0, method: str | None = None,
                 predictor: Iterable[int] | None = None) -> DualEncoder:
    """Your encoder (or two towers) with dcco's projector, as a ``DualEncoder``; with
    ``method``, also the predictor and target network that method trains with.

    >>> import torch
    >>> net = dual_encoder(torch.nn.Linear(8, 16), (32, 32), sample=torch.zeros(8),
    ...                    method="byol_fedavg")
    >>> net.predictor.out_dim, net.target is not None
    (32, True)

    Parameters
    ----------
    encoder : nn.Module
        Maps a batch of inputs to (N, feature_dim) features; it keeps its own
        weights (the projector is initialised from ``seed``).
    projector : Iterable[int] | None (default: (512, 512, 512))
        The projector's widths (dcco's MLP with group norm and weight
        standardisation, paper §4), or None for none (the encoder's output is the
        encoding). Default: ``dcco.config.USER.projector`` (512³), as ``dcco.fit``'s.
    second : nn.Module | None (default: None)
        A second tower for the second input (two modalities); None: ``encoder``
        encodes both views.
    sample, sample_y : Tensor | None (default: None)
        One input of each tower (no batch dimension), to measure an
        encoder's output width when it has no ``feature_dim`` attribute.
    seed : int (default: 0)
        The projectors' (and predictor's) initialisation.
    method : str | None (default: None)
        A method of ``dcco.methods.registry``. BYOL's (``byol_fedavg``, ``fedu``,
        ``fedema``) adds a predictor and a target network, a copy of your encoder and
        the projector that the server moves by EMA; SimSiam's adds a predictor;
        ``moco_fedavg`` adds its key encoder, a target network without a predictor.
        The other methods, and None, add nothing.
    predictor : Iterable[int] | None (default: None)
        The predictor's widths, ending in the projection width; None: the
        method's paper default (BYOL: the projector's first width, then d; SimSiam:
        d/4, then d).
    """
    from dcco.config import ModelConfig

    dims = None if projector is None else tuple(int(d) for d in projector)
    heads = []
    for tower, (module, x) in enumerate(((encoder, sample), (second, sample_y))[: 1 + (
            second is not None)]):
        width = feature_dim(module, x)
        if not hasattr(module, "feature_dim"):
            module.feature_dim = width
        with arguments_of("dual_encoder", {}):
            heads.append(IdentityProjector(width) if dims is None else
                         build_projector(ModelConfig(), width, dims, seed, tower))
    if len(heads) == 2 and heads[0].out_dim != heads[1].out_dim:
        raise ArgumentError(f"the two towers must encode to one width: {heads[0].out_dim} and "
                            f"{heads[1].out_dim} (give projector widths, or encoders of equal "
                            f"output)")
    second_tower = (second, heads[1]) if second is not None else None
    head = _head(method, predictor, dims or (heads[0].out_dim,))
    if head is not None and second is not None:
        raise ArgumentError(f"{method} trains a predictor or target network around one encoder "
                            f"shared by both views; leave second=None")
    predictor_net, target = head_modules(ModelConfig(), head, encoder, heads[0], seed)
    return DualEncoder(encoder, heads[0], second=second_tower, predictor=predictor_net,
                       target=target)


def _head(method: str | None, predictor: Iterable[int] | None,
          dims: tuple[int, ...]) -> Head | None:
    """The predictor and target ``method`` trains with, after a projector of widths
    ``dims`` (the encoder's width alone without one)."""
    if method is None:
        if predictor is not None:
            raise ArgumentError("predictor= sizes a method's predictor: give method= too")
        return None
    if method not in METHODS:
        raise ArgumentError(f"method: unknown method {method!r}; choose from {', '.join(sorted(METHODS))}")
    cls = METHODS[method]
    if not issubclass(cls, PredictiveMethod):
        if predictor is not None:
            raise ArgumentError(f"{method} has no predictor; leave predictor=None")
        return None
    d, default = dims[-1], cls.default_predictor(dims)
    widths = default if predictor is None else tuple(int(w) for w in predictor)
    if not default and widths:
        raise ArgumentError(f"{method} has no predictor (its key encoder is a target network "
                            f"alone); leave predictor=None")
    if default and (len(widths) < 2 or min(widths) < 1):
        raise ArgumentError(f"{method}'s predictor needs two or more positive widths (hidden, "
                            f"then d = {d}), got {list(widths)}; None: its default")
    if widths and widths[-1] != d:
        raise ArgumentError(f"the predictor must end in the projection width {d}, got "
                            f"{list(widths)}")
    return Head(widths, cls.target)



__all__ = ["IdentityProjector", "dual_encoder", "feature_dim"]
