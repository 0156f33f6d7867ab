"""The ``dcco.flower.DCCOStrategy`` strategy's round under SecAgg+: the server sees only sums.

Both exchanges go through Flower's SecAgg+ (``dcco.flower.secagg``: the ranges, the wire
format and the workflow), as in dcco's own app (docs/flower.md, "Secure aggregation"). Each
round, the server runs one client-style step of the nodes' model on its own calibration
samples (``SecAgg.samples``): it gives the public frame in which the nodes standardise their
statistics and the unit of their updates, so that the values fit SecAgg+'s fixed-point range.

What the server then learns of a round: the sample-weighted averages of the statistics and of
the updates, the average loss, the share of values that SecAgg+'s clipping cut, and the
nodes' counts (Flower's SecAgg+ reveals them); nothing of one node's statistics, update or
loss. A reply cannot be checked one by one (the server never sees one): the unmasked
averages are checked (their sizes, finite values) instead, and SecAgg+ leaves out the nodes
that fail to take part. Flower's protocol needs at least 2 nodes an exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from dcco.core.seeding import derive_seed
from dcco.flower import secagg
from dcco.flower.appconfig import FlowerConfig
from dcco.methods.base import Method
from dcco.models.dual_views import dual_view


@dataclass(frozen=True)
class SecAgg:
    """SecAgg+ for both exchanges of the strategy's rounds (``DCCOStrategy(secagg=SecAgg(...))``).

    The ClientApp's ``train`` handler then needs ``mods=[dcco.flower.secure_aggregation_mod]``
    (Flower's ``secaggplus_mod`` for SecAgg+'s messages).

    Parameters
    ----------
    model : nn.Module
        An instance of the nodes' model (its weights come from each round): the
        server's calibration step runs it.
    samples : Tensor
        The server's own samples for that step, (n, ...) with n >= 2 (a few dozen,
        like the nodes' own: public data, or data the server may hold).
    augment : Callable[[Tensor], Tensor] | None (default: None)
        The nodes' augmentation (None: the samples as both views).
    max_samples : int
        The most samples one node holds (SecAgg+'s ``max_weight``); a node
        with more refuses to answer, naming both.
    stats_clip, update_clip : float (default: 64.0)
        The clipping ranges of the statistics (in units of the
        calibration frame: encodings up to ~8 of its standard deviations pass) and the
        updates (in units of the calibration step's largest |Δ|).
    quantization : int (default: 4194304)
        SecAgg+'s quantisation range (Flower's default, as the next three;
        ``dcco.flower.appconfig.FlowerConfig``'s ``secagg_*`` say what each does).
    modulus : int (default: 4294967296)
        SecAgg+'s modulus.
    shares : float (default: 1.0)
        The fraction of the nodes each node shares its secrets with.
    threshold : float (default: 0.5)
        The fraction of those shares that reconstructs a secret.
    """

    model: nn.Module
    samples: Tensor
    max_samples: int
    augment: Callable[[Tensor], Tensor] | None = None
    stats_clip: float = 64.0
    update_clip: float = 64.0
    quantization: int = 1 << 22
    modulus: int = 1 << 32
    shares: float = 1.0
    threshold: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"SecAgg.model must be an instance of the nodes' model, got "
                            f"{type(self.model).__name__}")
        if not isinstance(self.samples, Tensor) or self.samples.ndim < 1 or \
                self.samples.shape[0] < 2:
            raise ValueError("SecAgg.samples must be a tensor of at least 2 samples, (n, ...)")
        if int(self.max_samples) < 1:
            raise ValueError(f"SecAgg.max_samples must be >= 1, got {self.max_samples}")
        buffers = [k for k, v in self.model.state_dict().items() if v.is_floating_point()
                   and k not in dict(self.model.named_parameters())]
        if buffers:
            raise ValueError(f"SecAgg+ in the strategy does not average the model's floating "
                             f"buffers ({buffers[0]}: batch norm's running statistics); use "
                             f"a model without them (GroupNorm) or secagg=None")
        try:
            self.flower_config(600.0)
        except ValueError as e:
            raise ValueError(str(e).replace("flower.secagg_", "SecAgg.")) from None

    def flower_config(self, timeout: float) -> FlowerConfig:
        """These settings in dcco's app's form (``secagg.secure_average`` reads them)."""
        return FlowerConfig(timeout=timeout, secagg=True, secagg_stats_clip=self.stats_clip,
                            secagg_update_clip=self.update_clip,
                            secagg_quantization=self.quantization,
                            secagg_modulus=self.modulus, secagg_shares=self.shares,
                            secagg_threshold=self.threshold)


def calibration(sa: SecAgg, weights: dict[str, Tensor], method: Method, local_lr: float,
                seed: int, r: int) -> secagg.SecureScales:
    """Round ``r``'s public ranges: one client-style step of the round's model on the
    server's samples (views seeded by ``(seed, r)``)."""
    from dcco.flower.userapp import load_weights  # the nodes' own loading
    from dcco.run.views import user_views

    load_weights(sa.model, weights)
    dtype = next(sa.model.parameters()).dtype
    if sa.augment is None:
        x1 = x2 = sa.samples.to(dtype) if sa.samples.is_floating_point() else sa.samples
    else:
        x1, x2 = user_views(sa.augment, sa.samples, derive_seed(seed, "calibrate"), r, dtype)
    dual, _ = dual_view(sa.model)
    return secagg.calibrate(dual, method, x1, x2, local_lr)


__all__ = ["SecAgg", "calibration"]
