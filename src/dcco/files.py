"""Files written so that a crash never leaves half of one: a temporary file beside the
target, then ``os.replace``, with the permissions a plain ``open()`` would give."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask: what ``open()`` would give a new file (0o777 for a
    folder). ``tempfile.mkstemp`` creates files 0600 and ``mkdtemp`` folders 0700 whatever
    the umask, so files written through them are given this mode before they replace the
    target."""
    current = os.umask(0)
    os.umask(current)
    return mode & ~current


@contextmanager
def atomic_writer(path: Path, sync: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into: a temporary file beside it that,
    once the block ends, is flushed to disk (``sync``; False: left to the system, for a file
    that something else makes durable later) and replaces ``path`` (``os.replace``), with the
    permissions a plain ``open()`` would give it (the umask's). An error in the block leaves
    ``path`` as it was and no temporary file behind."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``
    (``atomic_writer``)."""
    with atomic_writer(path) as fh:
        fh.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


__all__ = ["atomic_write_bytes", "atomic_write_text", "umask_mode"]
