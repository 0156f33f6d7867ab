"""The run directory: one folder per run, holding everything needed to trust and resume it.

    config.toml               the resolved run config (reloadable with ``dcco.config.load_config``)
    version.json              dcco and torch versions, the machine (CPU, GPU), git commit and a
                              digest of the source files, command line
    metrics.jsonl             one JSON object per logged round (loss, lr, rounds/s, clients, samples,
                              exchanges, bytes per client) and per k-NN evaluation
                              ({"round": r, "knn": acc, "knn_features": its space;
                              records without it were made by the raw-cosine monitor)
    tensorboard/              the same as TensorBoard scalars, with train.tensorboard
    checkpoint.safetensors    model + optimiser state + rounds done; rewritten atomically
    summary.json              the final results, including every evaluation run on it
    plots/*.png               loss curve, k-NN curve
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, is_dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dcco.config import RunConfig, load_config, to_toml
from dcco.errors import UserError, shown
from dcco.run.checkpoint import atomic_write_text
from dcco.run.scalars import ScalarLog
from dcco.run.setup import resolved
from dcco.run.stores import STATES_FOLDER
from dcco.version import __version__


class RunDirError(UserError):
    """A run directory is missing, incomplete, or would be overwritten."""


class RunDirBusy(RunDirError):
    """Another process is working in the run directory."""


@dataclass(frozen=True)
class Words:
    """How a caller names a run directory and the way to continue one, so that a message
    says the words the user typed: ``--run-dir`` on the command line, ``run_dir=`` in
    Python."""

    run_dir: str
    resume: str
    """What continues the run in ``{path}``."""


CLI_WORDS = Words("--run-dir", "resume it with --resume {path}")
FIT_WORDS = Words("run_dir=", "call fit again with the same arguments to continue it")



def cpu_name() -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def source_digest(package: Path) -> str:
    """SHA-256 (first 16 hex digits) of a package's ``*.py`` files, names and contents, in
    path order: it identifies the code that ran even where git metadata is missing or stale
    (compute it on a checkout of any commit to find the one that matches)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _source_state() -> dict[str, str]:
    package = Path(__file__).resolve().parents[1]  # src/dcco
    state = {"source_sha256": source_digest(package)}
    try:
        git = ["git", "-C", str(package.parents[1])]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=5, check=False).stdout.strip()
        state["git_commit"] = commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        # a tree without git metadata (a lent machine's copy): the commit it was made from,
        # if the session says (benchmarks/gpu_session.py reads .gpu/commit.txt)
        state["git_commit"] = os.environ.get("DCCO_SOURCE_COMMIT", "unknown")
    return state


_SOURCE = _source_state()
"""Read once, when this module is imported: a process that outlives a commit (a grid running
for hours) records the code it loaded, not the checkout's later state."""


def code_version() -> dict[str, str]:
    """dcco's version, the machine (with torch's intra-op thread count, which changes the
    order of floating-point sums and so a run's numbers), and the code: the git commit of the checkout when dcco was
    imported (with '+dirty' if src/ differed from it) and a digest of the source files."""
    return {"dcco": __version__, "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node(),
            "machine": f"{platform.machine()} {platform.system()}",
            "cpu": f"{cpu_name()} ({os.cpu_count()} cores)",
            "threads": str(torch.get_num_threads()),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            **_SOURCE}


COLLAPSE_EVENT = "collapse_response"
"""The key of a collapse event's record in metrics.jsonl (``dcco.run.collapse_response``): a
rewind or a stop at a collapse warning, kept when the records after a checkpoint are
dropped."""
NOT_COMPUTED = frozenset({"data.data_dir", "train.tensorboard"})
"""Settings that say where the data lives or what is logged, not what a run computes: a run
is reused whatever they are (it keeps its own)."""


def stored_config(cfg: RunConfig) -> str:
    """``config.toml``'s text for ``cfg``: resolved for this machine, its paths absolute."""
    return to_toml(with_absolute_paths(resolved(cfg)))


