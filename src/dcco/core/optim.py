"""Server optimisers (Adam, LARS) and the cosine learning-rate schedule with warm-up.

The server treats the sample-weighted average of the clients' updates as a pseudo-gradient
(negated), as in FedOpt (Reddi et al. 2021); in centralized training it is the ordinary
gradient. The schedule is a pure function of the step, so resuming needs only the step count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from dcco.config import OptimConfig
from dcco.moved import moved_names


def trust_ratio(w_norm: Tensor, g_norm: Tensor, coefficient: float = 1.0) -> Tensor:
    """LARS's trust ratio η‖w‖/‖g‖ from the norms (0-d, or stacked element by element), 1
    where either norm is 0; chosen on the device, without reading it back."""
    return torch.where((w_norm > 0) & (g_norm > 0), coefficient * w_norm / g_norm,
                       torch.ones_like(w_norm))


def scheduled_lr(step: int, total_steps: int, base_lr: float, warmup_steps: int = 0,
                 schedule: str = "cosine") -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine decay to zero.

    Args:
        step: the step about to be taken, 0 ≤ step < total_steps.
        total_steps: length of the run.
        base_lr: peak learning rate.
        warmup_steps: steps of linear warm-up from base_lr / warmup_steps.
        schedule: ``"cosine"`` or ``"constant"`` (after warm-up).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class LARS(torch.optim.Optimizer):
    """LARS (You et al. 2017) with momentum, as used by SimCLR, BYOL and Barlow Twins.

    Parameter groups with ``exclude=True`` (biases and normalisation parameters) get neither
    the trust-ratio adaptation nor weight decay.

    ``foreach``: one multi-tensor kernel per operation over a group's parameters instead of a
    loop over them (``torch._foreach_*``); None (default) uses it where every parameter is on
    CUDA, as PyTorch's own optimisers do. Both compute the same update up to rounding (the
    norms' reduction order); the loop stays the CPU path, which earlier results used.
    """

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 1e-3,
                 foreach: bool | None = None) -> None:
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                        "trust_coefficient": trust_coefficient, "exclude": False}
        super().__init__(params, defaults)
        self.foreach = foreach

    def _use_foreach(self) -> bool:
        if self.foreach is not None:
            return self.foreach
        return all(p.is_cuda for g in self.param_groups for p in g["params"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if self._use_foreach():
            for group in self.param_groups:
                self._foreach_step(group)
            return loss
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if not group["exclude"]:
                    if group["weight_decay"] > 0:
                        grad = grad.add(p, alpha=group["weight_decay"])
                    grad = grad * trust_ratio(torch.linalg.vector_norm(p),
                                              torch.linalg.vector_norm(grad),
                                              group["trust_coefficient"])
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(grad)
                p.add_(buf, alpha=-group["lr"])
        return loss

    def _foreach_step(self, group: dict) -> None:
        """The loop's update for one group, as multi-tensor operations."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if not group["exclude"]:
            if group["weight_decay"] > 0:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            w = torch.stack(torch._foreach_norm(params))
            g = torch.stack(torch._foreach_norm(grads))
            grads = torch._foreach_mul(grads, trust_ratio(w, g, group["trust_coefficient"])
                                       .unbind())
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            bufs.append(state["momentum_buffer"])
        torch._foreach_mul_(bufs, group["momentum"])
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-group["lr"])


def build_optimizer(named_params: Iterable[tuple[str, nn.Parameter]],
                    cfg: OptimConfig, fast: bool | None = None) -> torch.optim.Optimizer:
    """Adam or LARS over the given parameters.

    For LARS, 1-D parameters (biases, group-norm scales and shifts) form a group excluded from
    adaptation and weight decay. Adam applies decoupled weight decay (AdamW) to ≥2-D parameters
    only, when weight_decay > 0. Under either, the 1-D group's learning rate is
    ``cfg.vector_lr_scale`` times the others' (``set_lr`` keeps the ratio).

    ``fast``: the fused Adam and the multi-tensor LARS; None (default) where every parameter
    is on CUDA. False gives PyTorch's default Adam and the looping LARS (the CPU path, and
    the GPU path before the fused optimisers; ``benchmarks/round_cost.py`` compares them).
    """
    params = [(n, p) for n, p in named_params if p.requires_grad]
    matrices = [p for _, p in params if p.ndim > 1]
    vectors = [p for _, p in params if p.ndim <= 1]
    if fast is None:
        fast = bool(params) and all(p.is_cuda for _, p in params)
    if cfg.optimizer == "lars":
        groups = [{"params": matrices},
                  {"params": vectors, "exclude": True, "weight_decay": 0.0,
                   "lr": cfg.lr * cfg.vector_lr_scale, "lr_scale": cfg.vector_lr_scale}]
        return LARS(
            [g for g in groups if g["params"]], lr=cfg.lr, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay, trust_coefficient=cfg.trust_coefficient,
            foreach=fast,
        )
    groups = [{"params": matrices},
              {"params": vectors, "weight_decay": 0.0, "lr": cfg.lr * cfg.vector_lr_scale,
               "lr_scale": cfg.vector_lr_scale}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD([g for g in groups if g["params"]], lr=cfg.lr,
                               weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
        weight_decay=cfg.weight_decay, fused=True if fast else None,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (times the group's ``lr_scale``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def apply_pseudo_gradient(optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
                          grads: list[Tensor]) -> None:
    """Take one optimiser step with ``grads`` as the gradient of ``params``."""
    for p, g in zip(params, grads, strict=True):
        g = g.to(p.dtype)
        if g.stride() != p.stride():  # fused Adam wants a gradient laid out as its parameter
            g = torch.empty_like(p).copy_(g)
        p.grad = g
    optimizer.step()
    for p in params:
        p.grad = None


__getattr__ = moved_names(__name__)  # old names of dcco.config's classes, warned
