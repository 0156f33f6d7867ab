"""A Flower round's exchanges, written once: dcco's own ServerApp (``dcco.flower.app.federation``)
and the public strategy (``dcco.flower.DCCOStrategy``) run the same round.

The round is ``Algorithm.round`` (fresh or stale statistics, S_A, the clients' updates,
their combination, differential privacy's noise). These executors carry out its two steps
over Flower messages:

- ``PlainExchanges``: a ``train`` message to each node an exchange; every reply is checked
  (``dcco.core.server``) and a bad one left out and counted; the update exchange goes to the nodes
  whose statistics were valid, and an update must be of as many samples as its node's
  statistics; a phase with fewer than ``min_survivors`` valid replies skips the round
  (``RoundSkipped``);
- ``SecureExchanges``: both exchanges through Flower's SecAgg+ (``dcco.flower.secagg``), the
  server seeing only the averages, checked as averages.

What differs between dcco's app and the strategy is only how their messages are written and
their replies read, a ``Wire``: dcco's app's instruction codec, whose nodes each host several
of the run's clients (``dcco.flower.app.wire.AppWire``), and the records a user's ClientApp
answers with ``dcco.flower.answer``, one client a node (``dcco.flower.userwire.UserWire``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
import torch
from flwr.app import Message, MessageType, RecordDict
from torch import Tensor

from dcco.core.algorithm import Absent, Algorithm, RoundSkipped, Updates
from dcco.core.client import ClientUpdate
from dcco.core.server import ReplyError, ReplyTally, accept_valid, pooled_update, skip_reason
from dcco.core.statistics_cache import StatisticsCache
from dcco.core.stats import EncodingStats, Moments, StatsSpec, merge
from dcco.flower import secagg, timing
from dcco.flower.appconfig import FlowerConfig
from dcco.flower.codec import Instruction
from dcco.flower.error_reports import error_line

LOG = logging.getLogger("flwr.dcco")

Send = Callable[..., Iterable[Message]]
"""``send(messages, timeout=seconds)``: push messages and return their replies that came
within the timeout (a grid's ``send_and_receive``, or ``dcco.flower.polling``'s)."""


class Wire(Protocol):
    """One round's messages and the checks of their replies, in a layout of its own."""

    def stats_message(self, clients: list[int]) -> RecordDict:
        """Exchange 1's message to a node hosting ``clients``: the model, "send statistics"."""
        ...

    def update_message(self, clients: list[int], model: bool, shared: Moments | None,
                       with_stats: bool) -> RecordDict:
        """The update exchange's message: S_A (``shared``), the model when the node does not
        hold it from exchange 1 (``model``), and whether to send statistics with the update
        (stale mode)."""
        ...

    def instruction(self, phase: str, clients: list[int], model: bool,
                    shared: Moments | None = None, with_stats: bool = False) -> Instruction:
        """The same as a SecAgg+ instruction (``dcco.flower.secagg.secure_instruction``)."""
        ...

    def stats_check(self, contents: list[RecordDict], spec: StatsSpec
                    ) -> Callable[[RecordDict], EncodingStats]:
        """The check of one statistics reply (raises ``ReplyError``), given all of them."""
        ...

    def update_check(self, contents: list[RecordDict], with_stats: StatsSpec | None
                     ) -> Callable[[RecordDict], tuple[ClientUpdate, EncodingStats | None]]:
        """The check of one update reply, given all of them: its update, and its statistics
        when ``with_stats``."""
        ...

    def each_stats_check(self, contents: list[RecordDict], spec: StatsSpec
                         ) -> Callable[[RecordDict, int], list[EncodingStats]]:
        """The check of one reply of each client's statistics, given all of them and how
        many clients its node answers for (``PlainExchanges.each_statistics``)."""
        ...

    def params(self) -> dict[str, Tensor]:
        """The trained parameters by name, in order: the update's names, shapes, dtypes."""
        ...


