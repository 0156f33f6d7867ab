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


def shown(path: Path | str) -> str:
    """A path as given, with its absolute form beside it when they differ (``nosuch/fmnist
    (= /home/me/nosuch/fmnist)``), for messages."""
    given = Path(path).expanduser()
    full = given.absolute()
    return str(path) if str(full) == str(path) else f"{path} (= {full})"


__all__ = ["UserError", "shown"]
