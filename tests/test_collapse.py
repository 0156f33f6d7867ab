"""The collapse figures and their watch (``dcco.core.collapse``): the figures equal a direct
float64 computation from the encodings, merging clients changes nothing, and the watch warns
for collapsed encoders and not for healthy ones."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from dcco.config import load_config
from dcco.core.collapse import (
    DEAD_FLOOR,
    CollapseWarning,
    CollapseWatch,
    collapse_figures,
    effective_rank,
    encoding_figures,
    watch_start,
)
from dcco.core.stats import VICREG_STATS, encoding_stats, merge

ROOT = Path(__file__).resolve().parents[1]


def _direct(f: np.ndarray, g: np.ndarray, floor: float = DEAD_FLOOR) -> dict[str, float]:
    """The figures written out from the encodings in numpy float64: biased variances, dead
    dimensions by the relative floor, the correlation of the live ones (0 for the dead),
    Roy and Vetterli's effective rank from an SVD."""
    var_f, var_g = f.var(0), g.var(0)
    top = max(var_f.max(), var_g.max())
    live_f, live_g = var_f > floor * top, var_g > floor * top
    zf = np.where(live_f, (f - f.mean(0)) / np.sqrt(np.where(live_f, var_f, 1)), 0)
    zg = np.where(live_g, (g - g.mean(0)) / np.sqrt(np.where(live_g, var_g, 1)), 0)
    c = zf.T @ zg / f.shape[0]
    s = np.linalg.svd(c, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return {"dead_dims": 1 - np.concatenate([live_f, live_g]).mean(),
            "corr_diag": float(np.diag(c).mean()),
            "eff_rank": float(np.exp(-(p * np.log(p)).sum()))}


def _encodings(n: int = 64, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views that share part of a signal, with dimensions of very different scales, one
    constant and one far under the others' spread (dead), and a non-zero mean."""
    gen = torch.Generator().manual_seed(seed)
    signal = torch.randn(n, d, generator=gen, dtype=torch.float64)
    f = signal + 0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    g = signal + 0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    scales = torch.logspace(-2, 1, d, dtype=torch.float64)
    f, g = f * scales + 3.0, g * scales - 1.0
    f[:, 0] = 2.5            # constant
    g[:, 1] *= 1e-5          # variance 1e-10 of its own: under the floor of the largest
    return f, g


def test_collapse_figures__equal_a_direct_float64_computation() -> None:
    f, g = _encodings()
    got = {k: float(v) for k, v in encoding_figures(f, g).items()}
    want = _direct(f.numpy(), g.numpy())
    assert got["dead_dims"] == pytest.approx(2 / 16)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-10, abs=1e-12), key


def test_collapse_figures__of_merged_clients_equal_those_of_the_pooled_batch() -> None:
    f, g = _encodings(n=60, seed=3)
    sizes = [1, 4, 15, 40]  # uneven, a one-sample client among them
    parts = [encoding_stats(a, b) for a, b in zip(f.split(sizes), g.split(sizes), strict=True)]
    merged = collapse_figures(merge(parts).moments())
    pooled = encoding_figures(f, g)
    for key, value in pooled.items():
        assert float(merged[key]) == pytest.approx(float(value), rel=1e-10), key


def test_collapse_figures__of_vicreg_statistics_read_the_views_and_fs_own_rank() -> None:
    f, g = _encodings(seed=5)
    got = collapse_figures(encoding_stats(f, g, VICREG_STATS).moments())
    cco = encoding_figures(f, g)
    assert float(got["dead_dims"]) == pytest.approx(float(cco["dead_dims"]))
    assert float(got["corr_diag"]) == pytest.approx(float(cco["corr_diag"]), rel=1e-10)
    fa = f.numpy()
    live = fa.var(0) > DEAD_FLOOR * max(fa.var(0).max(), g.numpy().var(0).max())
    z = (fa[:, live] - fa[:, live].mean(0)) / fa[:, live].std(0)
    s = np.linalg.svd(z.T @ z / len(z), compute_uv=False)
    p = s / s.sum()
    assert float(got["eff_rank"]) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())),
                                                   rel=1e-9)


