"""``dcco.flower.DCCOStrategy`` in a Flower app of the user's own (docs/own_code.md, "Flower"): its
rounds equal dcco's reference round with a model that is not dcco's; a node lost between the
phases, malformed and failed replies, bad models and empty nodes give a completed or a
skipped round, counted; and the example app trains in Flower's simulation."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from torch import nn

from dcco.core.optim import apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.core.simulator import run_round
from dcco.flower import DCCOStrategy, RoundsSkipped, SecAgg, answer, codec, secure_aggregation_mod
from dcco.flower.testing.inprocess import InProcessGrid
from dcco.flower.userapp import _views
from dcco.methods import Segments, build_method
from dcco.models.dual_views import CHUNK

ROOT = Path(__file__).parents[1]
SIZES = [1, 3, 2, 5]


class UserCNN(nn.Module):
    def __init__(self, out: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.norm = nn.GroupNorm(2, 6)
        self.head = nn.Linear(6, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


def _samples(node: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + node)
    n = SIZES[(node - 1) % len(SIZES)]
    return torch.rand(n, 1, 8, 8, generator=gen, dtype=torch.float64)


def _augment(x: torch.Tensor) -> torch.Tensor:
    return x + 0.1 * torch.randn(x.shape, dtype=x.dtype)


def _client_app(model=lambda: UserCNN().double(), samples=_samples,
                state_dir: Path | None = None, chunk: int | None = CHUNK) -> ClientApp:
    app = ClientApp()

    @app.train(mods=[secure_aggregation_mod])
    def train(msg: Message, context: Context) -> Message:
        return answer(msg, context, model(), samples(context.node_id), augment=_augment,
                      state_dir=None if state_dir is None else state_dir / str(context.node_id),
                      chunk=chunk)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:  # the encodings' mean, a metric
        net = model()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x = samples(context.node_id)
        with torch.no_grad():
            mean = float(net(x).mean()) if len(x) else 0.0
        return Message(RecordDict({"metrics": MetricRecord(
            {"mean": mean, "round": int(msg.content["config"]["server-round"]),
             "num-examples": len(x)})}), reply_to=msg)

    return app


def _grid(nodes: int = 4, tamper=None, **kw) -> InProcessGrid:
    """``nodes`` nodes of ``_client_app(**kw)``; ``tamper`` sees the training replies."""
    train_only = None if tamper is None else (
        lambda n, msg, reply: tamper(n, msg, reply)
        if msg.metadata.message_type == MessageType.TRAIN else reply)
    return InProcessGrid(_client_app(**kw), [{}] * nodes, {}, train_only)


def _initial() -> tuple[nn.Module, ArrayRecord]:
    torch.manual_seed(0)
    model = UserCNN().double()
    return model, ArrayRecord(model.state_dict())


def _reference(model: nn.Module, strategy: DCCOStrategy, method: str, rounds: int,
               nodes: list[int] | list[list[int]], samples=_samples, augment=_augment,
               absent=None, aggregation: str = "fedavg") -> dict[str, torch.Tensor]:
    """The same rounds with dcco's reference round on the nodes' views (the same nodes every
    round, or a list of them a round), and the same server optimiser; ``absent(nodes)``: the
    round's merge with a cache of absent nodes; ``aggregation``: the server's rule."""
    from dcco.api import dual_encoder
    from dcco.core.algorithm import Algorithm

    each = nodes if isinstance(nodes[0], list) else [nodes] * rounds
    dual = dual_encoder(model, None, sample=samples(each[0][0])[0])
    named = list(model.named_parameters())
    opt = build_optimizer(named, strategy.optim)
    for r in range(1, rounds + 1):
        nodes = each[r - 1]
        config = strategy.node_config("stats", r, {})
        views = [_views(samples(n), augment, int(config["views-seed"]), n, torch.float64)
                 for n in nodes]
        x1 = torch.cat([v[0] for v in views])
        x2 = torch.cat([v[1] for v in views])
        sizes = [len(samples(n)) for n in nodes]
        # the strategy's λ (its default, 5, not the paper's 20), which the nodes get from
        # the wire: a node left at 20 would give another round
        out = run_round(dual, Algorithm(build_method(method, strategy.method.loss),
                                        strategy.local_lr, aggregation=aggregation), x1, x2,
                        Segments.from_counts(sizes),
                        "reference", absent=absent(nodes) if absent is not None else None)
        set_lr(opt, scheduled_lr(r - 1, rounds, strategy.optim.lr, strategy.optim.warmup_rounds,
                                 strategy.optim.schedule))
        apply_pseudo_gradient(opt, [p for _, p in named],
                              [out.pseudo_gradient["backbone." + n] for n, _ in named])
    return {k: v.detach() for k, v in model.state_dict().items()}


def _rel(a: dict, b: dict) -> float:
    fa = torch.cat([torch.as_tensor(a[k]).flatten() for k in sorted(b)])
    fb = torch.cat([b[k].flatten() for k in sorted(b)])
    return float((fa - fb).norm() / fb.norm())


@pytest.mark.parametrize("method,aggregation", [
    ("dcco", "fedavg"), ("dvicreg", "fedavg"), ("dcco", "ldawa")])
def test_strategy_rounds__equal_the_reference_round_with_the_users_model(method, aggregation):
    """Also under L-DAWA, whose scaling each node's ``answer`` applies to its own update: at
    a client rate of 0.05, since at 1.0 this tiny CNN's step is 20 times its weights and
    L-DAWA's second round turns the first's 1e-13 (the nodes' chunked forwards, another
    summation order) into 1e-9; at 0.05 it moves the model 4 times as far as FedAvg's."""
    model, initial = _initial()
    local_lr, tol = (0.05, 1e-11) if aggregation == "ldawa" else (1.0, 1e-12)
    strategy = DCCOStrategy(method=method, optimizer="lars", lr=0.5, warmup_rounds=1,
                            min_available_nodes=4, aggregation=aggregation, local_lr=local_lr)
    result = strategy.start(grid=_grid(), initial_arrays=initial, num_rounds=2)
    expected = _reference(model, DCCOStrategy(method=method, optimizer="lars", lr=0.5,
                                              warmup_rounds=1, local_lr=local_lr),
                          method, 2, [1, 2, 3, 4], aggregation=aggregation)
    got = {k: v for k, v in result.arrays.to_torch_state_dict().items()}
    assert _rel(got, expected) <= tol
    assert _rel(got, {k: v.detach() for k, v in _initial()[0].state_dict().items()}) > 1e-4
    for r in (1, 2):
        m = result.train_metrics_clientapp[r]
        assert m["stats-accepted"] == 4 and m["update-accepted"] == 4 and m["skipped"] == 0
        assert m["num-examples"] == sum(SIZES) and math.isfinite(m["loss"])
        assert 0 <= m["dead_dims"] <= 1 and m["eff_rank"] >= 1  # the figures of its S_A


def _two_or_more(node: int) -> torch.Tensor:
    """A node's samples for a loss within a client (2 to 5 of them)."""
    gen = torch.Generator().manual_seed(100 + node)
    return torch.rand(1 + node, 1, 8, 8, generator=gen, dtype=torch.float64)


class UserBatchNormCNN(UserCNN):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(6)


def _headed(method: str, encoder: type[nn.Module] = UserCNN) -> nn.Module:
    """The user's CNN with a projector and ``method``'s predictor and target network."""
    from dcco.api import dual_encoder

    torch.manual_seed(0)
    return dual_encoder(encoder(), (12, 16), sample=torch.zeros(1, 8, 8), method=method).double()


def _nodes_buffers(dual, algorithm, nodes, views, store, tau, r) -> dict[str, torch.Tensor]:
    """Batch norm's running statistics as the server averages them: each node's after its
    step (a forward of its views from the global model; a stateful client's from its own
    start), weighted by its samples."""
    import copy

    from dcco.core.client_state import RoundStates

    floating = [k for k, v in dual.named_buffers() if v.is_floating_point()]
    sums, total = dict.fromkeys(floating, 0.0), 0
    for n, (x1, x2) in zip(nodes, views, strict=True):
        node = copy.deepcopy(dual)
        if algorithm.stateful:
            run_round(node, algorithm, x1, x2, Segments.from_counts([len(x1)]), "reference",
                      states=RoundStates([n], copy.deepcopy(store), tau, r))
        else:
            with torch.no_grad():
                node(x1, x2)
        own = dict(node.named_buffers())
        for k in floating:
            sums[k] = sums[k] + len(x1) * own[k]
        total += len(x1)
    integers = {k: v.clone() for k, v in dual.named_buffers() if not v.is_floating_point()}
    return {k: v / total for k, v in sums.items()} | integers  # the server keeps integers


