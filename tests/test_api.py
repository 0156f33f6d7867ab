"""DCCO in the user's own code (``dcco.api``, docs/own_code.md): a round's public parts over a
model that is not dcco's equal dcco's reference round and the centralized step; the server's
functions keep malformed replies out; ``dcco.fit`` trains, resumes and is read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import dcco
from dcco.core.simulator import run_round
from dcco.errors import UserError
from dcco.methods import Segments, build_method

SIZES = [1, 3, 2, 5]
ROOT = Path(__file__).parents[1]


class UserCNN(nn.Module):
    """A user's encoder: its own layers and forward, no cross-sample terms, no feature_dim."""

    def __init__(self, width: int = 6, out: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.norm = nn.GroupNorm(2, width)
        self.head = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(h.mean((2, 3)))


def _views(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.rand(n, 1, 8, 8, generator=gen, dtype=torch.float64)
    return x, x + 0.1 * torch.rand(n, 1, 8, 8, generator=gen, dtype=torch.float64)


def _split(t, sizes):
    return list(t.split(sizes))


def _public_round(model, x1, x2, sizes, method):
    """The round as a user's code runs it: each client alone, then the server."""
    replies = [dcco.statistics(model, a, b, method)
               for a, b in zip(_split(x1, sizes), _split(x2, sizes), strict=True)]
    shared = dcco.merge_statistics(replies, 16, method)
    assert shared.tally.accepted == len(sizes) and not shared.tally.rejected
    updates = [dcco.local_update(model, a, b, shared.aggregate, method)
               for a, b in zip(_split(x1, sizes), _split(x2, sizes), strict=True)]
    step = dcco.aggregate_updates(updates, model)
    assert step.num_samples == sum(sizes) and step.tally.accepted == len(sizes)
    return step


def _rel(a: dict, b: dict) -> float:
    fa = torch.cat([a[k].flatten() for k in sorted(b)])
    fb = torch.cat([b[k].flatten() for k in sorted(b)])
    return float((fa - fb).norm() / fb.norm())


@pytest.mark.parametrize("method", ["dcco", "dvicreg"])
def test_public_round__equals_the_reference_round_and_the_centralized_step(method):
    torch.manual_seed(0)
    model = dcco.dual_encoder(UserCNN(), (12, 16), sample=torch.zeros(1, 8, 8)).double()
    x1, x2 = _views(SIZES)
    step = _public_round(model, x1, x2, SIZES, method)
    # a method named by its string takes the defaults for a user's model (λ = 5)
    reference = run_round(model, dcco.method(method), x1, x2, Segments.from_counts(SIZES),
                          "reference")
    central = run_round(model, dcco.method(method), x1, x2,
                        Segments.from_counts([sum(SIZES)]), "reference")
    assert set(step.pseudo_gradient) == set(reference.pseudo_gradient)
    assert _rel(step.pseudo_gradient, reference.pseudo_gradient) <= 1e-12
    assert _rel(step.pseudo_gradient, central.pseudo_gradient) <= 1e-9
    assert abs(step.loss - reference.loss) <= 1e-12 * abs(reference.loss)


def test_public_round__the_papers_lambda_and_eps_through_dcco_method():
    """dcco.method carries loss settings of your own into every part of the round: the
    paper's λ = 20 and a small ε give the reference round built with them, and another
    round than the defaults'."""
    from dcco.config import LossConfig

    torch.manual_seed(0)
    model = dcco.dual_encoder(UserCNN(), (12, 16), sample=torch.zeros(1, 8, 8)).double()
    x1, x2 = _views(SIZES)
    paper = dcco.method("dcco", lambd=20.0, eps=1e-8)
    assert (paper.loss.lambd, paper.loss.eps, dcco.method().loss.lambd) == (20.0, 1e-8, 5.0)
    step = _public_round(model, x1, x2, SIZES, paper)
    reference = run_round(model, build_method("dcco", LossConfig(lambd=20.0, eps=1e-8)), x1,
                          x2, Segments.from_counts(SIZES), "reference")
    assert _rel(step.pseudo_gradient, reference.pseudo_gradient) <= 1e-12
    default = _public_round(model, x1, x2, SIZES, "dcco")
    assert _rel(step.pseudo_gradient, default.pseudo_gradient) > 1e-3
    with pytest.raises(dcco.ConfigError, match="unknown loss setting 'lamda'"):
        dcco.method("dcco", lamda=20.0)
    with pytest.raises(dcco.ConfigError, match="method: eps must be > 0"):
        dcco.method("dcco", eps=0.0)


def test_public_round__a_plain_encoder_is_shared_and_keeps_its_own_names():
    torch.manual_seed(1)
    encoder = UserCNN(out=16).double()
    x1, x2 = _views(SIZES, seed=2)
    step = _public_round(encoder, x1, x2, SIZES, "dcco")
    assert set(step.pseudo_gradient) == {n for n, _ in encoder.named_parameters()}
    wrapped = dcco.dual_encoder(encoder, None, sample=x1[0])  # the same network, no projector
    reference = run_round(wrapped, dcco.method("dcco"), x1, x2, Segments.from_counts(SIZES),
                          "reference")
    renamed = {k.removeprefix("backbone."): v for k, v in reference.pseudo_gradient.items()}
    assert _rel(step.pseudo_gradient, renamed) <= 1e-12
    before = [p.detach().clone() for p in encoder.parameters()]
    optimizer = dcco.server_optimizer(encoder, "adam", lr=1e-3)
    dcco.apply_update(encoder, optimizer, step.pseudo_gradient)
    assert all(not torch.equal(a, p) for a, p in zip(before, encoder.parameters(),
                                                     strict=True))


def _good_reply(model, seed=0):
    x1, x2 = _views([3], seed)
    return dcco.statistics(model, x1, x2)


def test_merge_statistics__malformed_replies_are_left_out_and_counted():
    model = dcco.dual_encoder(UserCNN(), (12, 16), sample=torch.zeros(1, 8, 8)).double()
    good = [_good_reply(model, s) for s in range(3)]
    plain = dict(good[1].items())
    bad = [
        {k: v for k, v in plain.items() if k != "sum_fg"},                  # missing_key
        plain | {"sum_ff": torch.zeros(15)},                                 # shape
        plain | {"sum_f": torch.full((16,), float("nan"), dtype=torch.float64)},  # nonfinite
        plain | {"count": -2},                                               # count
        plain | {"sum_ff": -plain["sum_ff"] - 1},                            # magnitude
        plain | {"sum_g": "zeros"},                                          # dtype
    ]
    merged = dcco.merge_statistics([good[0], *bad, good[2], plain], model)
    assert merged.accepted == (0, 7, 8)
    assert merged.tally.rejected == {"count": 1, "dtype": 1, "magnitude": 1,
                                     "missing_key": 1, "nonfinite": 1, "shape": 1}
    only_good = dcco.merge_statistics([good[0], good[2], plain], 16)
    for k, v in only_good.aggregate.items():
        assert torch.equal(v, merged.aggregate[k]), k
    assert dcco.merge_statistics(bad, model).aggregate is None


def test_aggregate_updates__wrong_shapes_and_missing_parameters_are_left_out():
    torch.manual_seed(3)
    encoder = UserCNN(out=16).double()
    x1, x2 = _views([4], seed=4)
    shared = dcco.merge_statistics([dcco.statistics(encoder, x1, x2)], 16).aggregate
    good = dcco.local_update(encoder, x1, x2, shared)
    from dataclasses import replace

    wrong = replace(good, delta=good.delta | {"head.weight": torch.zeros(3, 3)})
    lacking = replace(good, delta={k: v for k, v in good.delta.items() if k != "conv.bias"})
    infinite = replace(good, delta=good.delta | {"conv.bias": torch.full((6,), float("inf"))})
    out = dcco.aggregate_updates([wrong, good, lacking, infinite, "garbage"], encoder)
    assert out.accepted == (1,)
    assert out.tally.rejected == {"dtype": 1, "missing_key": 1, "nonfinite": 1, "shape": 1}
    for k, v in good.delta.items():
        assert torch.equal(out.pseudo_gradient[k], -v)
    assert dcco.aggregate_updates([wrong], encoder).pseudo_gradient is None


def test_bad_models_and_clients_are_refused_in_one_clear_error():
    x1, x2 = _views([3])

    class Flat(nn.Module):  # an encoder whose output is not (N, d)
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)

        def forward(self, x):
            return self.conv(x)

    with pytest.raises(ValueError, match=r"must map a batch of 3 inputs to \(3, d\) encodings"):
        dcco.statistics(Flat().double(), x1, x2)
    with pytest.raises(ValueError, match="must map a batch to \\(N, d\\) encodings"):
        dcco.dual_encoder(Flat(), sample=torch.zeros(1, 8, 8))
    with pytest.raises(ValueError, match="no samples"):
        dcco.statistics(UserCNN().double(), x1[:0], x2[:0])
    with pytest.raises(ValueError, match="contrastive_fedavg shares no statistics"):
        dcco.statistics(UserCNN().double(), x1, x2, "contrastive_fedavg")
    with pytest.raises(ValueError, match="needs at least 2 samples"):
        dcco.local_update(UserCNN().double(), x1[:1], x2[:1], None, "contrastive_fedavg")
    with pytest.raises(ValueError, match="needs the round's aggregate"):
        dcco.local_update(UserCNN().double(), x1, x2, None)


# ------------------------------------------------------------------------------ dcco.fit


def _clients(n_clients=24, per=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(n_clients, 1, 8, 8, generator=gen)
    return {f"phone-{k}": (255 * (0.7 * base[k] + 0.3 * torch.rand(per, 1, 8, 8, generator=gen))
                           ).to(torch.uint8) for k in range(n_clients)}


def _augment(images):
    x = images.double() / 255
    return x + 0.05 * torch.randn(x.shape, dtype=x.dtype)


FIT = {"rounds": 6, "clients_per_round": 6, "projector": (12, 16), "augment": _augment,
       "progress": False}
SETTINGS = ["train.log_every=1", "train.checkpoint_every=2", 'train.precision="float64"']


def test_fit__batched_equals_reference_and_the_run_directory_reads_back(tmp_path):
    torch.manual_seed(5)
    first = UserCNN()
    second = UserCNN()
    second.load_state_dict(first.state_dict())
    # LARS, whose steps carry the backends' float64 rounding through unchanged (Adam's first
    # steps divide by |g|, and amplify it in near-zero gradients to about 1e-5 here)
    lars = [*SETTINGS, 'optim.optimizer="lars"', "optim.lr=1.5", "optim.weight_decay=1e-6"]
    a = dcco.fit(first, _clients(), run_dir=tmp_path / "a", settings=lars, **FIT)
    b = dcco.fit(second, _clients(), run_dir=tmp_path / "b",
                 settings=[*lars, 'train.backend="reference"'], **FIT)
    assert a.model.backbone is first
    assert a.summary["rounds"] == 6
    flat_a = torch.cat([p.detach().flatten() for p in a.model.parameters()])
    flat_b = torch.cat([p.detach().flatten() for p in b.model.parameters()])
    assert float((flat_a - flat_b).norm()) <= 1e-9 * float(flat_a.norm())
    losses = [json.loads(x)["loss"] for x in (a.run_dir / "metrics.jsonl").read_text()
              .splitlines() if "loss" in json.loads(x)]
    assert len(losses) == 6
    summary = json.loads((a.run_dir / "summary.json").read_text())
    assert summary["user_model"]["class"].endswith("UserCNN")
    encoder = dcco.load_encoder(a.run_dir, model=UserCNN())
    x = _augment(_clients()["phone-0"]).float()
    with torch.no_grad():
        assert torch.allclose(encoder(x), first.float()(x), atol=1e-5)
    with pytest.raises(UserError, match=r"pass a fresh one .*model=YourEncoder\(\)"):
        dcco.load_encoder(a.run_dir)
    with pytest.raises(UserError, match="only your code can rebuild"):
        dcco.export_encoder(a.run_dir, tmp_path / "enc")


def test_fit__interrupted_then_called_again_continues_to_the_same_weights(tmp_path):
    torch.manual_seed(6)
    start = UserCNN().state_dict()
    whole = UserCNN()
    whole.load_state_dict(start)
    reference = dcco.fit(whole, _clients(), run_dir=tmp_path / "whole", settings=SETTINGS, **FIT)

    calls = {"n": 0}

    def dies_in_round_4(images):
        calls["n"] += 1
        if calls["n"] > 1 + 2 * 3:  # the width probe, then two views a round
            raise KeyboardInterrupt
        return _augment(images)

    cut = UserCNN()
    cut.load_state_dict(start)
    with pytest.raises(KeyboardInterrupt):
        dcco.fit(cut, _clients(), run_dir=tmp_path / "cut", settings=SETTINGS,
                 **(FIT | {"augment": dies_in_round_4}))
    assert not (tmp_path / "cut" / "summary.json").read_text().count('"final_loss"')
    again = UserCNN()
    again.load_state_dict(start)
    resumed = dcco.fit(again, _clients(), run_dir=tmp_path / "cut", settings=SETTINGS, **FIT)
    for p, q in zip(reference.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(UserError, match="holds a run with other settings"):
        dcco.fit(UserCNN(), _clients(), run_dir=tmp_path / "cut",
                 settings=[*SETTINGS, "optim.lr=0.5"], **FIT)


def test_fit__more_rounds_continue_a_finished_run_to_the_weights_of_one_longer_run(tmp_path):
    """A finished run of 4 rounds, called again for 6, trains rounds 5 and 6 from its last
    checkpoint: the weights and the records of one run of 6, to the bit, when no setting
    depends on the run's length (a constant server rate after its warm-up)."""
    steady = [*SETTINGS, 'optim.schedule="constant"', "optim.warmup_rounds=2"]
    torch.manual_seed(7)
    start = UserCNN().state_dict()
    models = {}
    for name in ("whole", "grown"):
        models[name] = UserCNN()
        models[name].load_state_dict(start)
    whole = dcco.fit(models["whole"], _clients(), run_dir=tmp_path / "whole", settings=steady,
                     **FIT)
    short = dcco.fit(models["grown"], _clients(), run_dir=tmp_path / "grown", settings=steady,
                     **(FIT | {"rounds": 4}))
    assert [r["round"] for r in short.history] == [1, 2, 3, 4]
    again = UserCNN()
    again.load_state_dict(start)  # a fresh instance: its weights come from the checkpoint
    grown = dcco.fit(again, _clients(), run_dir=tmp_path / "grown", settings=steady, **FIT)
    for p, q in zip(whole.model.parameters(), grown.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert grown.summary["rounds"] == 6 and grown.summary["final_loss"] == \
        whole.summary["final_loss"]
    keys = ("round", "loss", "lr", "dead_dims", "corr_diag", "eff_rank")
    assert [{k: r[k] for k in keys} for r in grown.history] == \
        [{k: r[k] for k in keys} for r in whole.history]
    assert dcco.load_encoder(tmp_path / "grown", model=UserCNN()) is not None
    with pytest.raises(UserError, match="holds 6 of 6 rounds .* trained 6 rounds, more than "
                                        "the 5 asked"):
        dcco.fit(UserCNN(), _clients(), run_dir=tmp_path / "grown", settings=steady,
                 **(FIT | {"rounds": 5}))
    # a cosine decay after the warm-up: round 4 of a 4-round run is another rate than round
    # 4 of a 6-round run (round 3, the decay's first, is the peak in both), so the run
    # cannot become one; refused, naming the setting
    cosine = [*SETTINGS, "optim.warmup_rounds=2"]
    dcco.fit(UserCNN(), _clients(), run_dir=tmp_path / "cosine", settings=cosine,
             **(FIT | {"rounds": 4}))
    with pytest.raises(UserError, match=r"holds 4 of 4 rounds .* cannot go on to 6 .* the "
                                        r"server rate \(optim.schedule\) depends on the "
                                        r"run's length: its round 4 was trained at"):
        dcco.fit(UserCNN(), _clients(), run_dir=tmp_path / "cosine", settings=cosine, **FIT)


HEADS = {"byol_fedavg": ((12, 16), True), "simsiam_fedavg": ((4, 16), False),
         "moco_fedavg": (None, True), "fedu": ((12, 16), True), "fedema": ((12, 16), True)}
"""Each method's predictor widths after FIT's projector (12, 16) and whether it has a target
network: BYOL's (the projector's first width, then d), SimSiam's (d/4, then d), MoCo's key
encoder (a target without a predictor)."""


@pytest.mark.parametrize("method", list(HEADS))
def test_fit__predictive_methods_train_your_encoder_with_their_head_as_the_reference_does(
        tmp_path, method):
    torch.manual_seed(8)
    first, second = UserCNN(), UserCNN()
    second.load_state_dict(first.state_dict())
    start = {k: v.clone() for k, v in first.state_dict().items()}
    lars = [*SETTINGS, 'optim.optimizer="lars"', "optim.lr=1.5", "optim.weight_decay=1e-6"]
    fit = FIT | {"rounds": 4, "method": method}
    a = dcco.fit(first, _clients(), run_dir=tmp_path / "a", settings=lars, **fit)
    b = dcco.fit(second, _clients(), run_dir=tmp_path / "b",
                 settings=[*lars, 'train.backend="reference"'], **fit)
    net, (widths, has_target) = a.model, HEADS[method]
    assert net.backbone is first and a.summary["rounds"] == 4
    assert (None if net.predictor is None else tuple(
        m.out_features for m in net.predictor.modules() if isinstance(m, nn.Linear))) == widths
    assert (net.target is not None) == has_target
    sa, sb = net.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    assert _rel(sa, sb) <= 1e-9  # the batched simulator's rounds are the reference loop's
    assert any(not torch.equal(start[k], first.state_dict()[k]) for k in start)
    if has_target:  # a copy of your encoder: BYOL's server moves it by EMA toward the online
        # network; MoCo's and FedEMA's clients each keep their own, from the global model
        moved = [not torch.equal(sa[f"target.0.{k}"], start[k]) for k in start]
        assert any(moved) if method == "byol_fedavg" else not any(moved)
        assert all(not torch.equal(sa[f"target.0.{k}"], v) for k, v in first.state_dict().items()
                   if not torch.equal(v, start[k]))
    encoder = dcco.load_encoder(a.run_dir, model=UserCNN())  # beside the head's weights
    x = _augment(_clients()["phone-0"]).float()
    with torch.no_grad():
        assert torch.allclose(encoder(x), first.float()(x), atol=1e-5)


def test_fit__a_predictor_that_does_not_fit_is_refused_before_a_folder_is_written(tmp_path):
    for method, predictor in (("byol_fedavg", "[12, 8]"), ("moco_fedavg", "[12, 16]")):
        with pytest.raises(UserError, match="model.predictor"):
            dcco.fit(UserCNN(), _clients(), run_dir=tmp_path / method, **FIT,
                     method=method, settings=[f"model.predictor={predictor}"])
        assert not (tmp_path / method).exists()
    with pytest.raises(ValueError, match="one encoder shared by both views"):
        dcco.dual_encoder(UserCNN(), (12, 16), second=UserCNN(), method="fedu",
                          sample=torch.zeros(1, 8, 8), sample_y=torch.zeros(1, 8, 8))
    with pytest.raises(ValueError, match="give method= too"):
        dcco.dual_encoder(UserCNN(), (12, 16), sample=torch.zeros(1, 8, 8), predictor=(4, 16))
    for widths in ((), (16,)):  # BYOL without its predictor is not BYOL
        with pytest.raises(ValueError, match="two or more positive widths"):
            dcco.dual_encoder(UserCNN(), (12, 16), sample=torch.zeros(1, 8, 8),
                              method="byol_fedavg", predictor=widths)


def test_fit__fedu_fedema_and_moco_train_an_encoder_with_a_frozen_layer(tmp_path):
    """A frozen layer's target never moves from it: the clients keep and follow only the
    trained parameters' targets, and the frozen layer stays as it was."""
    for method in ("fedu", "fedema", "moco_fedavg"):
        torch.manual_seed(9)
        encoder = UserCNN()
        encoder.conv.requires_grad_(False)
        frozen = encoder.conv.weight.detach().double()
        trained = encoder.head.weight.detach().double()
        result = dcco.fit(encoder, _clients(), run_dir=tmp_path / method, settings=SETTINGS,
                          **(FIT | {"rounds": 3, "method": method}))
        assert result.summary["rounds"] == 3
        assert torch.equal(encoder.conv.weight.double(), frozen)
        assert not torch.equal(encoder.head.weight.double(), trained)


def test_fit__clips_your_encoders_encodings_as_configured(tmp_path):
    torch.manual_seed(7)
    start = UserCNN().state_dict()
    runs = {}
    for bound in (None, 0.05):
        encoder = UserCNN()
        encoder.load_state_dict(start)
        extra = [] if bound is None else [f"model.clip_encodings={bound}"]
        runs[bound] = dcco.fit(encoder, _clients(), run_dir=tmp_path / str(bound),
                               settings=[*SETTINGS, *extra], **(FIT | {"rounds": 2}))
    clipped = runs[0.05].model
    assert clipped.encoding_bound == 0.05 and runs[None].model.encoding_bound is None
    x = _augment(_clients()["phone-0"])
    with torch.no_grad():
        f, g = clipped(x, x)
    assert float(torch.linalg.vector_norm(torch.cat([f, g]), dim=1).max()) <= 0.05 * (1 + 1e-12)
    moved = [not torch.equal(p, q) for p, q in zip(runs[None].model.parameters(),
                                                   clipped.parameters(), strict=True)]
    assert any(moved)  # the clipping was in the rounds, not only set afterwards


def test_fit__bad_data_is_named_before_a_run_directory_exists(tmp_path):
    with pytest.raises(UserError, match="client 'b' has no samples"):
        dcco.fit(UserCNN(), {"a": torch.zeros(2, 1, 8, 8), "b": torch.zeros(0, 1, 8, 8)},
                 rounds=1, run_dir=tmp_path / "r", augment=_augment)
    with pytest.raises(UserError, match="pass augment=your_function"):
        dcco.fit(UserCNN(), {"a": torch.zeros(2, 1, 8, 8)}, rounds=1, run_dir=tmp_path / "r")
    with pytest.raises(UserError, match="clients_per_round = 32 but the partition has only 2"):
        dcco.fit(UserCNN(), {"a": torch.zeros(2, 1, 8, 8, dtype=torch.uint8),
                             "b": torch.zeros(3, 1, 8, 8, dtype=torch.uint8)},
                 rounds=1, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_example__own_model_beats_the_same_encoder_untrained(tmp_path):
    """examples/own_model.py at 150 rounds (its default is 1,400), seed 0, on the real
    Fashion-MNIST: it prints the three probes and the gains, no collapse warning comes, and
    the trained encoder beats the same encoder untrained by at least the smallest gain that
    the example's record at 150 rounds shows over seeds 0 to 2 and one or two threads, less
    1.5 points for another CPU (experiments/results/learning_value/example-150rounds-*.json,
    `experiments/learning_value.py run --model deep_cnn --width 24 --rounds 150 ...`, whose
    model and seeding are the example's)."""
    import re

    records = sorted((ROOT / "experiments" / "results" / "learning_value").glob(
        "example-150rounds-*.json"))
    gains = [100 * (s["trained"] - s["untrained"]) for r in records
             for s in json.loads(r.read_text())["seeds"]]
    assert len(records) == 2 and len(gains) == 6 and min(gains) > 1.5
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "own_model.py"),
                           "--seed", "0", "--rounds", "150", "--run-dir", str(tmp_path / "run")],
                          check=False, capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=1800)
    assert done.returncode == 0, done.stderr
    assert "CollapseWarning" not in done.stderr, done.stderr
    probes = dict(re.findall(r"^(trained|untrained|raw pixels): linear probe ([\d.]+) %$",
                             done.stdout, re.MULTILINE))
    assert set(probes) == {"trained", "untrained", "raw pixels"}, done.stdout
    gain = float(probes["trained"]) - float(probes["untrained"])
    assert gain >= min(gains) - 1.5, (gain, gains, done.stdout)
    assert re.search(r"^gain over untrained: [+-][\d.]+ points; over the raw pixels: [+-][\d.]+ "
                     r"points$", done.stdout, re.MULTILINE), done.stdout


def test_docs__the_round_in_your_own_loop_runs_as_written(tmp_path):
    guide = (ROOT / "docs" / "own_code.md").read_text()
    code = guide.split("## A round in your own loop")[1].split("```python\n")[1].split("```")[0]
    script = tmp_path / "my_loop.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [x.split(":")[0] for x in lines] == [f"round {r}" for r in range(1, 6)]
    assert all(x.endswith(", 11 samples") for x in lines)


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 8)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_client_functions__leave_the_global_models_buffers_and_weights_as_they_were():
    model = BNNet().double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x1, x2 = _views([4], seed=7)
    x1, x2 = x1 + 3, x2 + 3  # far from the running statistics' start
    shared = dcco.merge_statistics([dcco.statistics(model, x1, x2)], 8).aggregate
    dcco.local_update(model, x1, x2, shared, steps=2, lr=0.1)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="steps and batch must be >= 1"):
        dcco.local_update(model, x1, x2, shared, steps=0)


