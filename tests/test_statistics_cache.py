"""FedSC's server cache for partial participation (``train.absent_statistics = "cached"``): the
aggregate of every client's last statistics, kept by a running sum; the exact round when
every client takes part, not when some are absent; a bit-identical resume; and refusals where
it cannot run."""

from __future__ import annotations

import pytest
import torch

from dcco.config import ConfigError, load_config
from dcco.core.statistics_cache import StatisticsCache, cache_bytes
from dcco.core.stats import SPECTRAL_STATS, encoding_stats, merge
from dcco.run.loop import run_pretraining
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import RunDir
from dcco.run.setup import validate
from dcco.run.splits import load_splits


def _stats(seed: int, n: int):
    gen = torch.Generator().manual_seed(seed)
    f, g = (torch.randn(n, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    return encoding_stats(f, g, SPECTRAL_STATS)


def test_cache__aggregate_is_the_merge_of_every_clients_last_statistics():
    cache = StatisticsCache()
    latest = {}
    rounds = [[0, 1, 2], [2, 3], [0, 4], [1, 3, 4]]
    for r, clients in enumerate(rounds):
        fresh = [_stats(10 * r + c, 1 + c) for c in clients]
        latest.update(zip(clients, fresh, strict=True))
        out = cache.merge_round(clients, fresh)
        expected = merge([latest[c] for c in sorted(latest)])
        assert list(out) == list(fresh[0])  # names in the fresh statistics' order
        for k, v in expected.items():
            torch.testing.assert_close(out[k], v, rtol=1e-12, atol=1e-12)
    assert float(out.count) == sum(1 + c for c in latest)
    again = StatisticsCache.from_state(cache.state())
    nxt = [_stats(99, 2)]
    a, b = cache.merge_round([3], nxt), again.merge_round([3], nxt)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="one statistics per client"):
        cache.merge_round([1, 2], nxt)
    assert StatisticsCache.from_state({}).total is None


def _run(cfg, train, rounds):
    pt = Pretraining.of(cfg, train)
    for _ in range(rounds):
        pt.step()
    return pt


def test_cached_rounds__exact_with_full_participation_and_not_with_absent_clients(tiny_config):
    base = ["train.method=\"fedsc\"", "model.clip_encodings=2.0"]
    full = base + ["data.num_clients=4"]  # 4 clients a round: all of them, every round
    cfg = load_config(tiny_config(rounds=3), full)
    train, _ = load_splits(cfg)
    drop = _run(cfg, train, 3)
    cached = _run(load_config(tiny_config(rounds=3), full + ["train.absent_statistics=\"cached\""]),
                  train, 3)
    for (name, a), (_, b) in zip(drop.model.state_dict().items(),
                                 cached.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert len(cached.cache.last) == 4
    partial = base + ["data.num_clients=12"]  # 4 of 12 a round: the others' last ones count
    drop = _run(load_config(tiny_config(rounds=3), partial), train, 3)
    cached = _run(load_config(tiny_config(rounds=3),
                              partial + ["train.absent_statistics=\"cached\""]), train, 3)
    assert len(cached.cache.last) > 4
    assert not all(torch.equal(a, b) for a, b in zip(drop.model.state_dict().values(),
                                                     cached.model.state_dict().values()))


def test_cached_rounds__resume_is_bit_identical_with_the_saved_cache(tiny_config, tmp_path):
    from safetensors.torch import load_file

    from dcco.run.checkpoint import save_checkpoint

    cfg = load_config(tiny_config(rounds=4, checkpoint_every=2),
                      ["train.method=\"fedsc\"", "data.num_clients=12",
                       "train.absent_statistics=\"cached\""])
    train, _ = load_splits(cfg)
    whole = RunDir.create(tmp_path / "whole", cfg)
    run_pretraining(cfg, whole, train)
    stopped = RunDir.create(tmp_path / "stopped", cfg)
    pt = _run(cfg, train, 2)
    save_checkpoint(stopped.checkpoint_path, pt.model, pt.optimizer, 2, state=pt.round_state())
    run_pretraining(cfg, stopped, train, resume=True)
    a, b = load_file(whole.checkpoint_path), load_file(stopped.checkpoint_path)
    assert a.keys() == b.keys() and "state.cache.clients" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_cached_rounds__refused_without_statistics_with_privacy_staleness_or_too_many_clients(
        tiny_config, monkeypatch):
    path = tiny_config()
    cached = "train.absent_statistics=\"cached\""
    for extra, match in ((["train.method=\"contrastive_fedavg\""], "shares none"),
                         (["train.staleness=1"], "train.staleness = 0"),
                         (["privacy.noise_multiplier=1.0", "privacy.target_epsilon=\"none\""],
                          "differential privacy")):
        with pytest.raises(ConfigError, match=match):
            validate(load_config(path, [cached, *extra]))
    assert cache_bytes(15000, 300, 32, 32768) == 9600 * 32769 * 8
    cfg = load_config(path, [cached])
    train, _ = load_splits(cfg)
    monkeypatch.setattr("dcco.run.stores.MAX_CACHE_BYTES", 1 << 10)  # 24 clients of 16-wide sums
    with pytest.raises(ConfigError, match="GiB of client statistics"):
        Pretraining.of(cfg, train)


def test_cached_rounds__refused_under_secagg_over_flower():
    from dcco.flower.appconfig import parse_run_config

    cached = {"train.method": "fedsc", "train.absent_statistics": "cached"}
    cfg, fcfg = parse_run_config(cached)  # plain exchanges carry each client's statistics
    assert cfg.train.absent_statistics == "cached" and not fcfg.secagg
    with pytest.raises(ConfigError, match="SecAgg\\+ shows the server only the sum"):
        parse_run_config(cached | {"flower.secagg": True})