@pytest.mark.parametrize("method,encoder", [
    ("byol_fedavg", UserCNN), ("simsiam_fedavg", UserCNN), ("moco_fedavg", UserCNN),
    ("fedu", UserCNN), ("fedema", UserCNN), ("byol_fedavg", UserBatchNormCNN),
    ("fedema", UserBatchNormCNN)])
def test_strategy__predictive_and_stateful_methods_equal_the_simulators_rounds(method, encoder):
    """BYOL's, SimSiam's and MoCo's rounds, and FedU's and FedEMA's clients that keep their
    model, in a Flower app of the user's own: three rounds equal dcco's reference rounds on
    the same views, the server's target update (BYOL) and the clients' kept states (the
    simulator's store) included; with batch norm, its running statistics are the nodes'
    after their step (a stateful client's from its own start), averaged by samples."""
    from dcco.core.algorithm import Algorithm
    from dcco.core.client_state import ClientStates, RoundStates
    from dcco.methods.predictive import target_decay

    loss = {"target_decay": 0.9} | ({"moco_queue": 6} if method == "moco_fedavg" else {})
    strategy = DCCOStrategy(method=method, optimizer="lars", lr=0.5, warmup_rounds=1,
                            min_available_nodes=4, fraction_evaluate=0.0, loss=loss)
    sent: list[tuple[int, set[str]]] = []  # each training message's round and arrays

    def seen(n, msg, reply):
        sent.append((int(msg.content.config_records["config"]["server-round"]),
                     set(codec.tensors_of(msg.content.array_records["arrays"]))))
        return reply

    grid = _grid(model=lambda: _headed(method, encoder), samples=_two_or_more, tamper=seen)
    result = strategy.start(grid=grid, num_rounds=3,
                            initial_arrays=ArrayRecord(_headed(method, encoder).state_dict()))
    dual, nodes = _headed(method, encoder), [1, 2, 3, 4]
    # a client that keeps its own target network is not sent the server's, once the server
    # knows the trained arrays (from round 1's replies)
    targets = {k for k, _ in dual.named_parameters() if k.startswith("target.")}
    assert bool(targets) == (method != "simsiam_fedavg") and len(sent) == 12 and all(
        targets <= keys if r == 1 or not build_method(method).stateful else not targets & keys
        for r, keys in sent)
    named = [(n, p) for n, p in dual.named_parameters() if p.requires_grad]
    opt = build_optimizer(named, strategy.optim)
    algorithm = Algorithm(build_method(method, strategy.method.loss), local_lr=1.0)
    store = ClientStates(torch.float64)
    for r in (1, 2, 3):
        seed = int(strategy.node_config("update", r, {})["views-seed"])
        views = [_views(_two_or_more(n), _augment, seed, n, torch.float64) for n in nodes]
        tau = target_decay(0.9, r - 1, 3)
        buffers = _nodes_buffers(dual, algorithm, nodes, views, store, tau, r - 1)
        out = run_round(dual, algorithm, torch.cat([v[0] for v in views]),
                        torch.cat([v[1] for v in views]),
                        Segments.from_counts([len(_two_or_more(n)) for n in nodes]), "reference",
                        states=(RoundStates(nodes, store, tau, r - 1) if algorithm.stateful
                                else None))
        set_lr(opt, scheduled_lr(r - 1, 3, 0.5, 1, strategy.optim.schedule))
        apply_pseudo_gradient(opt, [p for _, p in named],
                              [out.pseudo_gradient[n] for n, _ in named])
        if method == "byol_fedavg":
            dual.update_target(tau)
        dual.load_state_dict(dual.state_dict() | buffers)  # the server's average of them
    expected = {k: v.detach() for k, v in dual.state_dict().items()}
    got = result.arrays.to_torch_state_dict()
    assert got.keys() == expected.keys() and _rel(got, expected) <= 1e-12
    start = _headed(method, encoder).state_dict()
    assert _rel(got, {k: v.detach() for k, v in start.items()}) > 1e-4
    moved = any(not torch.equal(got[k], start[k]) for k, _ in dual.named_parameters()
                if k.startswith("target."))
    assert moved == (method == "byol_fedavg")  # the others' clients keep their own
    assert all(result.train_metrics_clientapp[r]["update-accepted"] == 4 for r in (1, 2, 3))
    assert len(store) == 4 if algorithm.stateful else not store


def test_strategy__predictive_methods_refuse_a_model_without_their_head():
    strategy = DCCOStrategy(method="byol_fedavg", min_available_nodes=4)
    with pytest.raises(ValueError, match=r"not a dual encoder's, and byol_fedavg trains with .*"
                                         r"dcco.dual_encoder\(encoder, projector, "
                                         r"method='byol_fedavg'\)"):
        strategy.start(grid=_grid(), initial_arrays=_initial()[1], num_rounds=1)
    byol = ArrayRecord(_headed("byol_fedavg").state_dict())
    for method, why in (("simsiam_fedavg", "hold a target network, which simsiam_fedavg has not"),
                        ("dcco", "hold a predictor, which dcco has not")):
        with pytest.raises(ValueError, match=why):
            DCCOStrategy(method=method, min_available_nodes=4).start(
                grid=_grid(), initial_arrays=byol, num_rounds=1)
    with pytest.raises(ValueError, match="unknown key 'loss.moco_size'"):
        DCCOStrategy(method="moco_fedavg", loss={"moco_size": 4})
    with pytest.raises(ValueError, match="give lambd="):
        DCCOStrategy(method="byol_fedavg", loss={"lambd": 4.0})
    with pytest.raises(ValueError, match="under SecAgg\\+ is not implemented"):
        DCCOStrategy(method="fedema", secagg=SecAgg(UserCNN(), torch.zeros(2, 1, 8, 8), 8))
    # a node whose model lacks the head fails its reply, named, and the round is skipped
    headed = ArrayRecord(_headed("simsiam_fedavg").state_dict())
    result = DCCOStrategy(method="simsiam_fedavg", min_available_nodes=4,
                          fraction_evaluate=0.0)
    with pytest.raises(RoundsSkipped, match="dcco.dual_encoder"):
        result.start(grid=_grid(samples=_two_or_more), initial_arrays=headed, num_rounds=2)


def test_answer__the_kept_forward_and_a_second_forward_give_the_same_run_to_the_bit(
        monkeypatch):
    """``answer`` keeps phase 1's forward for phase 2 (in one process, as here): two rounds
    with it, and with none kept (``FORWARDS.max_bytes = 0``, as when phase 2 reaches another process
    or the activations are over the bound), end in the same weights, bit for bit, and leave
    nothing kept behind; in chunks of 2 samples alike, and (under SGD, as Adam's first steps
    are the signs of the gradient, a head bias's 0 by rounding among them) as one batch's run
    to float64 rounding."""
    from dcco.flower import userapp

    _, initial = _initial()

    def run(chunk: int | None = None, optimizer: str = "adam") -> dict:
        strategy = DCCOStrategy(optimizer=optimizer, lr=1e-3, min_available_nodes=4,
                                fraction_evaluate=0.0)
        result = strategy.start(grid=_grid(chunk=chunk), initial_arrays=initial,
                                num_rounds=2)
        return result.arrays.to_torch_state_dict()

    kept, kept_chunks = run(), run(chunk=2)
    assert not any(k[0] in (1, 2, 3, 4) and k[2] == 2 for k in userapp.FORWARDS)
    monkeypatch.setattr(userapp.FORWARDS, "max_bytes", 0)
    again, again_chunks = run(), run(chunk=2)
    assert all(torch.equal(kept[k], again[k]) for k in kept)
    assert all(torch.equal(kept_chunks[k], again_chunks[k]) for k in kept)
    one, chunks = run(optimizer="sgd"), run(chunk=2, optimizer="sgd")
    start = initial.to_torch_state_dict()
    assert all(not torch.equal(one[k], start[k]) for k in one)
    assert all(torch.allclose(chunks[k], one[k], rtol=0, atol=1e-14) for k in one)


