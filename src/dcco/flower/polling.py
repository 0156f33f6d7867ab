"""Push messages and pull their replies on a short poll: Flower's ``send_and_receive``
without its 3 s sleep between pulls.

Imports Flower only (no torch), so that Flower's own floor (``dcco.flower.testing.floor``) is timed
with the same exchange as dcco's rounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

POLL_S = 0.01
"""Seconds between pulls while replies are outstanding (Flower's ``Grid.send_and_receive``
sleeps 3 s on a deployment's grid, ``flwr/superlink/grid/http_grid.py`` in 1.41/1.42, and
0.1 s in its simulation, ``inmemory_grid.py``). A pull is one cheap request to the SuperLink
(a lookup in the simulation), and every exchange ends on average half a poll after its last
reply: at 0.1 s, that half was a tenth of a round of the example app with 8 photos a node."""


def push_and_pull(grid: Grid, messages: Iterable[Message],
                  timeout: float | None = None) -> list[Message]:
    """Push ``messages``, then pull their replies every ``POLL_S`` until all are in or
    ``timeout`` seconds pass (None: no limit); returns the replies that came, in the order
    they came. ``push_messages`` and ``pull_messages`` are the public parts of Flower's
    ``send_and_receive``."""
    pending = {i for i in grid.push_messages(list(messages)) if i}
    end = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(sorted(pending)))
        replies.extend(got)
        pending.difference_update(r.metadata.reply_to_message_id for r in got)
        if not pending or (end is not None and time.monotonic() >= end):
            break
        time.sleep(POLL_S if end is None else max(0.0, min(POLL_S, end - time.monotonic())))
    return replies


def send_and_receive(grid: Grid, messages: Iterable[Message],
                     timeout: float | None = None) -> list[Message]:
    """The replies to ``messages`` by ``push_and_pull``; a grid that answers at once
    (``dcco.flower.testing.inprocess``: ``replies_at_once``) is asked directly."""
    if getattr(grid, "replies_at_once", False):
        return list(grid.send_and_receive(list(messages), timeout=timeout))
    return push_and_pull(grid, messages, timeout)
