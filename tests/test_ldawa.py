"""L-DAWA (``train.aggregation = "ldawa"``, ``dcco.core.aggregation``) against its rule
recomputed by hand: each client's model from its own loss's gradient, each layer's cosine
with the global model in numpy, and the paper's average (supplement §1.9.1: (1/K) Σ_k δ_k^l
W_k^l; the code's too) or its sample-weighted form, in float64. The controls (no δ, and
FedAvg) miss by a clear margin; the other backends are tested against the simulator in
test_flower.py, test_flower_strategy.py and test_distributed.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dcco.config import ModelConfig
from dcco.core.aggregation import combine_updates, layer_divergence, ldawa_update
from dcco.core.algorithm import Algorithm
from dcco.core.client import ClientUpdate
from dcco.core.simulator import run_round
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder

SIZES = [2, 3, 5]
LOCAL_LR = 0.5


def _case(method: str):
    from helpers.dist_round import views

    model = build_dual_encoder(ModelConfig(widths=(4, 8, 8)), 1, (24, 24, 16), seed=7).double()
    return build_method(method), model, views(sum(SIZES))


def _client_models(method, model, x1, x2, shared) -> list[dict[str, np.ndarray]]:
    """Each client's model after one SGD step of ``LOCAL_LR`` on its own loss, by autograd
    on its own copy of the model (not dcco's client code)."""
    out, start = [], 0
    for n in SIZES:
        net = copy.deepcopy(model)
        f, g = net(x1[start:start + n], x2[start:start + n])
        loss = method.client_loss(f, g, shared)
        named = [(k, p) for k, p in net.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        out.append({k: (p.detach() - (0 if gr is None else LOCAL_LR * gr)).numpy()
                    for (k, p), gr in zip(named, grads, strict=True)})
        start += n
    return out


def _by_hand(global_: dict[str, np.ndarray], clients: list[dict[str, np.ndarray]],
             weights: list[float], use_delta: bool = True) -> dict[str, np.ndarray]:
    """W_g' = Σ_k w_k δ_k^l W_k^l, δ the layer's cosine with W_g (at most 1; a layer
    zero on either side, such as a zero-initialised bias, unscaled)."""
    new = {}
    for name, w_g in global_.items():
        acc = np.zeros_like(w_g)
        for w, client in zip(weights, clients, strict=True):
            w_k = client[name]
            norms = np.linalg.norm(w_k) * np.linalg.norm(w_g)
            cos = float(np.dot(w_k.ravel(), w_g.ravel()) / norms) if norms else 1.0
            acc += w * (min(cos, 1.0) if use_delta else 1.0) * w_k
        new[name] = acc
    return new


def _relative(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    fa = np.concatenate([a[k].ravel() for k in sorted(b)])
    fb = np.concatenate([b[k].ravel() for k in sorted(b)])
    return float(np.linalg.norm(fa - fb) / np.linalg.norm(fb))


@pytest.mark.parametrize("method", ["cco_fedavg", "contrastive_fedavg", "dcco"])
@pytest.mark.parametrize("weighting", ["uniform", "samples"])
@pytest.mark.parametrize("backend", ["batched", "reference"])
def test_ldawa_round__is_the_rule_recomputed_by_hand_to_float64_rounding(method, weighting,
                                                                        backend):
    """The new model W_g − pseudo-gradient (the server's SGD at rate 1, FedAvg's) is the
    hand-computed L-DAWA model to 1e-13 of its norm; the controls, FedAvg (δ = 1) by hand
    and dcco's FedAvg round, miss it by more than 1e-4 of the norm, 1e9 times further."""
    m, model, (x1, x2) = _case(method)
    segments = Segments.from_counts(SIZES)
    shared = None
    if m.needs_statistics:
        from dcco.core.stats import encoding_stats

        with torch.no_grad():
            shared = encoding_stats(*model(x1, x2), m.stats).moments()
    global_ = {k: p.detach().numpy().copy() for k, p in model.named_parameters()
               if p.requires_grad}
    clients = _client_models(m, model, x1, x2, shared)
    weights = ([1 / len(SIZES)] * len(SIZES) if weighting == "uniform"
               else [n / sum(SIZES) for n in SIZES])
    expected = _by_hand(global_, clients, weights)
    algorithm = Algorithm(m, LOCAL_LR, aggregation="ldawa", client_weighting=weighting)
    out = run_round(model, algorithm, x1, x2, segments, backend)
    got = {k: global_[k] - out.pseudo_gradient[k].numpy() for k in global_}
    assert _relative(got, expected) <= 1e-13
    no_delta = _by_hand(global_, clients, weights, use_delta=False)
    assert _relative(no_delta, expected) > 1e-4
    fedavg = run_round(model, Algorithm(m, LOCAL_LR, client_weighting=weighting), x1, x2,
                       segments, backend)
    plain = {k: global_[k] - fedavg.pseudo_gradient[k].numpy() for k in global_}
    # the control is FedAvg's round (batched, its exact form differs from the clients one by
    # one by ~1e-12 on 2-sample CCO clients, whose variances divide by 2 samples)
    assert _relative(plain, no_delta) <= 1e-11
    assert _relative(plain, expected) > 1e-4


def test_layer_divergence__the_codes_edge_cases():
    """Clipped at 1; a zero tensor on either side and a 0-dimensional one unscaled; a
    negative cosine kept (the layer's sign flips)."""
    a = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert layer_divergence(a, a * 2) == 1.0  # rounding may exceed 1: never more
    assert layer_divergence(a, torch.zeros(2, dtype=torch.float64)) == 1.0
    assert layer_divergence(torch.zeros(2, dtype=torch.float64), a) == 1.0
    assert layer_divergence(torch.tensor(2.0), torch.tensor(5.0)) == 1.0
    assert layer_divergence(-a, a) == pytest.approx(-1.0, abs=1e-15)
    assert layer_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.0
    params = {"w": a}
    flipped = ldawa_update(ClientUpdate({"w": -2 * a}, 1, 0.0), params)  # W_k = −a, δ = −1
    assert torch.allclose(flipped.delta["w"], torch.zeros(2, dtype=torch.float64))


def test_combine_updates__uniform_loss_and_count_and_unknown_rule_refused():
    w = {"w": torch.tensor([2.0], dtype=torch.float64)}
    ups = [ClientUpdate({"w": torch.tensor([1.0], dtype=torch.float64)}, 1, 1.0),
           ClientUpdate({"w": torch.tensor([4.0], dtype=torch.float64)}, 3, 3.0)]
    uniform = combine_updates(ups, w, weighting="uniform")
    assert uniform.delta["w"].item() == 2.5 and uniform.num_samples == 4
    assert uniform.loss == 2.0
    with pytest.raises(ValueError, match="aggregation must be one of fedavg, ldawa"):
        combine_updates(ups, w, "median")


def test_ldawa__refused_for_a_centralized_method_and_under_privacy_and_an_unknown_rule_named():
    with pytest.raises(ValueError, match="centralized_cco is centralized"):
        Algorithm(build_method("centralized_cco"), aggregation="ldawa")
    with pytest.raises(ValueError, match="train.aggregation must be one of"):
        Algorithm(build_method("dcco"), aggregation="krum")
    with pytest.raises(ValueError, match="void the clip's bound"):  # differential privacy
        Algorithm(build_method("dcco"), aggregation="ldawa", update_clip=1.0)


def test_ldawa_config__a_run_trains_and_its_resolved_config_says_the_rule(tiny_config,
                                                                          tmp_path):
    """``train.aggregation = "ldawa"`` from a run's config: the rounds take it (the model
    differs from the same run's under FedAvg), the run trains (finite losses) and its
    resolved config says the rule."""
    import json

    from safetensors.torch import load_file

    from dcco.config import load_config
    from dcco.run.algorithms import algorithm_of
    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

    path = tiny_config(method="cco_fedavg", rounds=3)
    cfg = load_config(path, ['train.aggregation="ldawa"'])
    assert algorithm_of(cfg).aggregation == "ldawa"
    train, _ = load_splits(cfg)
    run, plain = RunDir.create(tmp_path / "run", cfg), RunDir.create(tmp_path / "plain",
                                                                     load_config(path))
    run_pretraining(cfg, run, train)
    run_pretraining(load_config(path), plain, train)
    a, b = load_file(run.checkpoint_path), load_file(plain.checkpoint_path)
    assert max(float((a[k] - b[k]).abs().max()) for k in a if a[k].is_floating_point()) > 0
    assert 'aggregation = "ldawa"' in run.config_path.read_text()
    rounds = [json.loads(line) for line in run.metrics_path.read_text().splitlines()
              if '"round"' in line and '"loss"' in line]
    assert rounds[-1]["round"] == 3 and all(np.isfinite(r["loss"]) for r in rounds)