def test_strategy__a_fedavg_method_takes_one_exchange_and_trains():
    _, initial = _initial()
    grid = _grid()
    sent = []
    original = grid.send_and_receive
    grid.send_and_receive = lambda msgs, timeout=None: sent.append(len(list(msgs) or [])) \
        or original(msgs, timeout=timeout)
    strategy = DCCOStrategy(method="contrastive_fedavg", optimizer="adam", lr=1e-3,
                            min_available_nodes=4, fraction_evaluate=0.0)  # training's exchanges
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    m = result.train_metrics_clientapp[1]
    # the 1-sample node cannot take a within-client loss: it fails, and is counted
    assert m["update-accepted"] == 3 and m["update-failed"] == 1 and "stats-sent" not in m
    assert len(sent) == 1


def _lose(node: int, phase: str):
    def tamper(n: int, msg: Message, reply: Message) -> Message | None:
        return None if n == node and msg.content["config"]["phase"] == phase else reply
    return tamper


def test_strategy__a_node_lost_between_the_phases_counts_in_S_A_not_in_the_update():
    model, initial = _initial()
    strategy = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4)
    result = strategy.start(grid=_grid(tamper=_lose(2, "update")), initial_arrays=initial,
                            num_rounds=1)
    m = result.train_metrics_clientapp[1]
    assert (m["stats-accepted"], m["update-accepted"], m["update-missing"]) == (4, 3, 1)
    assert m["num-examples"] == sum(SIZES) - SIZES[1]
    # what it should be: S_A of all four, the survivors' updates averaged
    from dcco.api import aggregate_updates, local_update, merge_statistics, statistics

    seed = int(strategy.node_config("stats", 1, {})["views-seed"])
    views = {n: _views(_samples(n), _augment, seed, n, torch.float64) for n in (1, 2, 3, 4)}
    shared = merge_statistics([statistics(model, *views[n]) for n in views], 16).aggregate
    step = aggregate_updates([local_update(model, *views[n], shared) for n in (1, 3, 4)], model)
    assert step.loss == pytest.approx(m["loss"], rel=1e-12)


def test_strategy__malformed_and_failed_replies_are_counted_and_the_round_goes_on():
    def tamper(n: int, msg: Message, reply: Message) -> Message | None:
        phase = msg.content["config"]["phase"]
        if n == 1 and phase == "stats":  # statistics of the wrong width
            sums = codec.tensors_of(reply.content.array_records["statistics"])
            sums["sum_fg"] = torch.zeros(3, 3, dtype=torch.float64)
            return Message(RecordDict({"statistics": codec.array_record(sums),
                                       "metrics": reply.content["metrics"]}), reply_to=msg)
        if n == 3 and phase == "update":  # garbage instead of an update
            return Message(RecordDict({"metrics": MetricRecord({"num-examples": 2})}),
                           reply_to=msg)
        return reply

    _, initial = _initial()
    result = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4).start(
        grid=_grid(tamper=tamper), initial_arrays=initial, num_rounds=1)
    m = result.train_metrics_clientapp[1]
    assert m["stats-accepted"] == 3 and m["stats-rejected-shape"] == 1
    assert m["update-accepted"] == 2 and m["update-rejected-missing_key"] == 1
    assert m["skipped"] == 0 and m["num-examples"] == SIZES[1] + SIZES[3]


def test_strategy__too_few_valid_replies_skip_the_round_and_leave_the_model():
    _, initial = _initial()
    with pytest.raises(RoundsSkipped, match="every one of the 1 rounds was skipped") as e:
        DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4, min_survivors=4).start(
            grid=_grid(tamper=_lose(4, "stats")), initial_arrays=initial, num_rounds=1)
    result = e.value.result
    m = result.train_metrics_clientapp[1]
    assert m["skipped"] == 1 and m["stats-accepted"] == 3 and m["stats-missing"] == 1
    assert "update-sent" not in m
    for k, v in result.arrays.to_torch_state_dict().items():
        assert torch.equal(v, initial.to_torch_state_dict()[k])


def test_strategy__a_bad_model_or_an_empty_node_is_a_failed_reply_that_is_counted():
    class Flat(nn.Module):  # its output is not (N, d)
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)

        def forward(self, x):
            return self.conv(x)

    flat = Flat().double()
    with pytest.raises(RoundsSkipped) as e:
        DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=2).start(
            grid=_grid(2, model=lambda: Flat().double()), initial_arrays=ArrayRecord(
                flat.state_dict()), num_rounds=1)
    m = e.value.result.train_metrics_clientapp[1]
    assert m["skipped"] == 1 and m["stats-failed"] == 2
    _, initial = _initial()
    empty = {3: torch.zeros(0, 1, 8, 8, dtype=torch.float64)}
    result = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4).start(
        grid=_grid(samples=lambda n: empty.get(n, _samples(n))), initial_arrays=initial,
        num_rounds=1)
    m = result.train_metrics_clientapp[1]
    assert m["stats-failed"] == 1 and m["update-accepted"] == 3 and m["skipped"] == 0


def test_answer__refuses_a_message_that_is_not_the_strategys_and_an_update_without_its_model():
    _grid(1)  # a Message needs a run's identity, which the in-process grid stamps
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="not a message of dcco.flower.DCCOStrategy"):
        answer(Message(RecordDict(), dst_node_id=1, message_type="train"), context, UserCNN(),
               _samples(1))
    strategy = DCCOStrategy()
    msg = Message(RecordDict({"config": strategy.node_config("update", 3, {})}), dst_node_id=1,
                  message_type="train")
    with pytest.raises(ValueError, match="phase 'update' of round 3 needs the model"):
        answer(msg, context, UserCNN(), _samples(1))


def test_strategy__fedsc_rounds_equal_the_reference_round():
    model, initial = _initial()
    strategy = DCCOStrategy(method="fedsc", optimizer="sgd", lr=1.0, schedule="constant",
                            weight_decay=0.0, min_available_nodes=4)
    result = strategy.start(grid=_grid(), initial_arrays=initial, num_rounds=2)
    expected = _reference(model, strategy, "fedsc", 2, [1, 2, 3, 4])
    assert _rel(result.arrays.to_torch_state_dict(), expected) <= 1e-12
    assert result.train_metrics_clientapp[2]["stats-accepted"] == 4


def test_strategy__fedsc_cache_of_absent_nodes_equals_the_reference_rounds_with_it():
    """FedSC's partial participation in a user's app (``absent_statistics="cached"``): 3 of
    6 nodes a round, the strategy keeps every node's last statistics, and three rounds equal
    the reference rounds over the same nodes with the same cache (float64). Negative control:
    without the cache they differ. Refused where it cannot run."""
    import functools
    import random

    from dcco.core.statistics_cache import StatisticsCache

    def strategy(absent: str) -> DCCOStrategy:
        return DCCOStrategy(method="fedsc", optimizer="sgd", lr=0.1, schedule="constant",
                            weight_decay=0.0, fraction_train=0.5, min_train_nodes=3,
                            min_available_nodes=6, absent_statistics=absent)

    cached = strategy("cached")
    result = cached.start(grid=_grid(6), initial_arrays=_initial()[1], num_rounds=3)
    rng = random.Random(cached.seed)  # the strategy's sampling
    rounds = [sorted(rng.sample(range(1, 7), 3)) for _ in range(3)]
    assert set().union(*rounds[:2]) - set(rounds[2])  # a node seen before is absent later
    model = _initial()[0]
    cache = StatisticsCache()
    expected = _reference(model, cached, "fedsc", 3, rounds,
                          absent=lambda nodes: functools.partial(cache.merge_round, nodes))
    got = result.arrays.to_torch_state_dict()
    assert _rel(got, expected) <= 1e-12
    assert _rel(got, {k: v.detach() for k, v in _initial()[0].state_dict().items()}) > 1e-4
    assert sorted(cached.cache.last) == sorted(set().union(*rounds))
    assert all(result.train_metrics_clientapp[r]["stats-accepted"] == 3 for r in (1, 2, 3))
    dropped = strategy("drop").start(grid=_grid(6), initial_arrays=_initial()[1],
                                     num_rounds=3)
    assert _rel(dropped.arrays.to_torch_state_dict(), expected) > 1e-6
    with pytest.raises(ValueError, match="contrastive_fedavg shares none"):
        DCCOStrategy(method="contrastive_fedavg", absent_statistics="cached")
    with pytest.raises(ValueError, match="SecAgg\\+ shows the server only their sum"):
        DCCOStrategy(method="fedsc", absent_statistics="cached", secagg=_secagg())
    with pytest.raises(ValueError, match="'drop' or 'cached', got 'keep'"):
        DCCOStrategy(absent_statistics="keep")


