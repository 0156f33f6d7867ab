"""One client's work, as a device runs it: statistics of its encodings and its local steps.

The simulator's ``reference`` backend and the Flower client app call these same functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from dcco.core.client_state import Layout
from dcco.core.method import Method
from dcco.core.optim import trust_ratio
from dcco.core.privacy import clip_update
from dcco.core.stats import CCO_STATS, EncodingStats, Moments, StatsSpec, encoding_stats


@dataclass(frozen=True)
class ClientUpdate:
    """What a client returns after its local step.

    Attributes:
        delta: θ_k − θ for every trainable parameter, by name (one SGD step: −lr·∇L_k).
        num_samples: N_k, the FedAvg weight.
        loss: the client's loss before the step.
    """

    delta: dict[str, Tensor]
    num_samples: int
    loss: float


@dataclass(frozen=True)
class LocalSGD:
    """What a client's local steps add to plain SGD, as ``torch.optim.SGD`` with
    ``clip_grad_norm_`` before each step (FedSC's clients: momentum 0.9, weight decay 5e-4,
    clip 3). The momentum buffer starts empty every round, as FedSC's clients build a new
    optimiser for every round. Built from ``[train]``'s ``local_momentum``,
    ``local_weight_decay`` and ``local_grad_clip``, whose values ``TrainConfig`` checks.

    Attributes:
        momentum: μ, the heavy-ball coefficient: b ← μ b + d (b = d at the first step).
        weight_decay: λ, added to the gradient as λ θ (coupled, after the clipping).
        grad_clip: the largest L2 norm of each step's gradient over all parameters together
            (scaled by min(1, c / (‖g‖ + 1e-6)), as ``clip_grad_norm_``), or None.
    """

    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None

    @property
    def one_step_is_sgd(self) -> bool:
        """Whether one step is the plain SGD step (momentum alone changes nothing then)."""
        return self.weight_decay == 0.0 and self.grad_clip is None

    def directions(self, grads: list[Tensor | None], params: list[Tensor],
                   buffers: list[Tensor | None]) -> list[Tensor | None]:
        """One step's directions from its gradients at ``params``: clipped, decayed, then
        through the momentum ``buffers`` (updated in place; None at the round's start)."""
        if self.grad_clip is not None:
            norms = [torch.linalg.vector_norm(g) for g in grads if g is not None]
            total = torch.linalg.vector_norm(torch.stack(norms)) if norms else None
            if total is not None:
                scale = torch.clamp(self.grad_clip / (total + 1e-6), max=1.0)
                grads = [None if g is None else g * scale for g in grads]
        out: list[Tensor | None] = []
        for i, (g, p) in enumerate(zip(grads, params, strict=True)):
            if g is not None and self.weight_decay:
                g = g + self.weight_decay * p
            if g is not None and self.momentum:
                g = g if buffers[i] is None else self.momentum * buffers[i] + g
                buffers[i] = g
            out.append(g)
        return out


PLAIN_SGD = LocalSGD()


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The (name, parameter) pairs a round updates, in a fixed order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@torch.no_grad()
def client_statistics(model: nn.Module, x1: Tensor, x2: Tensor,
                      spec: StatsSpec = CCO_STATS) -> EncodingStats:
    """Phase 1 of a DCCO round: the count and sums of the client's encodings.

    Args:
        model: the dual encoder broadcast by the server; ``model(x1, x2)`` returns (F, G).
        x1, x2: the two views of the client's N_k samples, (N_k, C, H, W).
        spec: which sums the method shares (default: the CCO loss's).
    """
    f, g = model(x1, x2)
    return encoding_stats(f, g, spec)


def sgd_delta(named: list[tuple[str, nn.Parameter]], loss: Tensor,
              local_lr: float) -> dict[str, Tensor]:
    """One SGD step of rate ``local_lr`` on ``loss`` as a delta, −local_lr·∇loss, for each of
    the ``named`` parameters (zeros where the loss does not reach one)."""
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {name: (torch.zeros_like(p) if gr is None else -local_lr * gr)
            for (name, p), gr in zip(named, grads, strict=True)}


def local_batches(num_samples: int, steps: int, batch: int | None) -> list[Tensor]:
    """The sample positions of each of a client's E local steps: consecutive slices of size
    ``batch`` (all samples when None or larger), wrapping around, so every sample is used
    equally often and the schedule needs no randomness (the round's views are random)."""
    size = num_samples if batch is None else min(batch, num_samples)
    return [torch.arange(e * size, (e + 1) * size) % num_samples for e in range(steps)]


def client_update(model: nn.Module, method: Method, x1: Tensor, x2: Tensor,
                  shared: Moments | None, local_lr: float, local_steps: int = 1,
                  local_batch: int | None = None, clip: float | None = None,
                  own_statistics: bool = False, layerwise: bool = False,
                  mix: bool = False, alpha: float | None = None,
                  sgd: LocalSGD = PLAIN_SGD,
                  after_step: Callable[[dict[str, Tensor]], None] | None = None
                  ) -> ClientUpdate:
    """Phase 2: E local SGD steps on the method's client loss, returned as a model delta.

    One step on all the client's samples (the paper's setting) gives −local_lr·∇L_k exactly:
    the model itself is left unchanged, and computing θ' − θ after an in-place step would add
    rounding error of the size of θ. With E > 1 steps, or minibatches of ``local_batch``
    samples (``local_batches``), the delta accumulates the steps, each gradient taken at
    θ + Δ (``torch.func.functional_call``), with ``shared`` held fixed through the round: the
    paper's "partial gradients and stale statistics".

    Args:
        shared: the server's aggregated moments S_A (DCCO), or None.
        local_lr: the client learning rate (paper: 1.0).
        local_steps: E.
        local_batch: samples per local step; None: all of them.
        clip: the delta's largest L2 norm (all parameters together; differential privacy,
            ``dcco.core.privacy.clip_update``), or None.
        own_statistics: with several steps, each step's loss follows the client's own
            statistics, L(S_A + (N_k/N)(S_k − S_k⁰)) · N/N_k (``AnchoredMethod.refreshed_loss``,
            S_k⁰ from a no-grad forward of the step's samples at the round's model), instead
            of the anchored L(S_k + sg(S_A − S_k)), whose value never moves. The same first
            step; methods without statistics ignore it.
        layerwise: with several steps, each parameter tensor steps by local_lr × r_e × its
            gradient, r_e = ‖θ₀‖/‖g_e‖ (θ₀ the tensor at the round's start; 1 where either
            norm is 0, so a zero tensor takes SGD steps), so every tensor moves by local_lr
            of its norm per step, as LARS does on the server (``local_lr`` is then a relative
            step). The delta comes back in the first step's SGD units, Δ/r_0, so
            ``pseudo_gradient = "mean_gradient"`` reads a mean gradient. One step is the SGD
            step exactly (the same code). As local_lr → 0 with every step on all the samples
            (r_e → r_0) both tend to the same limit; with minibatches the steps are weighted
            by 1/‖g_e‖, so the limits differ.
        alpha: with ``own_statistics``, FedSC's weight of the client's own statistics in
            place of N_k/N: each step on L(α S_k + (1 − α) S_ext)/α (``stats.others_mix``);
            None: N_k/N, the exact weight. Any other α is not the centralized step.
        sgd: momentum, weight decay and gradient clipping of the local steps (``LocalSGD``;
            FedSC's recipe); one step with neither decay nor clipping is the SGD step.
        after_step: called after each local step with the weights it reached, θ + Δ by
            name (a stateful client's target network follows them:
            ``stateful_update``); it may change the model's other tensors in place, never
            the trainable parameters.
        mix: ``shared`` is a stale aggregate A, and the loss is taken at the mix
            (N_k/N)·S_k + (1 − N_k/N)·A (``AnchoredMethod.refreshed_loss`` with S_k⁰ = A),
            N = A's count: the client's own statistics fresh, the others' stale
            (``train.stale_statistics = "own"``).

    Returns:
        The delta, the client's sample count (its FedAvg weight) and its loss before the
        first step.
    """
    named = trainable_parameters(model)
    n = int(x1.shape[0])
    if mix and (shared is None or shared.count is None or method.stats is None):
        raise ValueError("the own-statistics mix needs a statistics method and the "
                         "aggregate's sample count N")
    if local_steps == 1 and (local_batch is None or local_batch >= n) and (
            alpha is None or not own_statistics) and sgd.one_step_is_sgd:
        delta, loss = _one_step(model, named, method, x1, x2, shared, local_lr, mix,
                                after_step)
    else:
        refresh = (own_statistics or mix) and shared is not None and method.stats is not None
        if refresh and shared.count is None:
            raise ValueError("own_statistics needs the aggregate's sample count N")
        steps = _LocalSteps(model, named, method, shared, refresh, mix,
                            alpha if refresh and not mix else None, n)
        delta, loss = steps.run(x1, x2, local_lr, local_batches(n, local_steps, local_batch),
                                layerwise and local_steps > 1, sgd, after_step)
    if clip is not None:
        delta = clip_update(delta, clip)
    return ClientUpdate(delta=delta, num_samples=n, loss=loss)


def _one_step(model: nn.Module, named: list[tuple[str, nn.Parameter]], method: Method,
              x1: Tensor, x2: Tensor, shared: Moments | None, local_lr: float, mix: bool,
              after_step: Callable[[dict[str, Tensor]], None] | None
              ) -> tuple[dict[str, Tensor], float]:
    """The paper's round for a client: one SGD step on all its samples, −local_lr·∇L_k
    exactly (the model left as it is), and its loss; under the stale mix, on the mix's loss
    / w (its gradient ∇L(mix)·∂S_k, on the anchored loss's scale)."""
    f, g = model(x1, x2)
    w = min(1.0, int(x1.shape[0]) / float(shared.count)) if mix else 1.0
    loss = (method.refreshed_loss(f, g, shared, shared, w) if mix
            else method.client_loss(f, g, shared))
    delta = sgd_delta(named, loss, local_lr)
    if after_step is not None:
        after_step({name: p.detach() + delta[name] for name, p in named})
    return delta, float(loss.detach()) * w


class _LocalSteps:
    """A client's several local steps (``client_update``): each gradient at θ + Δ, the
    statistics S_A held through the round, each step's loss anchored, or following the
    client's own statistics (``refresh``: from S_k⁰ of the step's samples at the round's
    model, or from A under the stale ``mix``), with FedSC's ``alpha`` where given."""

    def __init__(self, model: nn.Module, named: list[tuple[str, nn.Parameter]],
                 method: Method, shared: Moments | None, refresh: bool, mix: bool,
                 alpha: float | None, n: int) -> None:
        self.model, self.named, self.method, self.shared = model, named, method, shared
        self.refresh, self.mix, self.alpha = refresh, mix, alpha
        self.weight = min(1.0, n / float(shared.count)) if refresh else 1.0  # N_k / N
        # a forward that changes no running statistics and draws no dropout gives the same
        # S_k⁰ for consecutive steps on the same samples
        self.deterministic = refresh and not mix and next(model.buffers(), None) is None and (
            not any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()))
        self.last_start: tuple[tuple[int, ...], Moments] | None = None

    def loss(self, f: Tensor, g: Tensor, x1: Tensor, x2: Tensor, idx: Tensor) -> Tensor:
        """A step's loss on its samples ``idx`` (their encodings ``f``, ``g`` at θ + Δ)."""
        if not self.refresh:
            return self.method.client_loss(f, g, self.shared)
        if self.mix:  # the client's share moves from A (its fresh statistics, then its steps)
            start = self.shared
        else:  # at the round's model: the same for consecutive steps on the same samples
            key = tuple(idx.tolist())
            if not (self.deterministic and self.last_start is not None
                    and self.last_start[0] == key):
                with torch.no_grad():
                    self.last_start = key, encoding_stats(
                        *self.model(x1[idx], x2[idx]), self.method.stats).moments()
            start = self.last_start[1]
        if self.alpha is not None:
            return self.method.others_loss(f, g, self.shared, start, self.weight, self.alpha)
        return self.method.refreshed_loss(f, g, self.shared, start, self.weight)

    def run(self, x1: Tensor, x2: Tensor, local_lr: float, batches: list[Tensor],
            layerwise: bool, sgd: LocalSGD,
            after_step: Callable[[dict[str, Tensor]], None] | None
            ) -> tuple[dict[str, Tensor], float]:
        """The steps on ``batches``: the delta (in the first step's SGD units when
        ``layerwise``) and the round's loss at its start, L(S_A) unscaled."""
        named = self.named
        delta = {name: torch.zeros_like(p) for name, p in named}
        first_loss = None
        ratios: dict[str, Tensor | float] | None = None
        buffers: list[Tensor | None] = [None] * len(named)
        for idx in batches:
            current = {name: (p.detach() + delta[name]).requires_grad_(True)
                       for name, p in named}
            f, g = functional_call(self.model, current, (x1[idx], x2[idx]))
            loss = self.loss(f, g, x1, x2, idx)
            if first_loss is None:
                scaled = self.alpha if self.alpha is not None else self.weight
                first_loss = float(loss.detach()) * scaled
            grads = torch.autograd.grad(loss, list(current.values()), allow_unused=True)
            if sgd != PLAIN_SGD:
                grads = sgd.directions(list(grads), [v.detach() for v in current.values()],
                                       buffers)
            step = {name: (trust_ratio(p.detach().norm(), gr.norm())
                           if layerwise and gr is not None else 1.0)
                    for (name, p), gr in zip(named, grads)}  # ‖θ₀‖/‖g_e‖
            ratios = step if ratios is None else ratios
            for (name, _), gr in zip(named, grads):
                if gr is not None:
                    delta[name] = delta[name] - (local_lr * step[name]) * gr
            if after_step is not None:
                after_step({name: p.detach() + delta[name] for name, p in named})
        if layerwise:  # in the first step's SGD units
            delta = {name: d / ratios[name] for name, d in delta.items()}
        return delta, float(first_loss)