@pytest.mark.parametrize("make", [lambda: UserCNN(out=16).double(), lambda: BNNet().double()])
def test_kept_forward__gives_the_statistics_and_the_update_of_two_forwards_to_the_bit(make):
    """Phase 1's forward kept with its graph (``answer(reuse_forward=True)``): the same
    statistics and the same delta as ``statistics`` then ``local_update``, bit for bit, the
    model's buffers untouched, and the kept activations counted."""
    from dcco.api import statistics_kept, update_from_kept

    torch.manual_seed(3)
    model = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x1, x2 = _views([5], seed=4)
    want_stats = dcco.statistics(model, x1, x2)
    stats, kept = statistics_kept(model, x1, x2)
    got_stats, want_items = dict(stats.items()), dict(want_stats.items())
    assert got_stats.keys() == want_items.keys()
    assert all(torch.equal(torch.as_tensor(got_stats[k]), torch.as_tensor(want_items[k]))
               for k in want_items)
    assert kept.saved_bytes >= x1.numel() * x1.element_size()  # at least the views themselves
    other = dcco.statistics(model, *_views([3], seed=5))
    width = int(dict(other.items())["sum_f"].shape[0])
    shared = dcco.merge_statistics([want_stats, other], width).aggregate
    want = dcco.local_update(model, x1, x2, shared, lr=0.7)
    got = update_from_kept(kept, shared, lr=0.7)
    assert got.delta.keys() == want.delta.keys() and got.loss == want.loss
    assert all(torch.equal(got.delta[k], want.delta[k]) for k in want.delta)
    assert got.num_samples == 5
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="needs the round's aggregate"):
        update_from_kept(statistics_kept(model, x1, x2)[1], None)


