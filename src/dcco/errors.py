"""The one exception type for bad user input, and how its messages name a path.

``UserError`` marks a problem with what a user gave dcco: a config key or value, a data
file, a run directory, a checkpoint, a command-line argument. Its message names the problem
and how to fix it, and the CLI prints it on one line (exit status 2). Every other exception
is a bug of ours and keeps its traceback. It subclasses ``ValueError`` so that code catching
a ``ValueError`` around a config or data call keeps working.
"""

from __future__ import annotations

from pathlib import Path


class UserError(ValueError):
    """Bad user input; the message names the key, file or folder at fault."""


class ArgumentError(UserError, TypeError):
    """An argument of dcco's public functions (``dcco.fit``, ``dual_encoder``, the round's
    functions) that they cannot use: a user's encoder whose input or output does not fit, a
    method or width that does not go with the rest; the message names the argument. It is a
    ``TypeError`` as well as a ``ValueError`` (``UserError``), so that code catching either
    around these calls keeps working."""


def shown(path: Path | str) -> str:
    """A path as given, with its absolute form beside it when they differ (``nosuch/fmnist
    (= /home/me/nosuch/fmnist)``), for messages."""
    given = Path(path).expanduser()
    full = given.absolute()
    return str(path) if str(full) == str(path) else f"{path} (= {full})"


__all__ = ["ArgumentError", "UserError", "shown"]