def test_collapse_figures__dimensions_under_the_losss_eps_are_dead() -> None:
    """Encodings scaled by 1e-4 (variances about 1e-8 against ε = 1e-5): C's figures do not
    move with the scale, but every dimension is dead to the loss, and the largest variance
    says why."""
    gen = torch.Generator().manual_seed(7)
    signal = torch.randn(64, 8, generator=gen, dtype=torch.float64)
    scales = torch.logspace(-0.5, 0.5, 8, dtype=torch.float64)  # none dead by the floor
    f = (signal + 0.5 * torch.randn(64, 8, generator=gen, dtype=torch.float64)) * scales
    g = (signal + 0.5 * torch.randn(64, 8, generator=gen, dtype=torch.float64)) * scales
    small_f, small_g = 1e-4 * f, 1e-4 * g
    plain = {k: float(v) for k, v in encoding_figures(small_f, small_g).items()}
    with_eps = {k: float(v) for k, v in encoding_figures(small_f, small_g, eps=1e-5).items()}
    at_scale = {k: float(v) for k, v in encoding_figures(f, g, eps=1e-5).items()}
    top = max(small_f.var(0, unbiased=False).max(), small_g.var(0, unbiased=False).max())
    assert plain["dead_dims"] == 0.0 and at_scale["dead_dims"] == 0.0
    assert with_eps["dead_dims"] == 1.0 and with_eps["corr_diag"] == 0.0
    assert plain["max_var"] == pytest.approx(float(top), rel=1e-10) and plain["max_var"] < 1e-5
    every = torch.cat([small_f.var(0, unbiased=False), small_g.var(0, unbiased=False)]).sort()
    assert plain["median_var"] == pytest.approx(float(every.values[7]), rel=1e-10)  # 16: lower
    assert plain["corr_diag"] == pytest.approx(at_scale["corr_diag"], rel=1e-8)
    assert plain["eff_rank"] == pytest.approx(at_scale["eff_rank"], rel=1e-8)


def test_collapse_watch__names_eps_only_for_encodings_that_vary_on_its_scale() -> None:
    dead = {"dead_dims": 1.0, "corr_diag": 0.0, "eff_rank": 0.0}
    small = CollapseWatch(20, eps=1e-5).check(20, dead | {"max_var": 1e-9}, 16)
    assert "vary less than a third of the loss's ε = 1e-05 (the largest variance is 1e-09)" in small
    assert "loss.eps" in small and "optim.lr" not in small
    constant = CollapseWatch(20, eps=1e-5).check(20, dead | {"max_var": 0.0}, 16)
    assert "no longer vary" in constant and "optim.lr" in constant
    healthy_scale = CollapseWatch(20, eps=1e-5).check(20, dead | {"max_var": 1.0}, 16)
    assert "no longer vary" in healthy_scale
    no_eps = CollapseWatch(20).check(20, dead | {"max_var": 1e-9}, 16)
    assert "no longer vary" in no_eps


def test_collapse_watch__a_plateau_of_small_clients_own_losses_blames_their_size_not_the_rate():
    """cco_fedavg at clients of 4 samples and d = 128 (the demo's): each client's CCO loss
    cannot estimate a 128 × 128 correlation from 4 samples, so the warning says so, whether
    the figures read a plateau or encodings shrunk under ε, and does not send the user to
    the rate or the scale; clients as wide as d get the rate's advice."""
    from dcco.core.collapse import CORR_READINGS

    plateau = {"dead_dims": 0.0, "corr_diag": 0.05, "eff_rank": 20.0}

    def warned(watch: CollapseWatch) -> str | None:
        message = None
        for r in range(CORR_READINGS):
            message = watch.check(20 + 10 * r, plateau, 128) or message
        return message

    small = warned(CollapseWatch(20, eps=1e-5, client_samples=4))
    assert "estimates a 128 × 128 correlation from its 4 samples" in small
    assert "neither a lower rate" in small and "optim.lr" not in small
    for watch in (CollapseWatch(20, eps=1e-5, client_samples=256), CollapseWatch(20, eps=1e-5)):
        assert "optim.lr" in warned(watch)
    # the demo's cco_fedavg run: its encodings shrink under ε (variance 1.6e-6 by round 80)
    shrunk = {"dead_dims": 1.0, "corr_diag": 0.0, "eff_rank": 0.0, "max_var": 1.6e-6}
    demo = CollapseWatch(20, eps=1e-5, client_samples=4).check(80, shrunk, 128)
    assert "vary less than a third of the loss's ε" in demo and "from its 4 samples" in demo
    assert "loss.eps" not in demo and "optim.lr" not in demo