@pytest.mark.parametrize("method", ["dcco", "clip_fedavg"])
def test_a_forward_in_chunks__gives_one_batchs_statistics_and_update(method):
    """``chunk``: the samples forwarded in chunks (``answer``'s default): the statistics and
    the delta of one batch to float64 rounding, kept or encoded again alike to the bit; a
    model holding batch norm goes in one batch whatever ``chunk`` says; a chunk below 1 is
    refused."""
    from dcco.api import statistics_kept, update_from_kept

    torch.manual_seed(3)
    model = UserCNN(out=16).double()
    x1, x2 = _views([11], seed=4)
    whole = dcco.statistics(model, x1, x2)
    stats, kept = statistics_kept(model, x1, x2, chunk=3)  # chunks of 3, 3, 3 and 2
    assert all(torch.allclose(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-12, atol=1e-12)
               for (_, a), (_, b) in zip(stats.items(), whole.items(), strict=True))
    seen = []
    hook = model.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    dcco.statistics(model, x1, x2, chunk=3)
    hook.remove()
    assert seen == [3, 3, 3, 3, 3, 3, 2, 2]  # each chunk's two views, in the samples' order
    shared = dcco.merge_statistics([whole, dcco.statistics(model, *_views([3], seed=5))],
                                   16).aggregate
    m = dcco.method(method)
    want = dcco.local_update(model, x1, x2, shared, m, lr=0.7)
    again = dcco.local_update(model, x1, x2, shared, m, lr=0.7, chunk=3)
    got = update_from_kept(kept, shared, m, lr=0.7)
    assert got.delta.keys() == want.delta.keys() == again.delta.keys()
    assert all(torch.equal(got.delta[k], again.delta[k]) for k in want.delta)
    for k in want.delta:
        assert torch.allclose(got.delta[k], want.delta[k], rtol=1e-10, atol=1e-13), k
    assert abs(got.loss - want.loss) < 1e-10 * abs(want.loss)
    bn = BNNet().double()
    one, chunked = dcco.statistics(bn, x1, x2), dcco.statistics(bn, x1, x2, chunk=3)
    assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
               for (_, a), (_, b) in zip(one.items(), chunked.items(), strict=True))
    with pytest.raises(ValueError, match="chunk must be a positive number"):
        dcco.statistics(model, x1, x2, chunk=0)