def test_strategy__batch_norm_statistics_are_averaged_and_bad_settings_refused():
    class BN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.head = nn.Linear(4, 8)

        def forward(self, x):
            return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    start = BN().double()
    grid = _grid(model=lambda: BN().double(), samples=lambda n: _samples(n) + 3)
    result = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4).start(
        grid=grid, initial_arrays=ArrayRecord(start.state_dict()), num_rounds=2)
    state = result.arrays.to_torch_state_dict()
    assert float(state["bn.running_mean"].abs().max()) > 0.1  # moved towards the data
    assert torch.isfinite(state["bn.running_var"]).all()
    assert int(state["bn.num_batches_tracked"]) == 0  # integers stay as they are
    with pytest.raises(ValueError, match="trained names arrays .*typo"):
        DCCOStrategy(trained=["conv.weight", "typo"]).start(grid=grid, initial_arrays=ArrayRecord(
            start.state_dict()), num_rounds=1)
    with pytest.raises(ValueError, match="DCCOStrategy: optimizer must be"):
        DCCOStrategy(optimizer="lasr")
    with pytest.raises(ValueError, match="min_available_nodes"):
        DCCOStrategy(min_available_nodes=0)


def test_strategy__replies_of_nodes_not_asked_and_counts_that_change_are_left_out():
    def tamper(n: int, msg: Message, reply: Message) -> Message | None:
        if msg.content["config"]["phase"] != "update":
            return reply
        if n == 2:  # claims another node's id
            reply.metadata.__dict__["_src_node_id"] = 99
        if n == 3:  # an update of more samples than its statistics
            m = reply.content["metrics"]
            return Message(RecordDict({"arrays": reply.content.array_records["arrays"],
                                       "metrics": MetricRecord({"num-examples": 50,
                                                                "loss": m["loss"]})}),
                           reply_to=msg)
        return reply

    _, initial = _initial()
    result = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4).start(
        grid=_grid(tamper=tamper), initial_arrays=initial, num_rounds=1)
    m = result.train_metrics_clientapp[1]
    assert m["update-accepted"] == 2 and m["update-rejected-count"] == 1
    assert m["update-missing"] == 1  # node 2's reply came from a node not asked


# ---------------------------------------------------------------------- SecAgg+


def _secagg(**kw) -> SecAgg:
    calibration = torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(7),
                             dtype=torch.float64)
    return SecAgg(**({"model": UserCNN().double(), "samples": calibration,
                      "augment": _augment, "max_samples": max(SIZES)} | kw))


@pytest.mark.parametrize("method,aggregation", [
    ("dcco", "fedavg"), ("dvicreg", "fedavg"), ("dcco", "ldawa")])
def test_strategy_under_secagg__equals_the_plain_round_within_the_quantisation_bound(
        method, aggregation, monkeypatch):
    """Both exchanges through Flower's SecAgg+ (real masking and unmasking in the ClientApp's
    mod), one round with the user's model: S_A within ``secagg.error_bound`` of the plain
    merge (in the calibration frame), and the update within the bound of the plain update
    given that S_A (in units of the update scale), as dcco's own app is tested; quantised,
    so not exact. L-DAWA too: each node scales its own update, so the server's sum is its
    rule."""
    m = _secure_round(monkeypatch, (1, 2, 3, 4), method, aggregation)
    assert (m["stats-accepted"], m["update-accepted"], m["skipped"]) == (4, 4, 0)
    assert m["stats-clipped"] == 0 and m["update-clipped"] == 0
    assert m["num-examples"] == sum(SIZES)


def _secure_round(monkeypatch, nodes: tuple[int, ...], method: str = "dcco",
                  aggregation: str = "fedavg", tamper=None):
    """One SecAgg+ round of four nodes (``tamper`` sees their replies) under FedAvg's server
    (SGD at rate 1: the weights move by the average update itself), checked against the
    plain round of ``nodes`` (those the round should have summed): S_A within
    ``secagg.error_bound`` of their plain merge (in the calibration frame), and the update
    within the bound of their plain update given that S_A (in units of the update scale);
    returns round 1's metrics."""
    from dcco.api import aggregate_updates, local_update, merge_statistics, statistics
    from dcco.core.aggregation import ldawa_update
    from dcco.flower import secagg, secure_round

    seen = {}
    calibration, secure_moments = secure_round.calibration, secagg.secure_moments
    monkeypatch.setattr(secure_round, "calibration", lambda *a: seen.setdefault(
        "scales", calibration(*a)))
    monkeypatch.setattr(secagg, "secure_moments", lambda *a: seen.setdefault(
        "shared", secure_moments(*a)))
    model, initial = _initial()
    strategy = DCCOStrategy(method=method, optimizer="sgd", lr=1.0, weight_decay=0.0,
                            warmup_rounds=0, min_available_nodes=4, schedule="constant",
                            secagg=_secagg(), aggregation=aggregation)
    result = strategy.start(grid=_grid(tamper=tamper), initial_arrays=initial, num_rounds=1)
    m = result.train_metrics_clientapp[1]
    scales, spec = seen["scales"], strategy.method.stats
    sizes = [SIZES[n - 1] for n in nodes]
    bound = secagg.error_bound(max(SIZES), sizes, 64.0, 1 << 22, 64.0)
    seed = int(strategy.node_config("stats", 1, {})["views-seed"])
    views = {n: _views(_samples(n), _augment, seed, n, torch.float64) for n in nodes}
    plain = merge_statistics([statistics(model, *views[n], method) for n in views], 16,
                             method).aggregate
    for a, b in zip(*(secagg.standardise(x, scales, spec).tensors()
                      for x in (seen["shared"], plain)), strict=True):
        assert 0 < float((a - b).abs().max()) <= bound
    rule = ((lambda u: ldawa_update(u, dict(model.named_parameters())))
            if aggregation == "ldawa" else (lambda u: u))
    step = aggregate_updates([rule(local_update(model, *views[n], seen["shared"], method))
                              for n in views], model)
    start, got = initial.to_torch_state_dict(), result.arrays.to_torch_state_dict()
    worst = max(float((got[k] - start[k] + v).abs().max())
                for k, v in step.pseudo_gradient.items()) / scales.update
    assert 0 < worst <= bound
    assert m["loss"] == pytest.approx(step.loss, rel=1e-3)
    return m


def test_strategy_under_secagg__a_node_over_max_samples_fails_and_the_round_goes_on():
    _, initial = _initial()
    result = DCCOStrategy(optimizer="adam", lr=1e-2, min_available_nodes=4,
                          secagg=_secagg(max_samples=3)).start(grid=_grid(), initial_arrays=initial,
                                                       num_rounds=1)
    m = result.train_metrics_clientapp[1]
    # node 4 holds 5 samples: it refuses, SecAgg+ leaves it out, the others' round completes
    assert (m["stats-accepted"], m["stats-failed"], m["update-accepted"]) == (3, 1, 3)
    assert m["skipped"] == 0 and m["num-examples"] == sum(SIZES[:3])


