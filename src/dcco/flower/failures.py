"""What a skipped round's message says about its nodes' failures: their errors grouped by
kind (``causes``), whether every node failed alike (``every_node_failed``, which stops a run
early in ``DCCOStrategy.start``), and a hint when the replies look like a ClientApp that does not
answer with ``dcco.flower.answer`` (``hint``)."""

from __future__ import annotations

import re

from dcco.flower.exchanges import PlainExchanges

NOT_ANSWERED = ("layout", "packed", "state_dict", "statistics", "arrays")
"""Words of a node's error, or of a rejected reply, that point to a ClientApp that does not
answer with ``dcco.flower.answer`` (it loads DCCO's packed arrays as its own state_dict, or
replies with weights and no statistics)."""


def hint(exchanges: PlainExchanges) -> str:
    """A hint when the round's problems look like a ClientApp that does not call
    ``dcco.flower.answer``, else ""."""
    problems = [p for t in exchanges.replies.values() for p in t.problems]
    if problems and any(word in p for p in problems for word in NOT_ANSWERED):
        return (". The nodes' replies look like a ClientApp that does not answer with "
                "dcco.flower.answer: its @app.train() must return dcco.flower.answer(msg, "
                "context, model, samples, augment=...) (docs/own_code.md, \"Flower\")")
    return ""


def _errors(exchanges: PlainExchanges) -> dict[str, tuple[str, int]]:
    """The nodes' error lines of a round (``exchanges.error_line``'s) grouped as alike when
    they differ only in numbers (each node's own shapes and sizes): for each group, its
    first line and its count of nodes."""
    groups: dict[str, tuple[str, int]] = {}
    for tally in exchanges.replies.values():
        for problem in tally.problems:
            if (m := _FAILED.match(problem)) is not None:
                key = re.sub(r"\d+", "#", m.group(1))
                first, n = groups.get(key, (m.group(1), 0))
                groups[key] = (first, n + 1)
    return groups


_FAILED = re.compile(r"node \d+ failed: (.*)")


def causes(exchanges: PlainExchanges) -> str:
    """A skipped round's node errors for its message, each kind once with its count of
    nodes."""
    errors = sorted(_errors(exchanges).values(), key=lambda e: -e[1])
    listed = [f"{why} ({n} node{'s' if n > 1 else ''})" for why, n in errors[:3]]
    more = f"; and {len(errors) - 3} other errors" if len(errors) > 3 else ""
    return f"; the nodes' errors: {'; '.join(listed)}{more}" if listed else ""


def every_node_failed(exchanges: PlainExchanges) -> frozenset[str]:
    """The round's errors when every node asked in its first exchange replied with one (a
    fault of the nodes' code or data, which the next round meets again), else empty."""
    first = next(iter(exchanges.replies.values()), None)
    if first is None or first.sent == 0 or first.failed != first.sent:
        return frozenset()
    return frozenset(_errors(exchanges))  # the kinds, numbers masked


__all__ = ["NOT_ANSWERED", "causes", "every_node_failed", "hint"]