def test_collapse_watch__an_encoder_whose_outputs_are_under_eps_is_warned(tmp_path):
    """An MLP whose output is scaled by 1e-4 and no projector: the CCO loss sees constants
    and stays near d; the figures read every dimension dead and the warning names ε."""
    import dcco
    from dcco.core.collapse import CollapseWarning

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 1e-4 * self.net(x)

    torch.manual_seed(0)
    with pytest.warns(CollapseWarning, match="vary less than a third of the loss's ε = 1e-05"
                      ) as caught:
        done = dcco.fit(Tiny(), _vector_clients(), rounds=20, augment=_noise,
                        clients_per_round=6, projector=None, run_dir=tmp_path / "r",
                        progress=False)
    # it points at the line above, the caller's, not at dcco's loop; and dcco exports it
    assert [w.filename for w in caught] == [__file__] and dcco.CollapseWarning is CollapseWarning
    assert done.collapse["dead_dims"] == 1.0 and done.collapse["max_var"] < 1e-5
    assert done.summary["final_loss"] > 0.95 * 8  # the loss sits at d


def test_effective_rank__of_known_spectra() -> None:
    assert float(effective_rank(torch.eye(7))) == pytest.approx(7.0)
    assert float(effective_rank(torch.outer(torch.ones(5), torch.arange(5.0)))) == \
        pytest.approx(1.0)
    assert float(effective_rank(torch.zeros(4, 4))) == 0.0


def test_collapse_figures__constant_encodings_are_all_dead() -> None:
    f = torch.full((10, 6), 0.3, dtype=torch.float64)
    figures = encoding_figures(f, f.clone())
    assert float(figures["dead_dims"]) == 1.0
    assert float(figures["corr_diag"]) == 0.0
    assert float(figures["eff_rank"]) == 0.0


def test_collapse_watch__judges_nothing_before_its_start_and_warns_once() -> None:
    watch = CollapseWatch(watch_start(0))
    dead = {"dead_dims": 1.0, "corr_diag": 0.0, "eff_rank": 0.0}
    assert watch.check(watch_start(0) - 1, dead, 16) is None
    message = watch.check(watch_start(0), dead, 16)
    assert message is not None and "dimensions" in message and "optim.lr" in message
    assert watch.check(watch_start(0) + 10, dead, 16) is None
    assert watch.message == message


class _Constant(torch.nn.Module):
    """An encoder whose output does not depend on its input, whatever its parameter: the
    quickstart Net's fate when its outputs went constant."""

    def __init__(self) -> None:
        super().__init__()
        self.level = torch.nn.Parameter(torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.level.expand(x.shape[0], -1)


def _vector_clients(n_clients: int = 12, per: int = 4) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {f"c{k}": torch.randn(per, 12, generator=gen) for k in range(n_clients)}


def _noise(x: torch.Tensor) -> torch.Tensor:
    return x + 0.3 * torch.randn_like(x)


def test_collapse_watch__a_constant_model_is_warned_and_recorded(tmp_path):
    import json

    import dcco
    from dcco.core.collapse import CollapseWarning

    with pytest.warns(CollapseWarning, match="100% of the encodings' dimensions no longer vary"):
        done = dcco.fit(_Constant(), _vector_clients(), rounds=20, augment=_noise,
                        clients_per_round=6, projector=(8, 8), run_dir=tmp_path / "r",
                        progress=False)
    assert done.collapse == {"round": 20, "dead_dims": 1.0, "corr_diag": 0.0, "eff_rank": 0.0,
                             "max_var": 0.0, "median_var": 0.0}
    assert done.collapse_warning.startswith("collapse at round 20:")
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["round"] for r in records if r.get("warning") == "collapse"] == [20]
    assert all(r["dead_dims"] == 1.0 for r in records if "dead_dims" in r)


def test_collapse_watch__a_learning_run_is_not_warned(tmp_path, recwarn):
    """An MLP on vectors whose two views share most of their signal: its figures stay those
    of a live encoder, and no warning comes."""
    import dcco

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    done = dcco.fit(mlp, _vector_clients(), rounds=30, augment=_noise, clients_per_round=6,
                    projector=(16, 16), run_dir=tmp_path / "r", progress=False)
    assert done.collapse_warning is None
    assert done.collapse["dead_dims"] == 0.0 and done.collapse["eff_rank"] > 3
    assert done.collapse["corr_diag"] > 0.3
    assert not [w for w in recwarn if "collapse" in str(w.message)]