def _lost_at(stage: str, node: int = 4, also: tuple[str, int] | None = None):
    """A tamper that answers ``node``'s SecAgg+ messages from ``stage`` on with Flower's
    error reply for a node it no longer reaches (unregistered or killed), and ``also``'s
    (stage, node) alike. The stages come in
    order (setup, share_keys, collect_masked_vectors, unmask), one message each, so the
    node's k-th message of an exchange is stage k (the mod has taken the stage's name out of
    the message by the time the tamper sees it)."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Stage

    lost_from = {node: Stage.all().index(stage)}
    if also is not None:  # another node, lost at another stage
        lost_from[also[1]] = Stage.all().index(also[0])
    count = dict.fromkeys(lost_from, 0)

    def tamper(n: int, msg: Message, reply: Message) -> Message:
        if n not in lost_from or RECORD_KEY_CONFIGS not in msg.content.config_records:
            return reply
        count[n] += 1
        if count[n] > lost_from[n]:
            return Message(Error(ErrorCode.NODE_UNAVAILABLE, "node lost"), reply_to=msg)
        return reply
    return tamper


@pytest.mark.parametrize("stage", ["setup", "share_keys", "collect_masked_vectors"])
def test_strategy_under_secagg__a_node_lost_at_any_stage_leaves_the_others_round(
        stage, monkeypatch):
    """A node lost in the middle of a SecAgg+ exchange, at any stage before the unmasking:
    the statistics exchange finishes with the other three, the lost node counted as failed,
    the update exchange asks the three alone, and the round is the plain round of them within
    SecAgg+'s quantisation bound. Lost at setup or while keys are shared, Flower 1.42's own
    workflow halts the exchange for every node (the control below); dcco's
    ``EarlyLossWorkflow`` does not."""
    m = _secure_round(monkeypatch, (1, 2, 3), tamper=_lost_at(stage))
    assert (m["stats-accepted"], m["stats-failed"], m["skipped"]) == (3, 1, 0)
    assert (m["update-accepted"], m["update-failed"]) == (3, 0)
    assert m["num-examples"] == sum(SIZES[:3])


def test_strategy_under_secagg__one_node_lost_at_setup_and_another_at_the_masked_vectors(
        monkeypatch):
    """Both kinds of loss in one exchange: node 4 never takes part (lost at setup), node 3
    is lost after the key sharing, so the unmasking must cancel node 3's pairwise masks with
    the survivors and nothing of node 4's. The round is the plain round of nodes 1 and 2
    within the quantisation bound."""
    m = _secure_round(monkeypatch, (1, 2), tamper=_lost_at(
        "setup", 4, also=("collect_masked_vectors", 3)))
    assert (m["stats-accepted"], m["stats-failed"], m["skipped"]) == (2, 2, 0)
    assert m["update-accepted"] == 2 and m["num-examples"] == sum(SIZES[:2])


def test_secagg_control__flowers_own_workflow_halts_when_a_node_is_lost_at_setup(
        monkeypatch):
    """The control for the test above: with Flower's ``SecAggPlusWorkflow`` as it is, a node
    lost at setup halts the statistics exchange for all four (the survivors have no share
    of the lost node's key to give at the unmasking), so the round is skipped."""
    from flwr.server.workflow import SecAggPlusWorkflow

    from dcco.flower import secagg
    from dcco.flower.strategy.round_steps import RoundsSkipped

    monkeypatch.setattr(secagg, "EarlyLossWorkflow", SecAggPlusWorkflow)
    _, initial = _initial()
    strategy = DCCOStrategy(optimizer="sgd", lr=1.0, min_available_nodes=4, secagg=_secagg())
    with pytest.raises(RoundsSkipped) as skipped:
        strategy.start(grid=_grid(tamper=_lost_at("setup")), initial_arrays=initial,
                       num_rounds=1)
    m = skipped.value.result.train_metrics_clientapp[1]
    assert m["skipped"] == 1 and m["stats-accepted"] == 0


def test_strategy_under_secagg__warns_once_of_an_exchange_a_lost_node_would_halt(
        monkeypatch, caplog):
    """An exchange of 2 nodes cannot survive one lost node under SecAgg+ (2 shares of each
    secret, 2 to recover it): the run warns once, naming the fix; an exchange of 3 can
    (3 shares, 2 recover), and is not warned."""
    from dcco.flower import secagg

    monkeypatch.setattr(secagg, "_WARNED", set())
    _, initial = _initial()
    said = {}
    for nodes in (2, 3):
        with caplog.at_level("WARNING", logger="flwr.dcco"):
            DCCOStrategy(optimizer="sgd", lr=1.0, min_available_nodes=nodes,
                         fraction_evaluate=0.0, secagg=_secagg()).start(
                grid=_grid(nodes), initial_arrays=initial, num_rounds=1)
        said[nodes] = [r.getMessage() for r in caplog.records
                       if "cannot survive" in r.getMessage()]
        caplog.clear()
    assert said[3] == [] and len(said[2]) == 1, said  # two exchanges, one warning
    assert said[2][0].startswith("SecAgg+ over 2 nodes (2 shares a secret, 2 recover it) "
                                 "cannot survive a lost node")
    # its advice fits it: at 2 nodes no threshold helps, only a third node
    assert said[2][0].endswith("sample more nodes a round (at least 3)")


def test_strategy_under_secagg__refuses_what_it_cannot_run():
    class BN(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(x)

    with pytest.raises(ValueError, match="does not average the model's floating buffers"):
        _secagg(model=BN())
    with pytest.raises(ValueError, match="at least 2 samples"):
        _secagg(samples=torch.zeros(1, 1, 8, 8))
    with pytest.raises(ValueError, match="SecAgg.quantization must be >= 2"):
        _secagg(quantization=1)
    with pytest.raises(ValueError, match="at least 2 nodes an exchange"):
        DCCOStrategy(min_train_nodes=1, secagg=_secagg())
    with pytest.raises(ValueError, match="leave trained=None"):
        DCCOStrategy(trained=["conv.weight"], secagg=_secagg())


def test_example_flower_app__trains_under_secagg_in_process(tmp_path):
    """examples/flower-app with ``secagg = true``: its own ServerApp and ClientApp (the mod
    included) on 4 nodes in this process, two rounds through SecAgg+."""
    import tomllib

    project = ROOT / "examples" / "flower-app"
    sys.path.insert(0, str(project))
    try:
        from dcco_flower_example import client_app, server_app
    finally:
        sys.path.remove(str(project))
    config = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"] | {"secagg": True, "num-server-rounds": 2, "out": str(tmp_path)}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    grid = InProcessGrid(client_app.app, nodes, config)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=config))
    rounds = json.loads((tmp_path / "rounds.json").read_text())
    for r in ("1", "2"):
        m = rounds[r]
        assert (m["stats-accepted"], m["update-accepted"], m["skipped"]) == (2, 2, 0)
        assert m["update-clipped"] == 0 and math.isfinite(m["loss"])


def test_strategy__flowers_own_hooks_give_starts_round_for_a_fedavg_method():
    """``configure_train`` then ``aggregate_train`` (Flower's own loop) give the round that
    ``start`` runs, through the same checks (``dcco.flower.exchanges``)."""
    from flwr.app import ConfigRecord

    _, initial = _initial()
    kw = {"method": "contrastive_fedavg", "optimizer": "adam", "lr": 1e-3,
          "min_available_nodes": 4}
    expected = DCCOStrategy(**kw).start(grid=_grid(), initial_arrays=initial, num_rounds=1)
    strategy, grid = DCCOStrategy(**kw), _grid()
    strategy.begin(initial, num_rounds=1)  # what start sets before its first round
    messages = list(strategy.configure_train(1, initial, ConfigRecord(), grid))
    arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert _rel(arrays.to_torch_state_dict(), expected.arrays.to_torch_state_dict()) <= 1e-12
    assert metrics["update-accepted"] == 3 and metrics["update-failed"] == 1


@pytest.mark.slow
def test_strategy_in_flowers_simulation__equals_the_reference_rounds_plain_and_secure():
    """The strategy's rounds in Flower's own simulation engine (``run_simulation``: Ray, 4
    virtual nodes) with a model of the test's own, two runs in one simulation (one start of
    Ray): DCCO with plain messages, equal to dcco's reference rounds in float64 (to 1e-7:
    float64 rounding, amplified over two rounds), then VICReg from statistics under SecAgg+,
    close to them (SecAgg+ quantises), the ClientApp's masking running in Ray's actors. The
    ClientApp is defined here, so that Ray carries it to its actors by value."""
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    class Own(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 5, 3, padding=1)
            self.norm = nn.GroupNorm(1, 5)
            self.head = nn.Linear(5, 12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.norm(self.conv(x))).mean((2, 3)))

    def samples(node: int) -> torch.Tensor:  # by Flower's node id: the server knows them
        gen = torch.Generator().manual_seed(node % (1 << 31))
        return torch.rand(2 + node % 4, 1, 6, 6, generator=gen, dtype=torch.float64)

    def augment(x: torch.Tensor) -> torch.Tensor:
        return x + 0.1 * torch.randn(x.shape, dtype=x.dtype)

    client = ClientApp()

    @client.train(mods=[secure_aggregation_mod])
    def train(msg: Message, context: Context) -> Message:
        return answer(msg, context, Own().double(), samples(context.node_id), augment=augment)

    torch.manual_seed(0)
    model = Own().double()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    initial = ArrayRecord(model.state_dict())
    del model
    common = {"min_available_nodes": 4, "fraction_evaluate": 0.0}  # no @app.evaluate here
    # plain: the in-process test's server (LARS, a step of bounded length, so two rounds
    # stay well conditioned); SecAgg+: FedAvg's (SGD at rate 1), the weights moving by the
    # average update itself
    runs = {
        "plain": (2, {"method": "dcco", "optimizer": "lars", "lr": 0.5, "warmup_rounds": 1}
                  | common),
        "secure": (1, {"method": "dvicreg", "optimizer": "sgd", "lr": 1.0,
                       "weight_decay": 0.0, "schedule": "constant"} | common
                   | {"secagg": SecAgg(Own().double(), torch.rand(
                       12, 1, 6, 6, generator=torch.Generator().manual_seed(7),
                       dtype=torch.float64), max_samples=5, augment=augment)}),
    }
    out: dict = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for name, (rounds, kw) in runs.items():
            out[name] = DCCOStrategy(**kw).start(grid=grid, initial_arrays=initial,
                                                 num_rounds=rounds)
        out["nodes"] = sorted(grid.get_node_ids())  # all 4 took part in every round

    run_simulation(server_app=server, client_app=client, num_supernodes=4,
                   backend_config={"client_resources": {"num_cpus": 1}})
    nodes = out["nodes"]
    assert len(nodes) == 4
    for name, (rounds, kw) in runs.items():
        result = out[name]
        for r in range(1, rounds + 1):
            m = result.train_metrics_clientapp[r]
            assert (m["stats-accepted"], m["update-accepted"], m["skipped"]) == (4, 4, 0)
            assert m["num-examples"] == sum(len(samples(n)) for n in nodes)
        fresh = Own().double()  # _reference trains the model it is given
        fresh.load_state_dict(start)
        expected = _reference(fresh, DCCOStrategy(**kw | {"secagg": None}), kw["method"], rounds,
                              nodes, samples, augment)
        got = result.arrays.to_torch_state_dict()
        if name == "secure":  # quantised, in the frame of the calibration step
            step = {k: expected[k] - start[k] for k in expected}
            error = _rel({k: got[k] - start[k] for k in expected}, step)
            assert 0 < error <= 1e-3, error
        else:  # the weights, as the in-process test compares them; Ray's actors compute
            # the encoders in processes of their own (their threads' order of summation),
            # and the nodes' ids, so their samples, change from run to run: float64
            # rounding, 2e-13 to 5e-13 after one round, is amplified by the second round's
            # LARS trust ratios to between 4e-12 and 2e-9 (measured over runs); 1e-7 leaves
            # that room, 10⁴ below the 1e-3 the SecAgg+ case allows for its quantisation
            assert _rel(got, expected) <= 1e-7, _rel(got, expected)


def test_strategy__federated_evaluation_runs_the_users_evaluate_and_fills_the_result():
    """DCCO takes FedAvg's evaluation arguments: after each round the sampled nodes'
    ``@app.evaluate`` gets the new model and the config, and its metrics, weighted by
    ``num-examples``, reach ``Result.evaluate_metrics_clientapp``; before round 1 the
    initial model is evaluated so (round 0, the baseline)."""
    _, initial = _initial()
    strategy = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4, fraction_evaluate=0.5,
                            min_evaluate_nodes=2)
    result = strategy.start(grid=_grid(), initial_arrays=initial, num_rounds=2,
                            evaluate_config=ConfigRecord({"batch": 4}))
    assert sorted(result.evaluate_metrics_clientapp) == [0, 1, 2]
    for r in (0, 1, 2):
        assert result.evaluate_metrics_clientapp[r]["round"] == r
        assert math.isfinite(result.evaluate_metrics_clientapp[r]["mean"])
    none = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=4, fraction_evaluate=0.0)
    assert not none.start(grid=_grid(), initial_arrays=initial,
                          num_rounds=1).evaluate_metrics_clientapp
    with pytest.raises(ValueError, match="train_metrics_aggr_fn: DCCO's training metrics"):
        DCCOStrategy(train_metrics_aggr_fn=lambda records, key: None)
    with pytest.raises(ValueError, match="weighted_by_key = 'n'.*sample count"):
        DCCOStrategy(weighted_by_key="n")