def replies_by_node(replies: Iterable[Message], asked: set[int],
                    tally: ReplyTally) -> dict[int, RecordDict]:
    """The contents of the replies without an error, by node in the order of the node ids (so
    that what is merged from them is summed in one order, whatever order they arrived in),
    counted in ``tally``: a reply of a node not asked, or a node's second, is left out; an
    asked node without a reply is ``missing``, one with an error reply ``failed``."""
    got: dict[int, RecordDict] = {}
    failed: set[int] = set()
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in asked or node in got or node in failed:
            continue
        if reply.has_error():
            failed.add(node)
            LOG.debug("node %d's error, whole: %s", node, reply.error.reason)
            tally.problems.append(f"node {node} failed: {error_line(reply.error.reason)}")
        else:
            got[node] = reply.content
    tally.failed += len(failed)
    tally.missing += len(asked) - len(got) - len(failed)
    tally.problems += [f"node {n}: no reply within the timeout"
                       for n in sorted(asked - set(got) - failed)]
    return dict(sorted(got.items()))


def exchange(send: Send, r: int, contents: dict[int, RecordDict], timeout: float,
             tally: ReplyTally) -> dict[int, RecordDict]:
    """One exchange of ``train`` messages (node id → content) in round ``r`` (0-based or not:
    it names the messages' group): the valid-looking replies' contents by node."""
    messages = [Message(c, dst_node_id=n, message_type=MessageType.TRAIN, group_id=str(r))
                for n, c in contents.items()]
    tally.sent += len(messages)
    sent = time.time()
    got = replies_by_node(send(messages, timeout=timeout), set(contents), tally)
    timing.record("exchange", round=r, sent=sent, received=time.time(), nodes=len(got))
    return got


