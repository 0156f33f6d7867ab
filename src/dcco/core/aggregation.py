"""How the server combines a round's client updates: FedAvg's weighted average, or L-DAWA's
layer-wise divergence-aware weights (Rehman et al., ICCV 2023, arXiv 2307.07393).

FedAvg (``"fedavg"``): the new model is W_g + Σ_k w_k Δ_k, with w_k = N_k/N (the exact
round) or 1/K (``client_weighting = "uniform"``).

L-DAWA (``"ldawa"``): before the average, every layer l of client k's model W_k = W_g + Δ_k
is scaled by its angular divergence from the global model the client started from,

    δ_k^l = ⟨W_k^l, W_g^l⟩ / (‖W_k^l‖ ‖W_g^l‖),     W_g' = Σ_k w_k δ_k^l W_k^l,

so a client whose layer has turned away from the global one counts for less, and the
weights δ_k^l w_k are not renormalised (they sum to at most 1: the rule also shrinks the
layer towards 0 by Σ_k w_k (1 − δ_k^l), a divergence-driven weight decay). As an update,
client k's Δ_k becomes δ_k^l (W_g^l + Δ_k^l) − W_g^l, and the server's step is the usual
weighted average of those (``ldawa_update``); with the server's SGD at rate 1 the new model
is L-DAWA's W_g' exactly, and with Adam or LARS the average is their pseudo-gradient, as it
is for FedAvg's.

Sources. The paper's main text could not be read on this machine; its rule is taken from
the authors' supplementary material (yasar-rehman.github.io, ``files/ICCV2023_image_SSL_FL_
_supplementary_.pdf``: δ is "the cosine of the angle between the global model and client's
models", per layer, against the previous round's global model; §1.9.1: "without δ, L-DAWA
reduces to FairAvg, w_g^{r+1} = (1/K) Σ_k w_k^r", so the paper's weights are δ_k^l / K) and
from the authors' code (yasar-rehman/L-DAWA, ``L-DAWA-Agg.py`` and ``FL_Pretraining/
main_CIFAR10_LDAWA.py``, read here), which agrees and adds what the supplement does not say:

- a "layer" is one tensor of the model's state dict (a weight, a bias, a norm's scale);
- a cosine above 1 (rounding) is taken as 1;
- a tensor whose norm is 0 (client's or global) is left unscaled (the code leaves a zero
  client tensor as it is, and would divide by zero for a zero global one);
- a 0-dimensional tensor is left unscaled (the code skips them);
- a negative cosine is kept: the layer enters the average with its sign flipped;
- the code runs plain FedAvg for its first 3 rounds, then L-DAWA; dcco applies L-DAWA from
  the first round (neither the supplement nor the README names a warm-up).

dcco weighs the scaled models as the run's ``train.client_weighting`` says: "uniform" is
the paper's and the code's 1/K; "samples", the default, N_k/N, is the supplement's
"L-DAWA_FedAvg" variant (its weights "Layer-Wise Div. + Sample Prob."). The two agree when a
round's clients hold as many samples (the fight's settings). FedU²'s harness
(XeniaLLL/FedU2, ``src/my/algo/LDAWA``) computes one cosine per sub-network (encoder,
projector, predictor) over its flattened state dict instead: a model-level rule, not this
one.

Batch norm's running statistics, which the code's state dict also scales, are not part of a
dcco update (only trained parameters are).

Where the scaling runs: δ_k depends only on client k's own model and the global model it was
sent, so dcco scales each client's update where the update is made (the simulator's client,
a Flower node's hosted client, a user's ``ClientApp``), and every server then sums the
scaled updates as it sums FedAvg's. The numbers are the server's rule exactly; the gain is
that the server never needs a client's own update, so L-DAWA runs where the server sees only
sums: a node pooling its hosted clients, torch.distributed's all-reduce and SecAgg+. Not
with differential privacy: the rule would rescale an update after its clip and void the
clip's bound, so ``Algorithm`` refuses the two together. In the simulator its clients run
one by one (``Algorithm.batched_exact`` is False): each client's own update is needed.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from dcco.core.client import ClientUpdate
from dcco.core.server import pooled_update

AGGREGATIONS: tuple[str, ...] = ("fedavg", "ldawa")


def layer_divergence(client: Tensor, global_: Tensor) -> float:
    """L-DAWA's δ for one layer: cos∠(W_k^l, W_g^l) in float64, at most 1; 1 (no scaling)
    for a 0-dimensional tensor or a zero norm on either side.

    >>> layer_divergence(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))  # cos 45°
    0.7071067811865476
    """
    w_g = global_.to(torch.float64)
    return 1.0 - float(_one_minus_cosine(w_g, client.to(torch.float64) - w_g))


def _one_minus_cosine(w_g: Tensor, delta: Tensor) -> Tensor:
    """1 − cos∠(W_g + Δ, W_g), from Δ without the cancellation of 1 − ⟨a, b⟩/(‖a‖‖b‖):
    ½‖a/‖a‖ − b/‖b‖‖², with a/‖a‖ − b/‖b‖ = Δ/‖a‖ + b (‖b‖ − ‖a‖)/(‖a‖‖b‖) and ‖b‖ − ‖a‖ =
    −(2⟨b, Δ⟩ + ‖Δ‖²)/(‖a‖ + ‖b‖) (a = W_g + Δ, b = W_g). A client's step is small beside
    its weights, so δ is near 1 and 1 − δ, which the update holds, is what must be exact;
    0 for a 0-dimensional tensor or a zero norm. A 0-dimensional tensor on the device (no
    host synchronisation per layer)."""
    if w_g.dim() == 0:
        return w_g.new_zeros(())
    b, d = w_g.flatten(), delta.flatten()
    a_norm, b_norm = torch.linalg.vector_norm(b + d), torch.linalg.vector_norm(b)
    shrink = -(2 * (b @ d) + d @ d) / (a_norm + b_norm)  # ‖b‖ − ‖a‖
    diff = d / a_norm + b * (shrink / (a_norm * b_norm))
    return torch.where((a_norm > 0) & (b_norm > 0), 0.5 * (diff @ diff), 0.0)


def ldawa_update(update: ClientUpdate, params: dict[str, Tensor]) -> ClientUpdate:
    """Client k's update under L-DAWA: each layer's Δ_k^l becomes δ_k^l (W_g^l + Δ_k^l) −
    W_g^l = Δ_k^l − (1 − δ_k^l)(W_g^l + Δ_k^l), with δ_k^l = ``layer_divergence(W_g^l +
    Δ_k^l, W_g^l)``, computed in float64 (1 − δ without cancellation) and returned in the
    delta's dtype.

    Args:
        update: the client's update (its Δ_k by parameter name, count and loss).
        params: W_g, the global model's trained parameters by name (the model the client
            was sent).

    >>> w = {"w": torch.tensor([1.0, 1.0])}
    >>> u = ldawa_update(ClientUpdate({"w": torch.tensor([0.0, -1.0])}, 4, 0.0), w)
    >>> [round(v, 4) for v in u.delta["w"].tolist()]  # W_k = (1, 0), δ = cos 45°
    [-0.2929, -1.0]
    """
    delta = {}
    for name, d in update.delta.items():
        w_g = params[name].detach().to(d.device, torch.float64)
        step = d.to(torch.float64)
        gamma = _one_minus_cosine(w_g, step)
        delta[name] = (step - gamma * (w_g + step)).to(d.dtype)
    return replace(update, delta=delta)


def combine_updates(updates: list[ClientUpdate], params: dict[str, Tensor],
                    aggregation: str = "fedavg", weighting: str = "samples") -> ClientUpdate:
    """A round's (or a node's) client updates as one: each scaled by the ``aggregation``
    rule (``ldawa_update`` for "ldawa"), then averaged with weights N_k/N ("samples") or
    1/K ("uniform"); the count is their N and the loss their losses' average of the same
    weights.

    >>> w = {"w": torch.tensor([2.0])}
    >>> ups = [ClientUpdate({"w": torch.tensor([1.0])}, 1, 0.0),
    ...        ClientUpdate({"w": torch.tensor([4.0])}, 3, 0.0)]
    >>> combine_updates(ups, w).delta["w"].item()  # (1·1 + 3·4) / 4
    3.25
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got "
                         f"{aggregation!r}")
    if aggregation == "ldawa":
        updates = [ldawa_update(u, params) for u in updates]
    if weighting == "uniform":  # 1/K each, the loss too
        pooled = pooled_update([replace(u, num_samples=1) for u in updates], params)
        return replace(pooled, num_samples=sum(u.num_samples for u in updates))
    return pooled_update(updates, params)


__all__ = ["AGGREGATIONS", "combine_updates", "layer_divergence",
           "ldawa_update"]
