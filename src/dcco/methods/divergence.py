"""FedU (Zhuang et al., ICCV 2021) and FedEMA (Zhuang, Wen & Zhang, ICLR 2022): federated BYOL
whose clients keep their own model between the rounds they take part in, and mix it with the
global one by how far the two have drifted apart.

Both are BYOL with FedAvg underneath: a client regresses its predictor's output of one view
onto its target network's projection of the other (``predictive.BYOLBase``'s loss), takes its
local SGD steps, moves its target network toward its online network after each step by
BYOL's moving average, and sends the server its online network and predictor; the server
averages them (``optim.optimizer = "sgd"``, ``optim.lr = 1`` for the papers' plain average). The
target network never leaves the client. What differs is where a client starts its round
(``client_start``), from the global model W_g and what it kept from its last round, W_k:

- **FedU** (its "divergence-aware predictor update"): the online network is replaced by the
  global one; the predictor is replaced by the global one only when the divergence
  ‖W_g − W_k‖ of the online networks is below a threshold (``loss.fedu_threshold``), else the
  client keeps its own.
- **FedEMA**: online network and predictor both move toward the global model by a moving
  average, W_k ← μ W_k + (1 − μ) W_g, with μ = min(λ ‖W_g − W_k‖, 1): the further the client
  has drifted, the more of its own model it keeps. λ is set once per client, the first time
  it comes back with a model to mix, so that μ starts at τ (``loss.fedema_tau``):
  λ = τ / ‖W_g − W_k‖ (the paper's autoscaler, τ = 0.7 as its authors' code runs it).

Choices the papers leave open, and the ones made here:

- ‖·‖ is the L2 norm of the difference of all the online network's parameters (backbone and
  projector) as one vector, as the papers write it, taken when the client receives W_g,
  between W_g and the model it kept (``loss.divergence = "receipt"``, the default).
- ``loss.divergence = "travelled"`` measures it as the authors' code (EasyFL's ``fedssl``,
  ``_calculate_divergence``) does: after the client's local training, the mean over the
  online network's convolution weights of each one's L2 distance from the round's start
  (``travelled``), kept in the client's state and read when it returns. A network without
  convolutions (a user's MLP) averages over its weight matrices. The two scales differ, so
  a threshold does not carry over: FedU's 0.4 is the authors' on theirs; FedEMA's λ makes
  its own μ independent of the scale.
- A client seen for the first time has nothing to mix: it starts from the global online
  network and predictor, with a target network copied from the global online network.
  Where most clients take part once (60,000 one-sample clients, K = 32), FedU and FedEMA
  then are BYOL + FedAvg with a target network that starts each client's round as a copy
  of its online network.
- ``loss.fedema_mix = "selective"`` mixes as the authors' code does with its
  ``selective_ema``: only a client that trained in the round just before mixes; any other
  returning client starts as a new one does, from the global model (its λ kept for its
  next mix). Where clients rarely return in consecutive rounds, FedEMA is then close to
  BYOL + FedAvg with a client-side target restarted each round.
- FedEMA's λ needs a nonzero divergence: while ‖W_g − W_k‖ = 0 (a client alone in its
  rounds, whose model the server's average returns unchanged), μ = 0 and λ stays unset.
- The target network's moving-average rate after each local step is BYOL's schedule at the
  round (``predictive.target_decay`` of ``loss.target_decay``), the same for every step of a
  round. The papers give a fixed rate (0.99); the schedule is the one ``byol_fedavg``'s
  server-side target follows, so that FedU and FedEMA differ from BYOL + FedAvg in where
  the target lives, not in its rate (``loss.target_decay`` is its start: 0.99 by default).
- With batch norm, a client keeps its weights, not running statistics: its round starts from
  the global model's (its forwards in training mode do not read them).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor, nn

from dcco.core.client_state import ClientStart, Layout
from dcco.methods.predictive import BYOLBase

SCALE = "fedema.lambda"
"""FedEMA's λ_k in a client's state: a float64 scalar, set at its first mix."""
LAST_ROUND = "fedema.round"
"""With ``loss.fedema_mix = "selective"``: the round (from 0) the client last trained in, in
its state: a float64 scalar."""
TRAVELLED = "divergence.travelled"
"""With ``loss.divergence = "travelled"``: the distance the client's model travelled in its
last local training (``travelled``), in its state: a float64 scalar."""


def divergence(global_weights: Mapping[str, Tensor], local: Mapping[str, Tensor],
               names: tuple[str, ...]) -> float:
    """‖W_g − W_k‖₂ over the parameters ``names``, all of them as one vector (float64)."""
    total = sum(float(torch.sum((global_weights[n].to(torch.float64)
                                 - local[n].to(torch.float64)) ** 2)) for n in names)
    return math.sqrt(total)


def travelled_weights(model: nn.Module, online: tuple[str, ...]) -> tuple[str, ...]:
    """The online parameters the authors' divergence runs over: the convolutions' weights,
    or, in a network without convolutions, every weight of two or more dimensions."""
    convs = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    chosen = tuple(n for n in online if n in convs)
    if chosen:
        return chosen
    shapes = dict(model.named_parameters())
    return tuple(n for n in online if n.endswith("weight") and shapes[n].ndim >= 2)


def travelled(start: Mapping[str, Tensor], end: Mapping[str, Tensor],
              names: tuple[str, ...]) -> float:
    """The authors' divergence: the mean over ``names`` of each tensor's L2 distance
    ‖w_end − w_start‖₂ (float64), the distance the model travelled in one local training."""
    return sum(math.sqrt(float(torch.sum((end[n].to(torch.float64)
                                          - start[n].to(torch.float64)) ** 2)))
               for n in names) / len(names)


def fedema_mu(distance: float, scale: float | None, tau: float) -> tuple[float, float | None]:
    """FedEMA's μ = min(λ ‖W_g − W_k‖, 1) and the client's λ after it: λ = τ / ‖W_g − W_k‖
    the first time the divergence is nonzero (so μ = τ then), kept after; μ = 0 and λ unset
    while the divergence is 0."""
    if scale is None:
        if distance == 0.0:
            return 0.0, None
        scale = tau / distance
    return min(scale * distance, 1.0), scale


class DivergenceAware(BYOLBase, abc.ABC):
    """Shared by FedU and FedEMA: BYOL clients that keep their model (``stateful``); a
    subclass says how a returning client mixes its model with the global one (``mixed``)."""

    federated: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    def client_start(self, global_weights: Mapping[str, Tensor],
                     state: Mapping[str, Tensor] | None, layout: Layout,
                     round_index: int) -> ClientStart:
        """The client's weights at the start of round ``round_index``: the global model's
        (and a target network copied from its online network) for a client without state,
        else the method's mix of the global model with the client's own (``mixed``)."""
        if state is None:
            weights = {n: global_weights[n] for n in (*layout.online, *layout.predictor)}
            weights |= {t: global_weights[o] for t, o in layout.target}
            return ClientStart(weights, {})
        return self.mixed(global_weights, state, layout)

    @abc.abstractmethod
    def mixed(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
              layout: Layout) -> ClientStart:
        """A returning client's start from the global model and what it kept (each method
        its own: FedU's, FedEMA's)."""

    @abc.abstractmethod
    def returned(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
                 layout: Layout, round_index: int) -> dict[str, float]:
        """What a returning client's start in round ``round_index`` makes of its divergence,
        for the round's metrics: ``divergence`` (``distance``), and FedU's choice of the
        global predictor (``fedu_global_predictor``, 1 or 0) or FedEMA's μ (``fedema_mu``:
        0 for a client that does not mix under ``loss.fedema_mix = "selective"``)."""

    def client_end(self, end: dict[str, Tensor], start: ClientStart, work: nn.Module,
                   x1: Tensor, x2: Tensor) -> dict[str, Tensor]:
        """What the client keeps: its weights at the round's end, the method's own, and
        with ``loss.divergence = "travelled"`` how far its local training moved it."""
        kept = end | start.keep
        if self.loss.divergence == "travelled":
            names = travelled_weights(work, Layout.of(work).online)
            kept[TRAVELLED] = torch.tensor(travelled(start.weights, end, names),
                                           dtype=torch.float64)
        return kept

    def distance(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
                 layout: Layout) -> float:
        """A returning client's divergence, as ``loss.divergence`` measures it."""
        if self.loss.divergence == "travelled":
            return float(state[TRAVELLED])
        return divergence(global_weights, state, layout.online)

    def state_shapes(self, model: nn.Module) -> dict[str, torch.Size]:
        """The shapes of one client's state: its trainable parameters and their target
        network's (``Layout.of``), FedEMA's λ, and the distance travelled when measured."""
        targets = {t for t, _ in Layout.of(model).target}
        extra = {TRAVELLED: torch.Size([])} if self.loss.divergence == "travelled" else {}
        return {n: p.shape for n, p in model.named_parameters()
                if p.requires_grad or n in targets} | {SCALE: torch.Size([])} | extra