LocalSteps = Callable[[nn.Module, Callable[[dict[str, Tensor]], None], object], ClientUpdate]
"""A client's local steps on a model, calling a hook after each step, with a method
(``client_update`` with the round's settings, ``after_step`` and that method)."""


def stateful_update(model: nn.Module, work: nn.Module, layout: Layout, method: object,
                    x1: Tensor, x2: Tensor, state: dict[str, Tensor] | None, decay: float,
                    steps: LocalSteps, round_index: int
                    ) -> tuple[ClientUpdate, dict[str, Tensor]]:
    """The round of a client that keeps state between rounds (FedU, FedEMA:
    ``dcco.methods.divergence``; MoCo's queue: ``dcco.methods.moco``).

    The client starts from ``method.client_start`` of the global model and its ``state``
    (None: never seen) in round ``round_index``, takes its local ``steps`` on ``work`` (a copy of the model that
    this function overwrites), its target network following the online network by BYOL's
    (MoCo's) average after each step, ξ ← τ ξ + (1 − τ) θ with τ = ``decay``, and keeps
    ``method.client_end`` of where it ends.

    Returns:
        The update against the global model, W_k − W_g = (start − W_g) + Δ_local (exactly
        the local Δ for a client that starts from the global model), and the client's new
        state.
    """
    with torch.no_grad():
        for (_, w), (_, v) in zip(work.state_dict(keep_vars=True).items(),
                                  model.state_dict(keep_vars=True).items(), strict=True):
            w.copy_(v)  # every buffer as the global model's: a client's forward may move them
        global_weights = {n: p.detach() for n, p in model.named_parameters()}
        start = method.client_start(global_weights, state, layout, round_index)
        own = dict(work.named_parameters())
        for name, value in start.weights.items():
            own[name].copy_(value)

    @torch.no_grad()
    def follow(current: dict[str, Tensor]) -> None:
        for target, online in layout.target:
            own[target].lerp_(current[online], 1.0 - decay)

    update = steps(work, follow, start.method or method)
    with torch.no_grad():  # running statistics as a client's forwards of the global model
        for (_, v), (_, w) in zip(model.named_buffers(), work.named_buffers(), strict=True):
            v.copy_(w)  # leave them on the reference backend (batch norm)
    named = trainable_parameters(model)
    delta = {n: (start.weights[n] - p.detach()) + update.delta[n] for n, p in named}
    end = {n: start.weights[n] + update.delta[n] for n, _ in named}
    end |= {t: own[t].detach().clone() for t, _ in layout.target}
    kept = method.client_end(end, start, work, x1, x2)
    return ClientUpdate(delta, update.num_samples, update.loss), kept