def test_merge_statistics__replies_that_are_not_mappings_and_plain_lists():
    model = UserCNN(out=16).double()
    x1, x2 = _views([3])
    stats = dcco.statistics(model, x1, x2)
    as_lists = {k: v.tolist() for k, v in stats.items()}  # what JSON brings
    merged = dcco.merge_statistics([stats, None, [1, 2], "sums", 7, as_lists], 16)
    assert merged.accepted == (0, 5) and merged.tally.rejected == {"dtype": 4}
    alone = dcco.merge_statistics([stats], 16).aggregate
    for k, v in merged.aggregate.items():
        assert torch.equal(v, alone[k]), k  # float64 lists: the same numbers


def test_fit__a_float64_encoder_other_data_and_conflicting_settings(tmp_path):
    torch.manual_seed(8)
    fit = FIT | {"rounds": 2}
    done = dcco.fit(UserCNN().double(), _clients(), run_dir=tmp_path / "r", settings=SETTINGS,
                    **fit)
    assert done.summary["rounds"] == 2
    with pytest.raises(UserError, match="another clients' samples"):
        dcco.fit(UserCNN().double(), _clients(seed=1), run_dir=tmp_path / "r",
                 settings=SETTINGS, **fit)
    with pytest.raises(UserError, match="model.projector is fit's argument projector="):
        dcco.fit(UserCNN(), _clients(), run_dir=tmp_path / "s",
                 settings=[*SETTINGS, "model.projector=[8]"], **fit)
    with pytest.raises(UserError, match="trained on your own augmentation"):
        dcco.load_encoder(done.run_dir, model=UserCNN()).preprocess(
            _clients()["phone-0"])


