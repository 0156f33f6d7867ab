"""The one exception type for bad user input.

``UserError`` marks a problem with what a user gave dcco: a config key or value, a data
file, a run directory, a checkpoint, a command-line argument. Its message names the problem
and how to fix it, and the CLI prints it on one line (exit status 2). Every other exception
is a bug of ours and keeps its traceback. It subclasses ``ValueError`` so that code catching
a ``ValueError`` around a config or data call keeps working.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad user input; the message names the key, file or folder at fault."""


__all__ = ["UserError"]