class PlainExchanges:
    """``Algorithm.round``'s two steps as exchanges of plain messages. A node merges its
    clients' statistics (``statistics``), except under FedSC's cache of absent clients
    (``each_statistics``), where it sends each client's own.

    Args:
        send: the grid's exchange (replies within a timeout).
        wire: the messages' layout and the replies' checks.
        r: the round (names the messages' group). timeout: seconds an exchange waits.
        targets: node id → the clients it hosts this round.
        min_survivors: the fewest valid replies a phase needs, or the round is skipped.
        on_replies: called with (asked, answered) node ids after every exchange (dcco's app
            tracks nodes that stopped answering).
    """

    def __init__(self, send: Send, wire: Wire, r: int, timeout: float,
                 targets: dict[int, list[int]], min_survivors: int,
                 on_replies: Callable[[set[int], set[int]], None] | None = None) -> None:
        self.send, self.wire, self.r, self.timeout = send, wire, r, timeout
        self.targets, self.min_survivors, self.on_replies = targets, min_survivors, on_replies
        self.replies: dict[str, ReplyTally] = {}
        """Per phase ("stats", "update"), what became of the requests."""
        self.clipped: dict[str, float] = {}
        """Under SecAgg+, per phase, the share of values its clipping cut."""
        self.model_sent = False
        """Whether the nodes got the model in the statistics exchange (they keep it)."""
        self.counts: dict[int, int] = {}
        """Node → the samples of its valid statistics (its update must be of as many)."""
        self.used: list[tuple[int, RecordDict, int]] = []
        """The update replies the round used: (node, content, its samples)."""
        self.answered: list[int] = []
        """The clients whose statistics ``each_statistics`` returned, in its order."""

    def _exchange(self, contents: dict[int, RecordDict], tally: ReplyTally
                  ) -> dict[int, RecordDict]:
        got = exchange(self.send, self.r, contents, self.timeout, tally)
        if self.on_replies is not None:
            self.on_replies(set(contents), set(got))
        return got

    def _check(self, phase: str, count: int, shared: Moments | None = None) -> None:
        if reason := skip_reason(phase, count, self.min_survivors):
            raise RoundSkipped(reason, shared)

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        got = self._stats_replies()
        check = self.wire.stats_check(list(got.values()), spec)
        return merge([s for _, each in self._valid_stats(got, lambda _, c: [check(c)])
                      for s in each])

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        """Exchange 1 with each client's statistics (a node answers for its clients one by
        one), by node in the order of the node ids; ``answered`` names their clients."""
        got = self._stats_replies()
        check = self.wire.each_stats_check(list(got.values()), spec)
        valid = self._valid_stats(got, lambda node, c: check(c, len(self.targets[node])))
        self.answered = [k for node, _ in valid for k in self.targets[node]]
        return [s for _, each in valid for s in each]

    def absent(self, cache: StatisticsCache | None) -> Absent | None:
        """``Algorithm.round``'s merge with FedSC's cache of absent clients (None without
        a cache): the fresh statistics are those of the clients ``each_statistics`` got."""
        if cache is None:
            return None
        return lambda fresh: cache.merge_round(self.answered, fresh)

    def _stats_replies(self) -> dict[int, RecordDict]:
        tally = self.replies["stats"] = ReplyTally()
        return self._exchange({n: self.wire.stats_message(c) for n, c in self.targets.items()},
                              tally)

    def _valid_stats(self, got: dict[int, RecordDict],
                     check: Callable[[int, RecordDict], list[EncodingStats]]
                     ) -> list[tuple[int, list[EncodingStats]]]:
        """The statistics replies that pass ``check(node, content)``, as (node, its
        statistics); their nodes become the update exchange's targets."""
        valid = [v for _, v in accept_valid(got.items(), lambda item: (item[0], check(*item)),
                                            self.replies["stats"],
                                            lambda _, item: f"node {item[0]}")]
        self.targets = {node: self.targets[node] for node, _ in valid}
        self.counts = {node: int(sum(float(s.count) for s in each)) for node, each in valid}
        self.model_sent = True
        self._check("stats", len(valid))
        return valid

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        tally = self.replies["update"] = ReplyTally()
        got = self._exchange({n: self.wire.update_message(
            c, not self.model_sent, shared, with_stats is not None)
            for n, c in self.targets.items()}, tally)
        return self.take_updates(got, tally, shared, with_stats)

    def take_updates(self, got: dict[int, RecordDict], tally: ReplyTally,
                     shared: Moments | None = None,
                     with_stats: StatsSpec | None = None) -> Updates:
        """The update replies by node, checked and combined (the pseudo-gradient is the
        negated sample-weighted average update)."""
        check = self.wire.update_check(list(got.values()), with_stats)

        def checked(item: tuple[int, RecordDict]) -> tuple[ClientUpdate, EncodingStats | None]:
            node, content = item
            update, stats = check(content)
            counted = self.counts.get(node)
            if counted is not None and counted != update.num_samples:
                raise ReplyError("count", f"node {node} sent statistics of {counted} samples "
                                          f"and an update of {update.num_samples}")
            return update, stats

        items = list(got.items())
        valid = accept_valid(items, checked, tally, lambda _, item: f"node {item[0]}")
        self._check("update", len(valid), shared)
        self.used = [(*items[i], u.num_samples) for i, (u, _) in valid]
        pooled = pooled_update([u for _, (u, _) in valid], self.wire.params())
        fresh = merge([s for _, (_, s) in valid]) if with_stats is not None else None
        return Updates({k: -v for k, v in pooled.delta.items()}, pooled.loss,
                       sum(len(self.targets.get(n, ())) for n, _, _ in self.used),
                       pooled.num_samples, fresh)