class FedU(DivergenceAware):
    """FedU: Zhuang, Gan, Wen & Zhang, "Collaborative Unsupervised Visual Representation
    Learning from Decentralized Data", ICCV 2021. A returning client takes the global online
    network, and the global predictor only when ‖W_g − W_k‖ < ``loss.fedu_threshold``
    (its divergence-aware predictor update); the module's docstring gives the choices made
    where the paper leaves them open."""

    name: ClassVar[str] = "fedu"
    loss_kind: ClassVar[str] = "BYOL loss (2 − 2 cos, both directions; 0 to 8)"

    def _close(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
               layout: Layout) -> tuple[float, bool]:
        """‖W_g − W_k‖ and whether it is below the threshold."""
        distance = self.distance(global_weights, state, layout)
        return distance, distance < self.loss.fedu_threshold

    def returned(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
                 layout: Layout, round_index: int) -> dict[str, float]:
        distance, close = self._close(global_weights, state, layout)
        return {"divergence": distance, "fedu_global_predictor": float(close)}

    def mixed(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
              layout: Layout) -> ClientStart:
        """The global online network; the global predictor if ‖W_g − W_k‖ < the threshold,
        else the client's own; the client's own target network."""
        close = self._close(global_weights, state, layout)[1]
        predictor = global_weights if close else state
        weights = {n: global_weights[n] for n in layout.online}
        weights |= {n: predictor[n] for n in layout.predictor}
        weights |= {t: state[t] for t, _ in layout.target}
        return ClientStart(weights, {})