def test_strategy__an_app_without_evaluate_is_said_once_and_asked_no_more(caplog):
    """A ClientApp that only trains, under DCCO's (FedAvg's) default ``fraction_evaluate =
    1``: the first round's evaluation fails on every node with Flower's "no evaluate
    function"; that is logged once, with what to change, and no later round asks again. The
    training itself is untouched."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return answer(msg, context, UserCNN().double(), _samples(context.node_id),
                      augment=_augment)

    asked = []

    def count(node, msg, reply):
        asked.append(msg.metadata.message_type)
        return reply

    _, initial = _initial()
    grid = InProcessGrid(app, [{}] * 3, {}, count)
    with caplog.at_level("WARNING", logger="flwr.dcco"):
        result = DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=3).start(
            grid=grid, initial_arrays=initial, num_rounds=3)
    assert asked.count(MessageType.EVALUATE) == 3  # round 1's three nodes, then none
    assert asked.count(MessageType.TRAIN) == 3 * 3 * 2  # both phases of every round
    assert not result.evaluate_metrics_clientapp
    assert caplog.text.count("has no @app.evaluate") == 1
    assert "DCCOStrategy(fraction_evaluate=0.0)" in caplog.text
    assert "evaluation: node" not in caplog.text  # one line, not one a node
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]

def test_strategy__failed_nodes_are_named_and_an_app_without_answer_is_recognised(caplog):
    """A ClientApp still on FedAvg's train handler (it loads DCCO's packed arrays as its
    state_dict): every node's error is logged, the skipped round says why and what to
    change, and a run with every round skipped ends in an error, not a saved model."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:  # FedAvg's handler, not answer()
        model = UserCNN().double()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict())}), reply_to=msg)

    _, initial = _initial()
    grid = InProcessGrid(app, [{}] * 3, {})
    with caplog.at_level("WARNING", logger="flwr.dcco"), \
            pytest.raises(RoundsSkipped, match="every one of the 2 rounds was skipped"):
        DCCOStrategy(optimizer="adam", lr=1e-3, min_available_nodes=3, fraction_evaluate=0.0).start(
            grid=grid, initial_arrays=initial, num_rounds=2)
    text = caplog.text
    assert "DCCO round 1, stats: 3 nodes failed alike (1, 2, 3): RuntimeError: Error(s) in " \
           "loading state_dict for UserCNN" in text
    assert "skipped, the model unchanged: stats: 0 valid replies" in text
    assert "does not answer with dcco.flower.answer" in text
    with pytest.raises(ValueError, match="num_rounds must be an integer >= 1, got 0"):
        DCCOStrategy().start(grid=_grid(), initial_arrays=initial, num_rounds=0)
    with pytest.raises(ValueError, match=r"train_config\['lr'\] = 0.01.*DCCOStrategy\(lr="):
        DCCOStrategy().start(grid=_grid(), initial_arrays=initial, num_rounds=1,
                     train_config=ConfigRecord({"lr": 0.01}))