def with_absolute_paths(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a relative ``data.data_dir`` made absolute (from the working directory
    now), so that the stored config finds its data from any working directory (``dcco
    evaluate RUN`` run elsewhere)."""
    if cfg.data.data_dir is None or Path(cfg.data.data_dir).expanduser().is_absolute():
        return cfg
    return replace(cfg, data=replace(cfg.data, data_dir=str(
        Path(cfg.data.data_dir).expanduser().absolute())))


def config_differences(stored: RunConfig, wanted: RunConfig, limit: int = 6) -> str:
    """The keys whose values differ between two configs, as ``key: stored → wanted`` joined
    by "; " (at most ``limit`` of them, then a count), ``NOT_COMPUTED`` left out; empty when
    the configs agree. Both are compared as a run directory stores them, their ``auto``
    settings resolved for this machine (``dcco.run.setup.resolved``; a stored config that no
    longer passes its checks is compared as it is)."""
    with contextlib.suppress(UserError):
        stored = resolved(stored)
    a, b = asdict(stored), asdict(resolved(wanted))
    changes = [f"{section}.{key}: {a[section][key]!r} here, {b[section][key]!r} asked"
               for section in a for key in a[section]
               if a[section][key] != b[section][key] and f"{section}.{key}" not in NOT_COMPUTED]
    if len(changes) > limit:
        changes = changes[:limit] + [f"and {len(changes) - limit} more"]
    return "; ".join(changes)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


class RunDir:
    """Paths and files of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    config_path = property(lambda self: self.path / "config.toml")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    checkpoint_path = property(lambda self: self.path / "checkpoint.safetensors")
    earlier_checkpoint_path = property(lambda self: self.path / "checkpoint.earlier.safetensors")
    """The checkpoint before the last, kept under ``train.on_collapse`` = "stop" or
    "rewind" (``dcco.run.collapse_response``)."""
    summary_path = property(lambda self: self.path / "summary.json")
    plots_path = property(lambda self: self.path / "plots")
    stop_path = property(lambda self: self.path / "STOP")
    """A file whose presence asks a running Flower run to stop at its next logged round
    (``stop_requested``): the ServerApp runs in a process of its own, started by the SuperLink,
    so a file is how a user (or a test) reaches it."""
    client_states_path = property(lambda self: self.path / STATES_FOLDER)
    """FedU's, FedEMA's and MoCo's clients' states with ``train.client_state_store = "disk"``
    (``dcco.core.disk_states``)."""

    def stop_requested(self) -> str | None:
        """Whether ``STOP`` exists: consumed (removed, so a resumed run goes on) and reported
        as the reason a ``pretraining_loop`` stops for, or None."""
        try:
            self.stop_path.unlink()
        except FileNotFoundError:
            return None
        return f"stop requested ({self.stop_path.name} in the run directory)"

    STARTED_ONLY = frozenset({"config.toml", "version.json", ".lock", "split.json"})
    """The files of a run directory that was created but never ran a round (a run stopped by
    an error in its config or data): ``create`` may start afresh in it."""

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig, words: Words = CLI_WORDS) -> RunDir:
        """A new run directory; refuses to touch one that already holds a run, or a path
        where no folder can be made (a file, or a file above it), naming the path as given
        and in full and the caller's ``words``. A directory that holds only the files of a
        run that never started (``STARTED_ONLY``) is reused."""
        run = cls(path)
        if run.path.exists() and not run.path.is_dir():
            raise RunDirError(f"{shown(path)} is a file, not a run directory; choose another "
                              f"{words.run_dir}")
        above = next((a for a in run.path.absolute().parents if a.exists()), None)
        if above is not None and not above.is_dir():
            raise RunDirError(f"{shown(path)} cannot be a run directory: {above} is a file, "
                              f"not a folder; choose another {words.run_dir}")
        if run.path.exists() and any(p.name not in cls.STARTED_ONLY for p in run.path.iterdir()):
            raise RunDirError(
                f"run directory {shown(path)} already exists and is not empty; "
                f"{words.resume.format(path=run.path)}, or choose another {words.run_dir}"
            )
        stored = stored_config(cfg)  # refused before anything is written
        run.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.config_path, stored)
        version = code_version() | {"command": " ".join(sys.argv)}
        atomic_write_text(run.path / "version.json", json.dumps(version, indent=2) + "\n")
        return run

    @classmethod
    def open_or_create(cls, path: str | Path, cfg: RunConfig) -> tuple[RunDir, bool]:
        """(run, existed): reuse a run made with the same config, or create it.

        Used by multi-run jobs (demo, experiment grids) so that rerunning them resumes.
        """
        path = Path(path)
        if (path / "config.toml").is_file():
            run = cls.open(path)
            differ = config_differences(run.config(), cfg)
            if differ:
                raise RunDirError(f"{path} holds a run with another config ({differ}); use a "
                                  f"new output folder or delete that run")
            return run, True
        return cls.create(path, cfg), False

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory (it must hold a config)."""
        run = cls(path)
        if not run.config_path.is_file():
            what = "does not exist" if not run.path.exists() else "holds no config.toml"
            raise RunDirError(f"{shown(path)} is not a dcco run directory (it {what})")
        return run

    def config(self) -> RunConfig:
        return load_config(self.config_path, warn_renamed=False)

    def extend(self, cfg: RunConfig) -> None:
        """Store ``cfg``, the run's config with more rounds, as its config (atomically): the
        run then resumes to its new total (``dcco.run.extension`` says when it may)."""
        atomic_write_text(self.config_path, stored_config(cfg))

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold an exclusive lock on the run directory (``.lock``, POSIX ``flock``), so that
        two processes (say, two ``dcco reproduce`` on one folder) never train or evaluate the
        same run at once. Raises ``RunDirBusy`` at once if another process holds it; the lock
        goes with the process, however it ends. Where ``fcntl`` is missing it does nothing."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield
            return
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirBusy(f"run directory {self.path} is in use by another process") \
                    from None
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def scalars(self) -> ScalarLog | None:
        """The run's TensorBoard log when its config asks for one (``train.tensorboard``)."""
        if not hasattr(self, "_scalars"):
            wanted = self.config_path.is_file() and self.config().train.tensorboard
            self._scalars = ScalarLog(self.path / "tensorboard") if wanted else None
        return self._scalars

    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(record, default=_jsonable) + "\n")
            fh.flush()
        if self.scalars is not None:
            self.scalars.record(record)

    def metrics(self) -> list[dict[str, Any]]:
        """Every metrics record; a torn last line (from a kill mid-write) is ignored."""
        if not self.metrics_path.is_file():
            return []
        records = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def truncate_metrics(self, rounds_done: int) -> None:
        """Drop records past the checkpoint, so a resumed run logs each round exactly once;
        collapse events (``COLLAPSE_EVENT``) stay, since the run came back from them."""
        kept = [r for r in self.metrics()
                if r.get("round", 0) <= rounds_done or COLLAPSE_EVENT in r]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))

    def summary(self) -> dict[str, Any]:
        if not self.summary_path.is_file():
            return {}
        try:
            return json.loads(self.summary_path.read_text())
        except json.JSONDecodeError as e:
            raise RunDirError(f"{self.summary_path} is corrupt: {e}") from None

    def update_summary(self, **entries: Any) -> dict[str, Any]:
        """Merge ``entries`` into summary.json (nested dicts are merged one level deep)."""
        summary = self.summary()
        for key, value in entries.items():
            if isinstance(value, dict) and isinstance(summary.get(key), dict):
                summary[key] = summary[key] | value
            else:
                summary[key] = value
        text = json.dumps(summary, indent=2, default=_jsonable) + "\n"
        atomic_write_text(self.summary_path, text)
        evaluations = entries.get("evaluations")
        if isinstance(evaluations, dict) and self.scalars is not None:
            for key, result in evaluations.items():
                result = asdict(result) if is_dataclass(result) else result
                self.scalars.evaluation(key, result["accuracy"], summary.get("rounds") or 0)
        return summary


def record_split(run: RunDir, cfg: RunConfig, train, test) -> None:
    """Write ``split.json`` into ``run`` for data in natural clients (nothing otherwise:
    ``dcco.run.splits.split_record``)."""
    from dcco.run.splits import split_record

    record = split_record(cfg, train, test)
    if record is not None:
        atomic_write_text(run.path / "split.json", json.dumps(record, indent=2) + "\n")
