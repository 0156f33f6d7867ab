"""The one exception type for bad user input, and how its messages name a path.

``UserError`` marks a problem with what a user gave dcco: a config key or value, a data
file, a run directory, a checkpoint, a command-line argument. Its message names the problem
and how to fix it, and the CLI prints it on one line (exit status 2). Every other exception
is a bug of ours and keeps its traceback. It subclasses ``ValueError`` so that code catching
a ``ValueError`` around a config or data call keeps working.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


class UserError(ValueError):
    """Bad user input; the message names the key, file or folder at fault."""


class ArgumentError(UserError, TypeError):
    """An argument of dcco's public functions (``dcco.fit``, ``dual_encoder``, the round's
    functions) that they cannot use: a user's encoder whose input or output does not fit, a
    method or width that does not go with the rest; the message names the argument. It is a
    ``TypeError`` as well as a ``ValueError`` (``UserError``), so that code catching either
    around these calls keeps working."""


class MissingNameError(UserError, KeyError):
    """A mapping a public function was given lacks a name it needs (``apply_update``'s
    pseudo-gradient without one of the model's parameters); a ``KeyError`` too, so that old
    ``except KeyError`` clauses keep working, with the message shown as written."""

    __str__ = Exception.__str__


class ModelInputError(ArgumentError, RuntimeError):
    """A model that a public function was given failed on the inputs it was given (torch's
    ``RuntimeError`` for a width or shape it cannot take); the message names the inputs and
    their shapes, with the model's own error chained. A ``RuntimeError`` too, so that old
    ``except RuntimeError`` clauses keep working."""


@contextmanager
def arguments_of(call: str, keys: Mapping[str, str],
                 kind: type[UserError] | None = ArgumentError) -> Iterator[None]:
    """The refusals of dcco's config checks inside, as an ``ArgumentError`` of ``call`` that
    names the caller's argument: ``keys`` maps a config key at the start of a message
    (``"optim.lr"``) to the argument (``"lr"``), so ``DCCOStrategy(lr=-1)`` reads
    "DCCOStrategy: lr must be > 0, got -1" rather than a config file's key. The refusal is a
    ``kind``; with ``kind=None`` a ``UserError`` keeps its own class (``dcco.fit`` documents
    its ``ConfigError`` and ``DataError``) and any other ``ValueError`` becomes an
    ``ArgumentError``.

    >>> with arguments_of("f", {"optim.lr": "lr"}):  # doctest: +ELLIPSIS
    ...     raise ValueError("optim.lr must be > 0, got -1")
    Traceback (most recent call last):
    ...
    dcco.errors.ArgumentError: f: lr must be > 0, got -1
    """
    try:
        yield
    except ValueError as e:
        if isinstance(e, ArgumentError) and str(e).startswith(f"{call}: "):
            raise
        message = str(e)
        for key, argument in keys.items():
            if message.startswith(key):
                message = argument + message[len(key):]
                break
        # a refusal of the kind asked (or, with kind None, any UserError) keeps its own class,
        # ModelInputError's or MissingNameError's included, and its cause
        keep = isinstance(e, kind) if kind is not None else isinstance(e, UserError)
        error = type(e) if keep else (kind or ArgumentError)
        raise error(f"{call}: {message}") from e.__cause__


@contextmanager
def refusals_of(call: str) -> Iterator[None]:
    """dcco's own refusals inside (a ``UserError``: bad samples, a bad message) named by the
    public ``call`` that met them, each of its own class ("answer: samples: ..."); every
    other error, a user's model's or augmentation's included, is left as it is."""
    try:
        yield
    except UserError as e:
        if str(e).startswith(f"{call}: "):
            raise
        raise type(e)(f"{call}: {e}") from e


def shown(path: Path | str) -> str:
    """A path as given, with its absolute form beside it when they differ (``nosuch/fmnist
    (= /home/me/nosuch/fmnist)``), for messages."""
    given = Path(path).expanduser()
    full = given.absolute()
    return str(path) if str(full) == str(path) else f"{path} (= {full})"


__all__ = ["ArgumentError", "MissingNameError", "ModelInputError", "UserError", "arguments_of",
           "refusals_of", "shown"]