def test_strategy__nodes_failing_alike_stop_the_run_after_two_rounds_with_their_error(caplog):
    """Every node raises the same error (a fault in the nodes' code or data): the skipped
    rounds' message names it once with its count of nodes, the nodes failing alike are one
    warning a round with their count, and the run stops after round 2 of 6 with
    RoundsSkipped."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        images = _samples(context.node_id).permute(0, 2, 3, 1)  # channels last: refused
        return answer(msg, context, UserCNN().double(), images, augment=_augment)

    _, initial = _initial()
    with caplog.at_level("WARNING", logger="flwr.dcco"), \
            pytest.raises(RoundsSkipped, match="rounds 1 and 2 failed on every node with the "
                                               "same error, which each of the 4 rounds left "
                                               "would meet too") as e:
        DCCOStrategy(min_available_nodes=3, fraction_evaluate=0.0).start(
            grid=InProcessGrid(app, [{}] * 3, {}), initial_arrays=initial, num_rounds=6)
    assert sorted(e.value.result.train_metrics_clientapp) == [1, 2]
    assert "the nodes' errors: dcco.errors.ArgumentError: answer: samples: node " in str(e.value)
    assert "look channels-last (N, H, W, C): pass x.permute(0, 3, 1, 2)" in str(e.value)
    assert "(3 nodes)" in str(e.value)
    warnings = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()
                and "skipped" not in r.getMessage()]
    assert len(warnings) == 2 and all("3 nodes failed alike (1, 2, 3): dcco.errors.ArgumentError: "
                                      "answer: samples: node 1's model cannot read its views"
                                      in w and "\n" not in w
                                      for w in warnings), warnings


@pytest.mark.slow
def test_strategy_in_flowers_simulation__a_nodes_fault_is_named_in_one_line(caplog):
    """Four faults of a user's ClientApp in Flower's own simulation engine (Ray, whose
    error replies carry the node's traceback wrapped twice, in colour): the node's code
    raising, FedAvg's handler loading DCCO's arrays as a state_dict, samples holding NaN
    and channels-last samples. Each run stops with RoundsSkipped naming the real cause
    with its count of nodes (and, for FedAvg's handler, what to change), and every warning
    is one line. The ClientApp is defined here, so that Ray carries it to its actors."""
    import logging

    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    class Own(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.head = nn.Linear(4, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.conv(x)).mean((2, 3)))

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        kind = msg.content.config_records["config"]["kind"]
        x = torch.rand(3, 1, 6, 6, dtype=torch.float64)
        if kind == "raise":
            raise FileNotFoundError(f"/data/photos-{context.node_id}.npz")
        if kind == "fedavg":  # FedAvg's handler, not answer()
            model = Own().double()
            model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
            return Message(RecordDict({"arrays": ArrayRecord(model.state_dict())}),
                           reply_to=msg)
        if kind == "nan":
            x[0, 0, 0, 0] = float("nan")
        if kind == "last":
            x = x.permute(0, 2, 3, 1)
        return answer(msg, context, Own().double(), x,
                      augment=lambda v: v + 0.1 * torch.randn(v.shape, dtype=v.dtype))

    initial = ArrayRecord(Own().double().state_dict())
    kinds = ("raise", "fedavg", "nan", "last")
    out: dict[str, str] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for kind in kinds:
            try:
                DCCOStrategy(min_available_nodes=2, fraction_evaluate=0.0).start(
                    grid=grid, initial_arrays=initial, num_rounds=4,
                    train_config=ConfigRecord({"kind": kind}))
            except RoundsSkipped as e:
                out[kind] = str(e)

    logs: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logs.append(record.getMessage())
    logging.getLogger("flwr.dcco").addHandler(handler)
    try:
        run_simulation(server_app=server, client_app=client, num_supernodes=2,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        logging.getLogger("flwr.dcco").removeHandler(handler)
    assert sorted(out) == sorted(kinds), out
    causes = {"raise": "FileNotFoundError: /data/photos-",
              "fedavg": "RuntimeError: Error(s) in loading state_dict for Own",
              "nan": "NaN",
              "last": "look channels-last (N, H, W, C): pass x.permute(0, 3, 1, 2)"}
    for kind, cause in causes.items():
        assert "rounds 1 and 2 failed on every node with the same error" in out[kind], out[kind]
        assert cause in out[kind] and "(2 nodes)" in out[kind], (kind, out[kind])
        assert "ray::" not in out[kind] and "\x1b[" not in out[kind], out[kind]
    assert "does not answer with dcco.flower.answer" in out["fedavg"]
    dcco_logs = [line for line in logs if line.startswith("DCCO round")]
    assert dcco_logs and all("\n" not in line for line in dcco_logs), dcco_logs
    assert any("2 nodes failed alike" in line for line in dcco_logs), dcco_logs


RAY_REASON = (  # an error reply's reason under Flower 1.42's simulation engine (Ray), cut
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor"
    ".run()\x1b[39m (pid=31067, ip=192.0.2.2, actor_id=44d4, repr=<flwr.simulation.ray_"
    "transport.ray_actor.ClientAppActor object at 0x7f16>)\n  File \"/f/client_app.py\", "
    "line 161, in __call__\n    return self._registered_funcs[full_name](message, context)"
    "\n  File \"/t/sim.py\", line 26, in train\n    net.load_state_dict(arrays)\n"
    "RuntimeError: Error(s) in loading state_dict for Own:\n\tMissing key(s) in state_dict: "
    "\"conv.weight\". \n\tUnexpected key(s) in state_dict: \"layout\", \"packed.<f4\".\n\n"
    "The above exception was the direct cause of the following exception:\n\n\x1b[36mray::"
    "ClientAppActor.run()\x1b[39m (pid=31067)\n           ^^^^^^^^^\n  File \"/f/ray_actor.py"
    "\", line 65, in run\n    raise ClientAppException(str(ex)) from ex\nflwr.clientapp."
    "client_app.ClientAppException: \nException ClientAppException occurred. Message: Error(s)"
    " in loading state_dict for Own:\n\tMissing key(s) in state_dict: \"conv.weight\". \n\t"
    "Unexpected key(s) in state_dict: \"layout\", \"packed.<f4\".'>")


def test_error_line__the_cause_out_of_rays_and_a_deployments_wrapping():
    """A node's error reply in one line, as its code raised it: out of Ray's chained
    tracebacks (the handler's exception, its message's lines joined, not Flower's wrapper's
    empty line), out of a deployment's ``<class ...>:<'...'>``, a plain traceback's last
    exception, a one-line report as it is, and a long message cut."""
    from dcco.flower.error_reports import MAX_CHARS, error_line

    assert error_line(RAY_REASON) == (
        "RuntimeError: Error(s) in loading state_dict for Own: Missing key(s) in state_dict: "
        "\"conv.weight\". Unexpected key(s) in state_dict: \"layout\", \"packed.<f4\". "
        "(from a report of 17 lines, logged whole at DEBUG)")
    assert error_line("<class 'ValueError'>:<'images are channels-last'>") == \
        "ValueError: images are channels-last"
    assert error_line("<class 'torch.OutOfMemoryError'>:<''>") == "torch.OutOfMemoryError"
    wrapped_only = RAY_REASON.split("The above exception")[1]  # no handler's traceback left
    assert error_line("<class 'x.RayTaskError(ClientAppException)'>:<'" + wrapped_only) \
        .startswith("Error(s) in loading state_dict for Own: Missing key(s)")
    report = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
              "    f()\nValueError: channels last\n")
    assert error_line(report) == "ValueError: channels last (from a report of 4 lines, " \
        "logged whole at DEBUG)"
    assert error_line("one line") == "one line"
    assert len(error_line("<class 'ValueError'>:<'" + "x" * 1000 + "'>")) == MAX_CHARS


def test_problem_lines__nodes_failing_alike_are_one_line_with_their_count():
    from dcco.flower.failures import problem_lines

    problems = [f"node {n} failed: ValueError: node {n}'s samples holds NaN" for n in range(5)]
    problems[2:2] = ["node 9: no reply within the timeout", "node 7 failed: OSError: disk"]
    assert problem_lines(problems) == [
        "5 nodes failed alike (0, 1, 2, ...): ValueError: node 0's samples holds NaN",
        "node 9: no reply within the timeout", "node 7 failed: OSError: disk"]


def test_answer__takes_a_dataloader_or_a_dataset_and_refuses_identical_views():
    """A node's samples as its FedAvg handler has them: a DataLoader of (input, label)
    batches or of dicts (Flower's quickstart), or a Dataset, give the same round as the
    tensor; samples that are not images without an augmentation are refused."""
    from torch.utils.data import DataLoader, TensorDataset

    from dcco.flower.userapp import node_samples

    _grid()  # sets Flower's process-wide task identity, which a Message needs
    x = _samples(4)
    labels = torch.arange(len(x))
    pairs = DataLoader(TensorDataset(x, labels), batch_size=2)
    dicts = DataLoader([{"img": a, "label": b} for a, b in zip(x, labels, strict=True)],
                       batch_size=3)
    for given in (pairs, dicts, TensorDataset(x, labels)):
        assert torch.equal(node_samples(given), x)
    strategy, model = DCCOStrategy(optimizer="adam", lr=1e-3), UserCNN().double()
    msg = Message(RecordDict({"config": strategy.node_config("stats", 1, {}),
                              "arrays": codec.array_record(model.state_dict())}),
                  dst_node_id=1, message_type="train")

    def reply(samples):
        context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                          run_config={})
        out = answer(msg, context, UserCNN().double(), samples, augment=_augment)
        return codec.tensors_of(out.content.array_records["statistics"])

    torch.manual_seed(0)
    want = reply(x)
    for given in (pairs, TensorDataset(x, labels)):
        torch.manual_seed(0)
        got = reply(given)
        assert all(torch.equal(got[k], want[k]) for k in want)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    linear = nn.Linear(5, 3)
    vectors = Message(RecordDict({"config": strategy.node_config("stats", 1, {}),
                                  "arrays": codec.array_record(linear.state_dict())}),
                      dst_node_id=1, message_type="train")
    with pytest.raises(ValueError, match="identical views teach the encoder nothing"):
        answer(vectors, context, linear, torch.randn(4, 5))
    poisoned = x.clone()
    poisoned[2, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="node 1's samples holds NaN in sample 2: training"):
        reply(DataLoader(TensorDataset(poisoned, labels), batch_size=2))


def test_strategy__a_stopped_run_resumes_from_its_checkpoint_to_the_same_model(tmp_path):
    """``checkpoint=``: the model, the server optimiser and the node sampling after every
    round; a second ``start`` after three of five rounds ends where one run of five does."""
    _, initial = _initial()
    kw = {"optimizer": "adam", "lr": 1e-2, "min_available_nodes": 4, "fraction_train": 0.5,
          "fraction_evaluate": 0.5}
    whole = DCCOStrategy(**kw).start(grid=_grid(), initial_arrays=initial, num_rounds=5)
    path = tmp_path / "strategy.pt"
    first = DCCOStrategy(**kw, checkpoint=path)
    grid = _grid()
    original = first.rounds.run

    def stop_after_three(grid, r, nodes, config, timeout):
        if r == 4:
            raise KeyboardInterrupt  # the ServerApp stopped
        return original(grid, r, nodes, config, timeout)

    first.rounds.run = stop_after_three
    with pytest.raises(KeyboardInterrupt):
        first.start(grid=grid, initial_arrays=initial, num_rounds=5)
    assert torch.load(path, weights_only=True)["round"] == 3
    resumed = DCCOStrategy(**kw, checkpoint=path).start(grid=grid, initial_arrays=initial,
                                                        num_rounds=5)
    assert _rel(resumed.arrays.to_torch_state_dict(), whole.arrays.to_torch_state_dict()) \
        <= 1e-12
    assert sorted(resumed.train_metrics_clientapp) == [1, 2, 3, 4, 5]
    assert resumed.train_metrics_clientapp[5]["loss"] == pytest.approx(
        whole.train_metrics_clientapp[5]["loss"], rel=1e-12)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert "states_key" in torch.load(path, weights_only=True)
    with pytest.raises(ValueError, match="junk.pt is not a DCCO strategy checkpoint"):
        DCCOStrategy(**kw, checkpoint=tmp_path / "junk.pt").start(grid=grid,
                                                                   initial_arrays=initial)


def test_strategy__a_resumed_fedema_run_gets_each_nodes_state_back_from_its_disk(
        tmp_path, monkeypatch):
    """``answer(state_dir=...)``: a FedEMA node keeps its state in files on its own disk,
    under the run's key (in the strategy's checkpoint), so a run stopped after its nodes
    trained round 4 of 5, before round 4's checkpoint, and resumed from round 3's with new
    nodes' contexts (a new Flower run) ends where one run of five does, its nodes' states of
    round 4 from before the stop left unread; with the state in ``context.state`` the
    resumed nodes start afresh and it does not."""
    from dcco.flower.strategy import strategy_run as strategy_module
    kw = {"method": "fedema", "optimizer": "lars", "lr": 0.5, "min_available_nodes": 4,
          "fraction_train": 0.5, "fraction_evaluate": 0.0, "loss": {"target_decay": 0.9}}
    initial = ArrayRecord(_headed("fedema").state_dict())

    def grid(state_dir: Path | None) -> InProcessGrid:
        return _grid(model=lambda: _headed("fedema"), samples=_two_or_more, state_dir=state_dir)

    whole = DCCOStrategy(**kw).start(grid=grid(None), initial_arrays=initial, num_rounds=5)
    finals = {}
    for name, folder in (("disk", tmp_path / "nodes"), ("context", None)):
        path = tmp_path / f"{name}.pt"
        original = strategy_module.save_strategy

        def stop_at_four(path, r, *args, original=original):
            if r == 4:
                raise KeyboardInterrupt  # the ServerApp stopped before round 4's checkpoint
            return original(path, r, *args)

        monkeypatch.setattr(strategy_module, "save_strategy", stop_at_four)
        with pytest.raises(KeyboardInterrupt):
            DCCOStrategy(**kw, checkpoint=path).start(grid=grid(folder), initial_arrays=initial,
                                                      num_rounds=5)
        monkeypatch.setattr(strategy_module, "save_strategy", original)
        assert torch.load(path, weights_only=True)["round"] == 3
        resumed = DCCOStrategy(**kw, checkpoint=path).start(
            grid=grid(folder), initial_arrays=initial, num_rounds=5)
        finals[name] = resumed.arrays.to_torch_state_dict()
    expected = whole.arrays.to_torch_state_dict()
    assert all(torch.equal(finals["disk"][k], expected[k]) for k in expected)
    assert _rel(finals["context"], expected) > 1e-6
    key = torch.load(tmp_path / "disk.pt", weights_only=True)["states_key"]
    files = sorted(p.relative_to(tmp_path / "nodes") for p in
                   (tmp_path / "nodes").rglob("*.safetensors"))
    assert files and {p.parts[1] for p in files} == {key}  # node/key/0.r<round>
    assert any(p.name == "0.r4.safetensors" for p in files)  # the last round's (0-based)


def test_strategy__its_old_name_warns_on_every_path_and_names_the_caller() -> None:
    """``DCCO`` names the method; the strategy's old alias, as the docs showed it
    (``dcco.flower.DCCO``), is ``DCCOStrategy`` with a ``DeprecationWarning`` pointing at
    this file; the path no page showed (``dcco.flower.strategy.DCCO``) is gone."""
    import importlib

    with pytest.warns(DeprecationWarning, match="dcco.flower.DCCO is now dcco.flower.DCCOStrategy"
                      ) as caught:
        alias = importlib.import_module("dcco.flower").DCCO
    assert alias is DCCOStrategy
    assert caught[0].filename == __file__
    with pytest.raises(AttributeError, match="has no attribute 'DCCO'"):
        importlib.import_module("dcco.flower.strategy").DCCO  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'DCO'"):
        importlib.import_module("dcco.flower.strategy").DCO  # noqa: B018


def test_strategy__takes_fedavgs_arguments_in_its_order_and_its_own_by_keyword():
    """A ServerApp swaps ``FedAvg(...)`` for ``DCCOStrategy(...)`` in one line: FedAvg's ten
    arguments come first, in its order with its defaults; dcco's own are keyword-only, each
    documented in the numpy-style docstring."""
    import inspect

    from flwr.serverapp.strategy import FedAvg

    ours = list(inspect.signature(DCCOStrategy).parameters.values())
    theirs = list(inspect.signature(FedAvg).parameters.values())
    assert [(p.name, p.default) for p in ours[:len(theirs)]] == [
        (p.name, p.default) for p in theirs]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs):])
    assert all(f"\n    {p.name} : " in DCCOStrategy.__doc__ for p in ours)
    with pytest.raises(TypeError, match="positional"):
        DCCOStrategy(1.0, 0.0, 2, 2, 2, "num-examples", "arrays", "config", None, None, "dcco")


def test_forward_cache__one_forward_a_node_within_its_bound_by_its_eviction_rule():
    """``answer``'s kept forwards (``dcco.flower.forward_cache.ForwardCache``): a node's new
    round replaces its last; a forward over the bound alone is not kept; past the bound the
    oldest goes first, or the largest with ``evict="largest"``; bad settings are refused."""
    from types import SimpleNamespace

    from dcco.flower.forward_cache import ForwardCache

    x = torch.zeros(1)

    def kept(size):
        return SimpleNamespace(saved_bytes=size)

    cache = ForwardCache(max_bytes=100)
    cache.put((1, 0, 1, 5), kept(30), x, x)
    cache.put((1, 0, 2, 5), kept(40), x, x)  # node 1's next round: its last only
    assert cache.keys() == [(1, 0, 2, 5)] and cache.saved_bytes == 40
    cache.put((2, 0, 2, 5), kept(101), x, x)  # alone over the bound
    assert cache.keys() == [(1, 0, 2, 5)]
    cache.put((3, 0, 2, 5), kept(50), x, x)
    cache.put((4, 0, 2, 5), kept(20), x, x)  # 110 > 100: the oldest (node 1) goes
    assert cache.keys() == [(3, 0, 2, 5), (4, 0, 2, 5)] and cache.saved_bytes == 70
    assert cache.pop((3, 0, 2, 5))[0].saved_bytes == 50 and cache.pop((3, 0, 2, 5)) is None
    largest = ForwardCache(max_bytes=100, evict="largest")
    for node, size in ((1, 20), (2, 60), (3, 30)):
        largest.put((node, 0, 1, 5), kept(size), x, x)
    assert largest.keys() == [(1, 0, 1, 5), (3, 0, 1, 5)]  # node 2's 60 went, not node 1's
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        ForwardCache(max_bytes=-1)
    with pytest.raises(ValueError, match="evict must be one of oldest, largest"):
        ForwardCache(evict="newest")