def test_samples_of_clients__bad_samples_are_named_by_client():
    from dcco.data.datasets import DataError
    from dcco.data.samples import samples_of_clients

    good = torch.zeros(2, 3)
    for bad, needle in ((torch.zeros(2, 3, dtype=torch.bool), "holds torch.bool samples"),
                        ([[1, 2], [3]], "not a numeric array"),
                        (["a", "b"], "not a numeric array")):
        with pytest.raises(DataError, match=f"client 'b'.*{needle}|client 'b' holds"):
            samples_of_clients({"a": good, "b": bad})
    with pytest.raises(DataError, match="client 'a' has labels outside"):
        samples_of_clients({"a": good}, labels={"a": [0, 5]}, num_classes=3)


class VectorMLP(nn.Module):
    """A user's encoder of float vectors (not images)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _vectors(sizes=(3, 3, 2, 4, 3, 3, 2, 4)) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return {f"sensor-{k}": torch.randn(n, 32, generator=gen) for k, n in enumerate(sizes)}


def _jitter(x: torch.Tensor) -> torch.Tensor:
    return x + 0.1 * torch.randn_like(x)


def test_fit__float_vectors_through_an_mlp_with_your_augment(tmp_path):
    """Any samples your augment takes: dcco's image augmentation stays out of the way."""
    torch.manual_seed(3)
    done = dcco.fit(VectorMLP(), _vectors(), rounds=3, augment=_jitter, clients_per_round=4,
                    projector=(16, 16), run_dir=tmp_path / "fresh", progress=False,
                    settings={"train.log_every": 1})
    assert done.summary["rounds"] == 3 and done.summary["input_kind"] == "features"
    from dcco.run.rundir import RunDir

    assert RunDir.open(tmp_path / "fresh").config().augment.enabled is False
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "fresh" / "metrics.jsonl")
                                     .read_text().splitlines()) if "loss" in r]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert done.collapse is not None and set(done.collapse) == {"round", "dead_dims",
                                                                "corr_diag", "eff_rank",
                                                                "max_var", "median_var"}


