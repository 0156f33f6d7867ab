"""A decoded copy of a data set split, memory-mapped: decoded from its files once, then read
as plain arrays.

Decoding Fashion-MNIST's gzipped IDX files (or CIFAR's pickles) costs about half a second
per load, and a Flower SuperNode starts a fresh ClientApp process, which loads its data
again, for every message. The cache is a folder ``.dcco-cache-<name>-<split>`` next to the
source files (or in the download folder, when the source folder is the system's or not
writable) holding ``images.npy``, ``labels.npy`` and ``meta.json``:

- it is written once, atomically: into a temporary folder, renamed into place; when
  several processes build it at once, the first rename wins and the others use that one;
- it is verified on every load: the sources' paths, sizes and modification times must be the
  ones it was built from, and each array's shape, dtype and CRC-32 the recorded ones.
  Anything else (a changed source, a truncated or corrupt cache, an older format) is ignored
  and the cache is built again from the sources;
- ``DCCO_DATA_CACHE=0`` turns it off.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dcco.files import umask_mode

FORMAT = "dcco-data-cache/1"
ENV = "DCCO_DATA_CACHE"
ARRAYS = ("images", "labels")


def enabled() -> bool:
    """False when ``DCCO_DATA_CACHE=0``."""
    return os.environ.get(ENV, "1").strip() != "0"


def _identity(sources: Sequence[Path]) -> list[list]:
    """What the cache was built from: each source's resolved path, size and mtime (ns)."""
    out = []
    for path in sources:
        st = path.stat()
        out.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    return out


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"))


def read_cache(folder: Path, sources: Sequence[Path], names: Sequence[str] = ARRAYS,
               settings: dict | None = None) -> tuple[np.ndarray, ...] | None:
    """The cached arrays ``names`` (read-only memory maps) if ``folder`` holds a cache of
    exactly ``sources``, decoded with exactly ``settings`` (e.g. an image size), that passes
    every check, else None."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if (meta.get("format") != FORMAT or meta.get("sources") != _identity(sources)
                or meta.get("settings", {}) != (settings or {})):
            return None
        arrays = []
        for name in names:
            info = meta["arrays"][name]
            array = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            if (list(array.shape) != info["shape"] or str(array.dtype) != info["dtype"]
                    or _crc(array) != info["crc32"]):
                return None
            arrays.append(array)
        return tuple(arrays)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cache(folder: Path, sources: Sequence[Path], arrays: Sequence[np.ndarray],
                names: Sequence[str] = ARRAYS, settings: dict | None = None) -> None:
    """Write ``arrays`` (named ``names``: images, labels, ...) as the cache of ``sources``
    decoded with ``settings`` in ``folder``, atomically (a temporary folder renamed into
    place). A folder another process put there first is kept.

    Raises:
        OSError: the parent folder is not writable (or another file-system error).
    """
    parent = folder.parent
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f"{folder.name}.", suffix=".part"))
    try:
        os.chmod(tmp, umask_mode(0o777))
        meta = {"format": FORMAT, "sources": _identity(sources), "arrays": {}}
        if settings:
            meta["settings"] = settings
        for name, array in zip(names, arrays, strict=True):
            array = np.ascontiguousarray(array)
            np.save(tmp / f"{name}.npy", array, allow_pickle=False)
            meta["arrays"][name] = {"shape": list(array.shape), "dtype": str(array.dtype),
                                    "crc32": _crc(array)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if folder.exists():  # stale or corrupt: move it aside, then put the new one in
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f"{folder.name}.", suffix=".old"))
            try:
                os.replace(folder, old / "cache")
            except OSError:
                pass  # another process moved or replaced it meanwhile
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_arrays(name: str, sources: Sequence[Path], folders: Sequence[Path],
                  decode: Callable[[], tuple[np.ndarray, ...]], names: Sequence[str] = ARRAYS,
                  settings: dict | None = None) -> tuple[np.ndarray, ...]:
    """The arrays ``names`` (by default images, labels) of one split: from a valid cache in
    the first of ``folders`` that has one, else ``decode()``d from ``sources`` and cached in
    the first writable of ``folders``.

    Args:
        name: the cache's name, e.g. ``"fashion_mnist-train"`` (the folder is
            ``.dcco-cache-<name>``).
        sources: the files the arrays come from (their identity keys the cache).
        folders: where the cache may live, in order of preference.
        decode: reads the sources (raising ``DataError`` for a bad file), returning the
            arrays in the order of ``names``.
        names: the arrays' names (numeric arrays, or fixed-width unicode for names).
        settings: how the sources were decoded (JSON-able, e.g. the image size): a cache made
            with other settings is rebuilt.
    """
    if not enabled() or not all(p.is_file() for p in sources):
        return decode()  # a missing source is the decoder's to report, by name
    places = [Path(f) / f".dcco-cache-{name}" for f in dict.fromkeys(folders)]
    for place in places:
        found = read_cache(place, sources, names, settings)
        if found is not None:
            return found
    arrays = decode()
    for place in places:
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            write_cache(place, sources, arrays, names, settings)
            break
        except OSError:
            continue  # read-only: try the next place; without one, the data still loads
    return arrays


__all__ = ["ENV", "cached_arrays", "enabled", "read_cache", "write_cache"]
