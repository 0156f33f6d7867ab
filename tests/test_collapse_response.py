"""``train.on_collapse`` (``dcco.run.collapse_response``) under a forced collapse: the demo's
DCCO network on the real Fashion-MNIST, LARS at a base rate of 0.6 (constant), its rate raised
20 times from round 20. That collapses it within 20 rounds (to one direction, or onto ε's
scale: which one the watch reads first depends on the CPU's rounding); "warn" trains
on, "stop" ends with a checkpoint from before the collapse as its result, "rewind" goes back
to it at half the rate and ends healthy."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from dcco.config import load_config
from dcco.core.collapse import CollapseWarning
from dcco.run.checkpoint import checkpoint_rounds, checkpoint_state, read_checkpoint
from dcco.run.collapse_response import pretraining_ended
from dcco.run.loop import run_pretraining
from dcco.run.pretraining import LR_SCALE_KEY, Pretraining
from dcco.run.rundir import RunDir
from dcco.run.setup import resolved
from dcco.run.splits import load_splits

ROOT = Path(__file__).resolve().parents[1]
FORCED_FROM, FORCE = 20, 20.0
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fmnist():
    cfg = resolved(load_config(ROOT / "configs" / "demo_fmnist.toml", ["train.knn_every=0"]))
    return load_splits(cfg)[0]


@pytest.fixture
def forced(monkeypatch):
    """The server's rate 20 times its own from round 20 on (the schedule, times the rewinds'
    scale, times 20)."""
    own = Pretraining.lr
    monkeypatch.setattr(Pretraining, "lr", lambda self, r: own(self, r)
                        * (FORCE if r >= FORCED_FROM else 1.0))


def _run(tmp_path: Path, train, mode: str, rounds: int, name: str | None = None):
    cfg = resolved(load_config(ROOT / "configs" / "demo_fmnist.toml", [
        "train.knn_every=0", "train.checkpoint_every=10", "train.log_every=5",
        f"train.rounds={rounds}", f"train.on_collapse=\"{mode}\"", "optim.lr=0.6",
        "optim.schedule=\"constant\""]))
    run = RunDir.create(tmp_path / (name or mode), cfg)
    said: list[str] = []
    summary = run_pretraining(cfg, run, train, None, on_warning=said.append)
    records = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    return cfg, run, summary, records, said


def _healthy(figures: dict) -> bool:
    return figures["dead_dims"] < 0.5 and figures["eff_rank"] > 1.5 \
        and figures["corr_diag"] > 0.15


def test_on_collapse_warn__a_forced_collapse_is_warned_and_the_run_trains_on(
        tmp_path, fmnist, forced):
    _, _, summary, records, said = _run(tmp_path, fmnist, "warn", 40)
    warned = [r for r in records if r.get("warning") == "collapse"]
    assert len(warned) == 1 and FORCED_FROM < warned[0]["round"] <= 40
    assert said == [warned[0]["message"]]  # which collapse it reads first varies by CPU
    assert summary["rounds"] == 40 and "collapse_events" not in summary
    assert "stopped_at_collapse" not in summary


def test_on_collapse_stop__the_result_is_a_checkpoint_from_before_the_collapse(
        tmp_path, fmnist, forced):
    cfg, run, summary, records, said = _run(tmp_path, fmnist, "stop", 60)
    (event,) = [r for r in records if "collapse_response" in r]
    warned_at, kept = event["round"], event["to_round"]
    assert event["collapse_response"] == "stop" and kept <= warned_at - 10
    assert kept <= FORCED_FROM  # from before the raised rate, not on the way down
    assert summary["stopped_at_collapse"] == {"round": warned_at, "kept_round": kept}
    assert summary["rounds"] == kept and summary["collapse_events"] == [event["line"]]
    assert summary["collapse_warning"] == event["message"]
    assert said == [event["message"], event["line"]]  # the warning, then its one line
    # the metrics hold the kept rounds and the event, nothing of the collapse after them
    assert max(r["round"] for r in records if "collapse_response" not in r) <= kept
    # the run's checkpoint is the result: the model of a plain run of the kept rounds (the
    # raised rate starts after them), bit for bit
    assert checkpoint_rounds(run.checkpoint_path) == kept
    _run(tmp_path, fmnist, "warn", kept, name="plain")
    result = read_checkpoint(run.checkpoint_path, "model.")[0]
    plain = read_checkpoint(tmp_path / "plain" / "checkpoint.safetensors", "model.")[0]
    assert set(result) == set(plain)
    assert all(torch.equal(result[k], plain[k]) for k in result)
    # a run that stopped so is over: resuming it trains nothing and returns its summary
    steps: list[int] = []
    again = run_pretraining(cfg, RunDir.open(run.path), fmnist, None, resume=True,
                            on_round=lambda m, latest: steps.append(m.round))
    assert steps == [] and again == summary
    assert pretraining_ended(summary, cfg.train.rounds)


def test_on_collapse_rewind__halves_the_rate_from_before_the_collapse_and_ends_healthy(
        tmp_path, fmnist, forced):
    _, run, summary, records, said = _run(tmp_path, fmnist, "rewind", 60)
    events = [r for r in records if "collapse_response" in r]
    assert 1 <= len(events) <= 3 and all(e["collapse_response"] == "rewind" for e in events)
    first = events[0]
    assert first["to_round"] <= FORCED_FROM and first["lr_scale"] == 0.5
    assert [e["lr_scale"] for e in events] == [0.5 ** k for k in range(1, len(events) + 1)]
    assert "stopped_at_collapse" not in summary and summary["rounds"] == 60
    assert summary["collapse_events"] == [e["line"] for e in events]
    assert all(e["line"] in said for e in events)
    # a run that rewinds is not advised to rewind
    assert not any('train.on_collapse = "rewind"' in line for line in said)
    # after the last rewind, the rate is the raised one times its scale, every round logged
    scale = events[-1]["lr_scale"]
    after = [r for r in records if "lr" in r and r["round"] > events[-1]["to_round"]]
    assert after and all(r["lr"] == pytest.approx(0.6 * FORCE * scale) for r in after
                         if r["round"] > FORCED_FROM)
    # each round is recorded once, in order, as a resumed run's would be
    rounds = [r["round"] for r in records if "loss" in r]
    assert rounds == sorted(set(rounds)) and rounds[-1] == 60
    # it ends healthy, and its checkpoint carries the halved rate for a resume
    assert _healthy(summary["collapse"])
    assert float(checkpoint_state(run.checkpoint_path)[LR_SCALE_KEY]) == scale


def test_on_collapse__a_rewind_is_refused_where_nodes_keep_the_clients_models(tmp_path,
                                                                              fmnist):
    from dcco.config import ConfigError
    from dcco.run.collapse_response import CollapseResponse
    from dcco.run.monitors import standard_monitors

    cfg = resolved(load_config(ROOT / "configs" / "demo_fmnist.toml", [
        "train.method=\"fedu\"", "model.norm=\"bn\"", "train.on_collapse=\"rewind\"",
        "train.rounds=2"]))
    pt = Pretraining.of(cfg, fmnist, holds_client_states=False)  # as a Flower server is
    run = RunDir.create(tmp_path / "r", cfg)
    with pytest.raises(ConfigError, match="keep their own models on the nodes"):
        CollapseResponse.of(pt, run, standard_monitors(pt, run, fmnist, None, {}), None)


class _Constant(torch.nn.Module):
    """An encoder whose output does not depend on its input: dead from the first reading."""

    def __init__(self) -> None:
        super().__init__()
        self.level = torch.nn.Parameter(torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.level.expand(x.shape[0], -1)


def test_on_collapse__without_a_progress_bar_each_event_is_a_collapse_warning(tmp_path):
    """``dcco.fit`` without a progress bar gives the warning and the event each as a
    ``CollapseWarning``; a collapse before the first periodic checkpoint but one goes back
    to the run's start, which these modes checkpoint."""
    import dcco

    gen = torch.Generator().manual_seed(0)
    clients = {f"c{k}": torch.randn(4, 12, generator=gen) for k in range(12)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = dcco.fit(_Constant(), clients, rounds=30,
                        augment=lambda x: x + 0.3 * torch.randn_like(x), clients_per_round=6,
                        projector=(8, 8), run_dir=tmp_path / "r", progress=False,
                        settings={"train.on_collapse": "stop", "train.checkpoint_every": 10})
    said = [str(w.message) for w in caught if issubclass(w.category, CollapseWarning)]
    assert len(said) == 2 and "run stopped" in said[1] and said[0] == done.collapse_warning
    assert done.summary["stopped_at_collapse"] == {"round": 20, "kept_round": 0}
    assert done.summary["rounds"] == 0 and not (tmp_path / "r" / "summary.json").read_text() \
        .count("\"rounds\": 30")