def test_fit__a_refused_fit_leaves_no_trace_and_the_corrected_call_then_runs(tmp_path):
    run = tmp_path / "run"
    kw = {"rounds": 2, "augment": _jitter, "projector": (16, 16), "run_dir": run,
          "progress": False}
    with pytest.raises(UserError, match="clients_per_round = 100 but the partition has only 8"):
        dcco.fit(VectorMLP(), _vectors(), clients_per_round=100, **kw)
    assert not run.exists()
    with pytest.raises(UserError, match="privacy needs clients of one size"):
        dcco.fit(VectorMLP(), _vectors(), clients_per_round=4,
                 settings={"privacy.noise_multiplier": 1.0}, **kw)
    assert not run.exists()
    with pytest.raises(TypeError, match="not one string"):
        dcco.fit(VectorMLP(), _vectors(), clients_per_round=4, settings="optim.lr=1", **kw)
    assert not run.exists()
    done = dcco.fit(VectorMLP(), _vectors(), clients_per_round=4, **kw)
    assert done.summary["rounds"] == 2 and done.run_dir == run


@pytest.mark.parametrize("value, said", [(float("nan"), "NaN"), (float("-inf"), "-inf")])
def test_fit__samples_holding_nan_or_inf_are_refused_by_name_before_anything_is_written(
        tmp_path, value, said):
    """The client and which of its samples, before the run directory exists; the corrected
    call into the same run_dir then runs from round 0."""
    run = tmp_path / "run"
    kw = {"rounds": 2, "augment": _jitter, "projector": (16, 16), "run_dir": run,
          "progress": False, "clients_per_round": 4}
    samples = _vectors()
    names = list(samples)
    samples[names[3]][1, 5] = value
    samples[names[6]][0, 0] = value
    with pytest.raises(UserError, match=f"holds {said} in client '{names[3]}', its sample 1 "
                                        f"\\(sample 9 of all\\), and 1 more samples"):
        dcco.fit(VectorMLP(), samples, **kw)
    assert not run.exists()
    samples[names[3]][1, 5] = samples[names[6]][0, 0] = 0.0
    done = dcco.fit(VectorMLP(), samples, **kw)
    assert done.summary["rounds"] == 2