class FedEMA(DivergenceAware):
    """FedEMA: Zhuang, Wen & Zhang, "Divergence-aware Federated Self-Supervised Learning",
    ICLR 2022. A returning client's online network and predictor move to μ W_k + (1 − μ) W_g,
    μ = min(λ ‖W_g − W_k‖, 1), λ = τ / ‖W_g − W_k‖ at its first return (``fedema_mu``); the
    module's docstring gives the choices made where the paper leaves them open."""

    name: ClassVar[str] = "fedema"
    loss_kind: ClassVar[str] = "BYOL loss (2 − 2 cos, both directions; 0 to 8)"

    def client_start(self, global_weights: Mapping[str, Tensor],
                     state: Mapping[str, Tensor] | None, layout: Layout,
                     round_index: int) -> ClientStart:
        """As ``DivergenceAware.client_start``; under ``loss.fedema_mix = "selective"`` a
        client that did not train in the round before starts as a new one (its λ kept),
        and the client's state records this round."""
        if self.loss.fedema_mix == "always":
            return super().client_start(global_weights, state, layout, round_index)
        if state is not None and not self.mixes(state, round_index):
            start = super().client_start(global_weights, None, layout, round_index)
            start = ClientStart(start.weights, {SCALE: state[SCALE]} if SCALE in state else {})
        else:
            start = super().client_start(global_weights, state, layout, round_index)
        return ClientStart(start.weights, start.keep | {
            LAST_ROUND: torch.tensor(float(round_index), dtype=torch.float64)})

    def state_shapes(self, model: nn.Module) -> dict[str, torch.Size]:
        """``DivergenceAware.state_shapes``, and the round last trained in when selective."""
        extra = {LAST_ROUND: torch.Size([])} if self.loss.fedema_mix == "selective" else {}
        return super().state_shapes(model) | extra

    def mixes(self, state: Mapping[str, Tensor], round_index: int) -> bool:
        """Whether a returning client mixes its model with the global one this round: always,
        or under ``loss.fedema_mix = "selective"`` when it trained in the round before."""
        if self.loss.fedema_mix == "always":
            return True
        return LAST_ROUND in state and float(state[LAST_ROUND]) == round_index - 1

    def _mu(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
            layout: Layout) -> tuple[float, float, float | None]:
        """‖W_g − W_k‖, μ and the client's λ after it (``fedema_mu``)."""
        distance = self.distance(global_weights, state, layout)
        scale = float(state[SCALE]) if SCALE in state else None
        return (distance, *fedema_mu(distance, scale, self.loss.fedema_tau))

    def returned(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
                 layout: Layout, round_index: int) -> dict[str, float]:
        distance, mu, _ = self._mu(global_weights, state, layout)
        return {"divergence": distance,
                "fedema_mu": mu if self.mixes(state, round_index) else 0.0}

    def mixed(self, global_weights: Mapping[str, Tensor], state: Mapping[str, Tensor],
              layout: Layout) -> ClientStart:
        """Online network and predictor at μ W_k + (1 − μ) W_g, μ from the online networks'
        divergence (``fedema_mu``); the client's own target network."""
        _, mu, scale = self._mu(global_weights, state, layout)
        weights = {n: mu * state[n] + (1.0 - mu) * global_weights[n]
                   for n in (*layout.online, *layout.predictor)}
        weights |= {t: state[t] for t, _ in layout.target}
        keep = {} if scale is None else {SCALE: torch.tensor(scale, dtype=torch.float64)}
        return ClientStart(weights, keep)
