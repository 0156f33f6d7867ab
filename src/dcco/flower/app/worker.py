"""A node's long-lived worker: one process per SuperNode and run that holds torch, the data
and the model across messages, behind a ClientApp that imports only Flower.

Flower 1.41/1.42 starts a ``flwr-clientapp`` process for every message (Flower issue #3670),
so a ClientApp that imports torch pays that import, and its data load, for every message of
every round. With ``flower.worker = true`` the ClientApp (``dcco.flower.app.client_app``) instead
forwards each message to its node's worker over a Unix socket and returns the worker's reply;
the first message of a run starts the worker. The worker runs the same handlers
(``dcco.flower.app.handlers``) on the same content and context, so a round is the same with or
without it; ``context.state`` (the model kept between the phases) travels both ways.

- Socket: ``<tmp>/dcco-workers-<uid>/<run id>-<node id>.sock`` (the folder can be set with
  ``DCCO_WORKER_DIR``), in a folder only the user can enter. Messages are Flower's own protobuf records, framed with a JSON header (no
  pickle).
- Lifetime: the worker ends when the process that started it (the SuperNode side) is gone,
  when nothing has come for ``IDLE_S`` seconds, or when asked (``stop``). It inherits the
  ClientApp's environment (``FLWR_HOME`` among it), so whatever stops a deployment's
  processes by that finds it too.
- Errors: a handler's exception becomes the ClientApp's (``WorkerError``, with the
  worker's message), which Flower reports to the server as a failed reply, as it does
  without a worker. A worker that cannot start is an error naming its log.

This module imports Flower and the standard library only; the worker process imports the
handlers (torch) once, when it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from flwr.app import Context, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

IDLE_S = 900.0
"""A worker with no message for this long ends (a later message starts another)."""
START_S = 120.0
"""Seconds a ClientApp waits for a worker it started to listen."""
CHECK_S = 2.0
"""How often an idle worker checks that the process that started it is still there."""
KEY = "flower.worker"
"""The run-config key that turns the worker on."""


class WorkerError(RuntimeError):
    """The worker failed a request (its handler raised) or could not be reached."""


def enabled(run_config: Mapping[str, object]) -> bool:
    """Whether this message goes to the node's worker (``flower.worker``, read without dcco's
    config, which imports torch): ``true`` or ``false`` as set; ``auto`` (the default) when
    this process was started by a SuperNode for this one message (``per_message_process``)."""
    value = run_config.get(KEY, "auto")
    return per_message_process() if value == "auto" else bool(value)


LAUNCHERS = ("flower-superexec", "flower-supernode")
"""The commands that start a ClientApp process for every message: a SuperNode in Flower's
default ``subprocess`` isolation starts ``flower-superexec``, which starts a new
``flwr-clientapp`` for each message (flwr 1.42); ``flower-supernode`` too, should a SuperNode
start it itself."""


def per_message_process(parent: int | None = None) -> bool:
    """Whether the process ``parent`` (default: this process's parent) is one of Flower's
    ``LAUNCHERS``, i.e. this ClientApp lives for one message and would import torch and read
    the data again for the next one. False in Flower's simulation (Ray actors, started by
    Ray), in process, and wherever ``/proc`` cannot say."""
    pid = os.getppid() if parent is None else parent
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(Path(part.decode(errors="replace")).name in LAUNCHERS for part in command[:2])


def socket_dir() -> Path:
    """``$DCCO_WORKER_DIR``, else ``<tmp>/dcco-workers-<uid>``; created for the user alone."""
    path = Path(os.environ.get("DCCO_WORKER_DIR")
                or Path(tempfile.gettempdir()) / f"dcco-workers-{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


SOCKET_PATH_MAX = 107
"""The longest Unix socket path Linux binds, in bytes."""


def socket_path(run_id: int, node_id: int) -> Path:
    path = socket_dir() / f"{run_id}-{node_id}.sock"
    longest = len(os.fsencode(path)) + 7  # the worker binds first to <path>.<pid>.tmp
    if longest > SOCKET_PATH_MAX:
        raise WorkerError(f"the node worker's socket path {path} is too long for a Unix socket "
                          f"({longest} bytes with its temporary suffix, at most "
                          f"{SOCKET_PATH_MAX}); set DCCO_WORKER_DIR to a shorter folder")
    return path


# ---------------------------------------------------------------------- framing


def _send(sock: socket.socket, header: Mapping[str, object], records: list[RecordDict]) -> None:
    blobs = [recorddict_to_proto(r).SerializeToString() for r in records]
    head = json.dumps({**header, "blobs": [len(b) for b in blobs]}).encode()
    sock.sendall(struct.pack("!I", len(head)) + head + b"".join(blobs))


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError(f"the other side closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket) -> tuple[dict, list[RecordDict]]:
    (size,) = struct.unpack("!I", _exactly(sock, 4))
    header = json.loads(_exactly(sock, size))
    records = [recorddict_from_proto(ProtoRecordDict.FromString(_exactly(sock, n)))
               for n in header.pop("blobs")]
    return header, records


# ---------------------------------------------------------------------- the ClientApp's side


def call(kind: str, content: RecordDict, context: Context) -> RecordDict:
    """Run handler ``kind`` ("query" or "train") of this node's worker on ``content`` with
    ``context``, starting the worker if none is listening; ``context.state`` is replaced by
    the worker's. Returns the reply's content."""
    path = socket_path(context.run_id, context.node_id)
    with _connected(path) as sock:
        _send(sock, {"kind": kind, "run_id": context.run_id, "node_id": context.node_id,
                     "node_config": dict(context.node_config),
                     "run_config": dict(context.run_config)}, [content, context.state])
        header, records = _receive(sock)
    if "error" in header:
        raise WorkerError(f"node worker ({path.name}): {header['error']}")
    reply, state = records
    for key in list(context.state):
        del context.state[key]
    for key, value in state.items():
        context.state[key] = value
    return reply


def stop(run_id: int, node_id: int) -> bool:
    """Ask the worker of (run, node) to end; False if none was listening."""
    path = socket_path(run_id, node_id)
    try:
        sock = _connect(path)
    except OSError:
        return False
    with sock:
        _send(sock, {"kind": "stop"}, [])
        _receive(sock)
    return True


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def _connected(path: Path):
    """A connection to the worker at ``path``; one is started (under a lock, so two
    messages of a node start one worker) if none listens."""
    try:
        sock = _connect(path)
    except OSError:
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                sock = _connect(path)
            except OSError:
                sock = _start(path)
    with sock:
        yield sock


def _start(path: Path) -> socket.socket:
    log = path.with_suffix(".log")
    path.unlink(missing_ok=True)  # a dead worker's socket
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dcco.flower.app.worker", str(path), "--owner",
             str(os.getppid())], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    deadline = time.monotonic() + START_S
    while True:
        with contextlib.suppress(OSError):
            return _connect(path)
        if proc.poll() is not None:
            raise WorkerError(f"the node's worker exited with code {proc.returncode} before "
                              f"listening; its log: {log}")
        if time.monotonic() > deadline:
            proc.kill()
            raise WorkerError(f"the node's worker did not listen on {path} within "
                              f"{START_S:.0f} s; its log: {log}")
        time.sleep(0.02)


# ---------------------------------------------------------------------- the worker


def serve(path: Path, owner: int | None, idle: float = IDLE_S) -> None:
    """Answer requests on ``path`` until stopped, idle for ``idle`` seconds, or ``owner`` (a
    PID) is gone."""
    from dcco.flower.app import handlers  # torch, once

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    server.bind(str(tmp))
    server.listen()
    os.replace(tmp, path)  # listening before anyone can connect
    ours = os.stat(path).st_ino  # a worker started after this one may have replaced it
    server.settimeout(CHECK_S)
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle and (owner is None or _alive(owner)):
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            last = time.monotonic()
            with conn:
                conn.settimeout(None)
                if not _answer(conn, handlers):
                    return
    finally:
        server.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ours:
                path.unlink()


def _answer(conn: socket.socket, handlers) -> bool:
    """Answer one request; False once told to stop."""
    header, records = _receive(conn)
    if header["kind"] == "stop":
        _send(conn, {"stopped": True}, [])
        return False
    content, state = records
    context = Context(run_id=header["run_id"], node_id=header["node_id"],
                      node_config=header["node_config"], state=state,
                      run_config=header["run_config"])
    try:
        handler = {"query": handlers.query, "train": handlers.train}[header["kind"]]
        reply = handler(content, context)
    except Exception as e:  # noqa: BLE001 -- the ClientApp raises it; Flower reports it
        _send(conn, {"error": f"{type(e).__name__}: {e}"}, [])
        return True
    _send(conn, {}, [reply, context.state])
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, and another user's
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a node's long-lived dcco worker")
    ap.add_argument("socket", type=Path)
    ap.add_argument("--owner", type=int, default=None, help="end when this PID is gone")
    ap.add_argument("--idle", type=float, default=IDLE_S)
    args = ap.parse_args(argv)
    serve(args.socket, args.owner, args.idle)


if __name__ == "__main__":
    main()