def test_fit__a_divergence_names_the_likely_cause(tmp_path):
    """Finite samples whose views overflow: the augmentation is named, not the rate; an
    encoder that overflows before any step: the inputs, not the rate."""
    from dcco.run.pretraining import Diverged

    def overflowing(x: torch.Tensor) -> torch.Tensor:
        return x / (x - x)  # 0/0 and x/0: NaN and inf

    with pytest.raises(Diverged, match="the augmentation makes them"):
        dcco.fit(VectorMLP(), _vectors(), rounds=2, augment=overflowing, projector=(16, 16),
                 clients_per_round=4, run_dir=tmp_path / "a", progress=False)

    class Overflow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(1e30))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.scale) ** 2

    with pytest.raises(Diverged, match="round 1: .*before any server step, so no rate"):
        dcco.fit(Overflow(), _vectors(), rounds=2, augment=_jitter, projector=None,
                 clients_per_round=4, run_dir=tmp_path / "b", progress=False)


def test_package__the_errors_are_importable_from_dcco_and_dir_shows_public_names_only():
    import inspect

    assert issubclass(dcco.ConfigError, dcco.UserError)
    assert issubclass(dcco.DataError, dcco.UserError) and issubclass(dcco.UserError, ValueError)
    assert issubclass(dcco.Diverged, FloatingPointError)
    names = dir(dcco)
    assert {"UserError", "ConfigError", "DataError", "Diverged", "fit"} <= set(names)
    assert [n for n in names if n.startswith("_") and n != "__version__"] == []
    assert "Any" not in names and "annotations" not in names
    assert all(hasattr(dcco, n) for n in names)
    raises = inspect.getdoc(dcco.fit).split("Raises\n------")[1]
    for error in ("dcco.ConfigError", "dcco.DataError", "dcco.UserError", "dcco.Diverged",
                  "TypeError"):
        assert error in raises, error
    with pytest.raises(TypeError, match="encoder must be a torch.nn.Module"):
        dcco.fit("a model", {"a": torch.zeros(2, 3)}, rounds=1, augment=_jitter)


def test_fit_refusals__are_user_errors_naming_the_argument(tmp_path):
    """An encoder of the wrong input width, one whose output is (N, d, 1), and a model that
    is not a module: each refusal of ``dcco.fit`` is a ``dcco.UserError`` (an
    ``ArgumentError``, a ``TypeError`` too) whose message names the argument."""
    import dcco

    class Narrow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(10, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

    class Column(Narrow):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, 0))[:, :8, None]

    clients = {i: torch.randn(4, 12) for i in range(8)}
    for encoder, says in ((Narrow(), r"encoder: Narrow failed on one sample of shape \(12,\)"),
                          (Column(), r"encoder: Column must map a batch to \(N, d\) encodings"),
                          ("not a module", "encoder must be a torch.nn.Module")):
        with pytest.raises(dcco.UserError, match=says) as caught:
            dcco.fit(encoder, clients, rounds=2, clients_per_round=4, progress=False,
                     augment=lambda x: x + 0.1 * torch.randn_like(x), run_dir=tmp_path / "r")
        assert isinstance(caught.value, (dcco.ArgumentError, TypeError))
        assert not (tmp_path / "r").exists()  # refused before anything is written
