"""A node's error reply in one line: the cause, as the node's own code raised it, wherever
Flower wrapped it.

Flower writes a ClientApp's exception into the error reply's ``reason`` as
``"<class 'ValueError'>:<'the message'>"``. In a deployment the class and message are those
of the exception the handler raised. Under Flower's simulation engine (Ray), the handler's
exception is wrapped twice: Flower raises a ``ClientAppException`` from it inside the Ray
actor, and Ray raises a ``RayTaskError(ClientAppException)`` whose message is the chained
tracebacks of both, colour codes included. The handler's exception is then the last
exception line of the chain's last traceback that is not a wrapper's (the chain starts with
what the handler's exception was raised from), and the ``ClientAppException`` says its
message once more after ``occurred. Message:``.
"""

from __future__ import annotations

import re

MAX_CHARS = 400
"""The longest cause kept: a multi-line message (``load_state_dict``'s missing and unexpected
keys) is joined into one line and cut there."""

_WRAPPED = re.compile(r"^<class '([^']+)'>:<'(.*)'>$", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CHAINED = re.compile(r"^(The above exception was the direct cause of the following exception:"
                      r"|During handling of the above exception, another exception occurred:)$",
                      re.MULTILINE)
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b(:|$)")
_APP_MESSAGE = re.compile(r"Exception ClientAppException occurred\. Message: ?")
_FLOWER_WRAPPERS = ("ClientAppException", "RayTaskError")


def error_line(reason: str) -> str:
    """A node's error report (an error reply's ``reason``) in one line: the exception its
    code raised and its message, with how many lines the whole report had when it had
    several (the whole is logged at DEBUG); a one-line report without a traceback as it is.

    >>> error_line("<class 'ValueError'>:<'images are channels-last'>")
    'ValueError: images are channels-last'
    """
    text = _ANSI.sub("", reason).strip()
    lines = sum(1 for line in text.splitlines() if line.strip())
    wrapped = _WRAPPED.match(text)
    kind, body = (wrapped.group(1), wrapped.group(2).strip()) if wrapped else (None, text)
    cause = _cause(body, kind)
    if lines <= 1:
        return cause
    return f"{cause} (from a report of {lines} lines, logged whole at DEBUG)"


def _cause(body: str, kind: str | None) -> str:
    """The exception the node's code raised, from ``body`` (a traceback, or chained ones: the
    last that is not Flower's or Ray's wrapper), its message's further lines joined to it;
    else Flower's ``ClientAppException`` message; else ``kind: body``."""
    for chunk in reversed(_CHAINED.split(body)):
        lines = chunk.splitlines()
        found = [i for i, line in enumerate(lines) if _EXCEPTION.match(line)]
        if found and not _is_wrapper(lines[found[-1]]):
            rest = [line.strip() for line in lines[found[-1] + 1:] if line.strip()]
            return _one_line(" ".join([lines[found[-1]].strip(), *rest]))
    if len(message := _APP_MESSAGE.split(body)) > 1:
        return _one_line(message[-1])
    if kind is not None and not _is_wrapper(kind) and not _EXCEPTION.search(body):
        name = kind.removeprefix("builtins.")
        return _one_line(f"{name}: {body}" if body else name)
    nonblank = [line.strip() for line in body.splitlines() if line.strip()]
    return _one_line(nonblank[-1] if nonblank else body)


def first_line(e: BaseException) -> str:
    """An exception's first line of message (torch's errors run to several), else its
    class's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _is_wrapper(line: str) -> bool:
    """Whether an exception line (or class name) is one of Flower's or Ray's wrappers."""
    name = line.split(":", 1)[0].strip()
    return any(w in name for w in _FLOWER_WRAPPERS)


def _one_line(text: str) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= MAX_CHARS else flat[:MAX_CHARS - 1] + "…"


__all__ = ["MAX_CHARS", "error_line", "first_line"]
