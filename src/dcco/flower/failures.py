"""What a skipped round's message says about its nodes' failures: their errors grouped by
kind (``causes``), the log's lines of a phase's problems, node failures alike in one
(``problem_lines``), whether every node failed alike (``every_node_failed``, which stops a run
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


_NODE_FAILED = re.compile(r"node (\d+) failed: (.*)")  # a node's id, its error line


def _errors(exchanges: PlainExchanges) -> dict[str, tuple[str, int]]:
    """The nodes' error lines of a round (``exchanges.error_line``'s) grouped as alike when
    they differ only in numbers (each node's own shapes and sizes): for each group, its
    first line and its count of nodes."""
    groups: dict[str, tuple[str, int]] = {}
    for tally in exchanges.replies.values():
        for problem in tally.problems:
            if (m := _NODE_FAILED.match(problem)) is not None:
                key = _alike(m.group(2))
                first, n = groups.get(key, (m.group(2), 0))
                groups[key] = (first, n + 1)
    return groups


def causes(exchanges: PlainExchanges) -> str:
    """A skipped round's node errors for its message, each kind once with its count of
    nodes."""
    errors = sorted(_errors(exchanges).values(), key=lambda e: -e[1])
    listed = [f"{why} ({n} node{'s' if n > 1 else ''})" for why, n in errors[:3]]
    more = f"; and {len(errors) - 3} other errors" if len(errors) > 3 else ""
    return f"; the nodes' errors: {'; '.join(listed)}{more}" if listed else ""


def problem_lines(problems: list[str]) -> list[str]:
    """A phase's problems (its ``ReplyTally.problems``) for the log, one line a kind: the
    nodes that failed with errors alike (differing only in numbers) in one line, with their
    count and the first of their ids; every other problem as it is."""
    groups: dict[str, list[tuple[str, str]]] = {}  # masked error: its nodes' ids and errors
    items: list[str | list[tuple[str, str]]] = []  # in the order met: a problem, or a group
    for problem in problems:
        if (m := _NODE_FAILED.match(problem)) is None:
            items.append(problem)
            continue
        if (key := _alike(m.group(2))) not in groups:
            items.append(groups.setdefault(key, []))
        groups[key].append((m.group(1), m.group(2)))
    return [item if isinstance(item, str) else _group_line(item) for item in items]


def _group_line(nodes: list[tuple[str, str]]) -> str:
    if len(nodes) == 1:
        return f"node {nodes[0][0]} failed: {nodes[0][1]}"
    shown = ", ".join(n for n, _ in nodes[:3]) + (", ..." if len(nodes) > 3 else "")
    return f"{len(nodes)} nodes failed alike ({shown}): {nodes[0][1]}"


def _alike(error: str) -> str:
    """An error line with its numbers masked: the errors of nodes that failed alike."""
    return re.sub(r"\d+", "#", error)


def every_node_failed(exchanges: PlainExchanges) -> frozenset[str]:
    """The round's errors when every node asked in its first exchange replied with one (a
    fault of the nodes' code or data, which the next round meets again), else empty."""
    first = next(iter(exchanges.replies.values()), None)
    if first is None or first.sent == 0 or first.failed != first.sent:
        return frozenset()
    return frozenset(_errors(exchanges))  # the kinds, numbers masked


__all__ = ["NOT_ANSWERED", "causes", "every_node_failed", "hint", "problem_lines"]