def test_collapse_figures__of_a_method_without_statistics_come_from_a_probe_batch(tmp_path):
    """Contrastive FedAvg shares no statistics: its figures are read from a fixed batch's two
    views at the last round (and the k-NN monitor's), and reading them leaves the run as it
    would be without them (the same weights as a run that reads them at its end only)."""
    import dcco

    def run(knn_every, name):
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 8))
        return dcco.fit(mlp, _vector_clients(), rounds=4, augment=_noise,
                        method="contrastive_fedavg", clients_per_round=6, projector=(8, 8),
                        run_dir=tmp_path / name, progress=False,
                        settings={"train.knn_every": knn_every, "train.log_every": 1})

    done = run(2, "a")
    assert done.collapse["round"] == 4 and set(done.collapse) == {"round", "dead_dims", "max_var",
                                                                  "corr_diag", "eff_rank",
                                                                  "median_var"}
    records = [__import__("json").loads(line)
               for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records if "eff_rank" in r] == [2, 4]  # the monitor's rounds
    again = run(0, "b")  # read at its end only
    for p, q in zip(done.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_demo_dcco__its_first_60_rounds_give_no_collapse_warning(tmp_path) -> None:
    """The main job's DCCO run (configs/demo_fmnist.toml, real Fashion-MNIST) trains its
    encodings to 0.3-2 × the loss's ε, where the loss still reads over half of their spread:
    a regime that learns (the demo's best federated probe), which the watch once called
    encodings under ε at round 50 (experiments/eps_regime.py). Its first 60 rounds, on the
    demo's 200-round schedule, warn of nothing, and its figures read live dimensions."""
    import json

    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.setup import resolved
    from dcco.run.splits import load_splits

    cfg = resolved(load_config(ROOT / "configs" / "demo_fmnist.toml",
                               ["train.knn_every=0", "train.checkpoint_every=1000"]))
    assert cfg.train.method == "dcco" and cfg.train.rounds == 200
    train, _ = load_splits(cfg)
    run = RunDir.create(tmp_path / "demo-dcco", cfg)
    done = {"rounds": 0}

    def on_round(metrics, logged) -> None:
        done["rounds"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapseWarning)
        record = run_pretraining(cfg, run, train, None, on_round=on_round,
                                 stop=lambda: "60 rounds" if done["rounds"] >= 60 else None)
    assert record["stopped"] == "60 rounds" and record["rounds"] >= 60  # its window's end
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert not [x for x in lines if x.get("warning") == "collapse"]
    judged = [x for x in lines if "dead_dims" in x and x["round"] >= 40]
    assert judged and max(x["dead_dims"] for x in judged) < 0.5
    assert min(x["corr_diag"] for x in judged) > 0.15


def test_collapse_watch__its_advice_names_the_runs_setting_and_offers_nothing_it_has():
    """The rate advice names the run's optimiser and rate; dcco's projector is offered only
    to a model without it, and train.on_collapse = "rewind" only to a run that does not
    rewind already."""
    one_line = {"dead_dims": 0.0, "corr_diag": 0.3, "eff_rank": 1.1}
    plain = CollapseWatch(20, eps=1e-5, server=("lars", 1.5)).check(20, one_line, 16)
    assert "optim.lr = 0.75 (now 1.5 under lars)" in plain
    assert 'train.on_collapse = "rewind"' in plain and "normalisation layers" in plain
    rewinding = CollapseWatch(20, eps=1e-5, server=("lars", 1.5), has_projector=True,
                              offer_rewind=False).check(20, one_line, 16)
    assert "optim.lr = 0.75" in rewinding and "on_collapse" not in rewinding
    assert "normalisation layers" not in rewinding
    shrunk = {"dead_dims": 0.9, "corr_diag": 0.3, "eff_rank": 5.0, "max_var": 2e-5}
    ours = CollapseWatch(20, eps=1e-5, server=("lars", 1.5), has_projector=True).check(
        20, shrunk, 16)
    theirs = CollapseWatch(20, eps=1e-5).check(20, shrunk, 16)
    assert "dcco's projector" not in ours and "loss.eps" in ours
    assert "give it dcco's projector" in theirs