class SecureExchanges(PlainExchanges):
    """The same two steps under SecAgg+: the server sees only the nodes' sample-weighted
    averages, in the frame of the round's calibration (``dcco.flower.secagg``).

    Args (besides ``PlainExchanges``'):
        grid: the grid SecAgg+'s workflow runs on.
        scales: the round's public ranges (the calibration step's).
        fcfg: SecAgg+'s settings (``secagg_*``) and the exchange's timeout.
        max_weight: the targets → SecAgg+'s weight normaliser, the most samples a node
            holds. extra: keys added to every node's config (the strategy's).
    """

    def __init__(self, grid, wire: Wire, r: int, targets: dict[int, list[int]],
                 min_survivors: int, scales: secagg.SecureScales, fcfg: FlowerConfig,
                 max_weight: Callable[[dict[int, list[int]]], float],
                 extra: dict | None = None) -> None:
        super().__init__(grid.send_and_receive, wire, r, fcfg.timeout, targets,
                         max(min_survivors, 2))  # SecAgg+ needs two nodes
        self.grid, self.scales, self.fcfg = grid, scales, fcfg
        self.max_weight, self.extra = max_weight, extra

    def _secure(self, phase: str, make: Callable[[list[int]], Instruction],
                clip: float) -> secagg.SecureAverage | None:
        tally = self.replies[phase] = ReplyTally()
        if not self.targets:
            return None
        params = secagg.SecureParams(self.max_weight(self.targets), clip,
                                     self.fcfg.secagg_quantization, self.scales)
        sent = time.time()
        result = secagg.secure_exchange(self.grid, {n: make(c) for n, c in
                                                    self.targets.items()},
                                        params, self.fcfg, self.r, tally, self.extra)
        timing.record("exchange", round=self.r, sent=sent, received=time.time(),
                      nodes=tally.accepted)
        if result is not None:  # the last entry's last value: the share clipped
            self.clipped[phase] = float(result.values[-1][-1])
        return result

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        raise ValueError("SecAgg+ shows the server only the sum of the nodes' statistics, so "
                         "it cannot keep each client's own: train.absent_statistics = 'cached' "
                         "needs plain exchanges (flower.secagg = false)")

    def _stats(self, values: list[np.ndarray], spec: StatsSpec, n: float) -> EncodingStats:
        m = secagg.secure_moments(values, spec, self.scales, n)
        return EncodingStats({"count": m.count} | {"sum_" + k[len("mean_"):]: v * n
                                                    for k, v in m.items()})

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        res = self._secure("stats", lambda c: self.wire.instruction("stats", c, True),
                           self.fcfg.secagg_stats_clip)
        self.model_sent = True
        self._check("stats", len(res.counts) if res else 0)
        self.targets = {k: self.targets[k] for k in res.counts}
        return self._stats(res.values[:len(spec.fields)], spec,
                           float(sum(res.counts.values())))

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        res = self._secure("update", lambda c: self.wire.instruction(
            "update", c, not self.model_sent, shared, with_stats is not None),
            self.fcfg.secagg_update_clip)
        params = self.wire.params()
        fields = len(with_stats.fields) if with_stats is not None else 0
        if res is not None and (len(res.values) != len(params) + fields + 1 or any(
                v.size != p.numel() for v, p in zip(res.values, params.values(),
                                                    strict=False))):
            tally = self.replies["update"]  # the averages do not fit the model
            tally.accepted -= len(res.counts)
            for _ in res.counts:
                tally.reject("shape")
            res = None
        self._check("update", len(res.counts) if res else 0, shared)
        pseudo = {name: (-self.scales.update * torch.from_numpy(np.asarray(v, np.float64)))
                  .to(p.dtype).reshape(p.shape)
                  for (name, p), v in zip(params.items(), res.values, strict=False)}
        n = float(sum(res.counts.values()))
        fresh = (self._stats(res.values[len(params):-1], with_stats, n)
                 if with_stats is not None else None)
        return Updates(pseudo, float(res.values[-1][0]) * self.scales.loss,
                       sum(len(self.targets[k]) for k in res.counts), int(n), fresh)


__all__ = ["PlainExchanges", "SecureExchanges", "Send", "Wire", "exchange",
           "replies_by_node"]
