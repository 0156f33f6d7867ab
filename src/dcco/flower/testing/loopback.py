"""A real Flower deployment on 127.0.0.1: one SuperLink, N SuperNodes, the dcco app.

Secure by default: it makes a throwaway certificate authority, the SuperLink's certificate
and one key pair per SuperNode (``dcco.flower.credentials``, in ``<out>/credentials``, made
anew for each deployment), starts ``flower-superlink`` with TLS and
``--enable-supernode-auth``, registers each node's public key (``flwr supernode register``)
and starts N ``flower-supernode`` processes that verify the SuperLink against the CA and sign
in with their own key. ``--insecure`` (``Loopback(secure=False)``) runs all of it in
plaintext and admits any node, for local tests only. Each node gets its own
``--node-config "partition-id=i num-partitions=N"`` and runtime port, in a private
``FLWR_HOME`` (nothing in the user's home is touched) with
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``; submits the app with ``flwr run``; waits
until Flower reports the run finished; and stops every process it started (each in its own
process group, so the SuperExec, ServerApp and ClientApp processes they spawn go with them),
also on a timeout, an error or Ctrl-C. Logs of every process are kept in ``<out>/logs``.

    python -m dcco.flower.testing.loopback --nodes 3 --out runs/loopback \\
        --set train.rounds=10 --set train.clients_per_round=16

prints the run directory and the wall time per round (from ``metrics.jsonl``). The same
commands by hand are in docs/flower.md.

The run config is checked here before anything starts: a key the app does not declare, or a
value dcco refuses, ends the launcher at once with one line naming it (Flower itself would
only say "Invalid run configuration", or fail the run later). A run that ends
``finished:failed`` is reported with Flower's status details (the ServerApp's error). Ctrl-C,
SIGTERM and SIGHUP stop every process the launcher started and end it with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from dcco.config import ConfigError
from dcco.flower import timing
from dcco.flower.appconfig import FlowerValue, parse_run_config
from dcco.flower.credentials import Credentials, make_credentials

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CONNECTION = "loopback"
PROJECT = Path(__file__).resolve().parents[4]
"""The project whose ``pyproject.toml`` declares the app (this source checkout)."""


STATUS_WAITS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
"""Seconds between ``Loopback.wait``'s looks at a run's status, the last repeated: a run that
ends within a few seconds is seen at once, a long one costs a look every 8 s."""


class DeploymentError(RuntimeError):
    """The deployment failed; the message carries the tail of the processes' logs, and
    ``summary`` says what failed in one line."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message.split("\n", 1)[0]


class Stopped(Exception):
    """The launcher was told to stop by a signal (SIGTERM or SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP end the launcher as Ctrl-C does: the deployment's context exits and
    stops every process. Once one arrives, further ones are ignored until the processes are
    stopped."""

    def handler(signum: int, frame: object) -> None:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


SUPEREXEC_POLL_S = "0.1"
"""The task poll of the deployment's SuperExecs, in seconds (Flower's default: 1)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toml_value(value: FlowerValue) -> str:
    """A run-config value as ``flwr run --run-config`` reads it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # a TOML basic string


class Loopback:
    """The processes of one loopback deployment; use as a context manager.

    Args:
        nodes: number of SuperNodes (``num-partitions``).
        out: folder for ``flwr-home``, the SuperLink's database and ``logs``.
        project: the Flower project to run (its ``pyproject.toml``).
        secure: TLS and SuperNode authentication (the default); False: plaintext, any node
            admitted.
    """

    connection = CONNECTION
    """The ``flwr`` connection (``$FLWR_HOME/config.toml``) that runs are submitted to."""

    def __init__(self, nodes: int, out: Path, project: Path = PROJECT, secure: bool = True
                 ) -> None:
        if nodes < 1:
            raise ValueError(f"a deployment needs at least one SuperNode, got {nodes}")
        self.nodes, self.out, self.project = nodes, out.resolve(), project
        self.secure = secure
        self.credentials: Credentials | None = None
        """The deployment's CA, SuperLink certificate and node keys (``secure`` only)."""
        self.node_ids: dict[int, int] = {}
        """Flower's node id of each registered SuperNode, by index."""
        self.logs = self.out / "logs"
        self.home = self.out / "flwr-home"
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self._retired: list[subprocess.Popen] = []
        """SuperNodes whose key was unregistered (they end themselves)."""
        self._killed: list[int] = []
        """Process groups of SuperNodes ended by ``kill_node`` (their leftovers stop with the
        rest)."""
        self.details = ""
        """Flower's status details of the last run ``wait`` saw end (its error, if failed)."""
        # Flower's commands (flower-superlink, flwr, and the flwr-clientapp a SuperNode
        # starts) come from this interpreter's environment first, so a virtual environment
        # works without being activated.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        # a SuperExec (the SuperLink's and each SuperNode's) looks for a new task every
        # FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds (Flower's default 1 s; 0.01 to 60)
        self.env = os.environ | {"FLWR_HOME": str(self.home),
                                 "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                                 "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": SUPEREXEC_POLL_S,
                                 "PYTHONUNBUFFERED": "1", "PATH": path}

    # ------------------------------------------------------------------ processes

    def _prepare(self, connection: str) -> None:
        """The folders, and ``FLWR_HOME/config.toml`` with this deployment's connection
        (``connection``: the body of its ``[superlink.<name>]`` table)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.connection}"\n\n'
            f'[superlink.{self.connection}]\n{connection}')

    def __enter__(self) -> Loopback:  # noqa: PYI034
        address = f'address = "127.0.0.1:{self.port}"\n'
        if self.secure:
            folder = self.out / "credentials"
            if folder.exists():  # the last deployment's throwaway set: made anew
                shutil.rmtree(folder)
            self.credentials = creds = make_credentials(folder, self.nodes)
            self._prepare(address + f'root-certificates = "{creds.ca_certificate}"\n')
            transport = ["--ssl-certfile", str(creds.superlink_certificate),
                         "--ssl-keyfile", str(creds.superlink_key),
                         "--ssl-ca-certfile", str(creds.ca_certificate),
                         "--enable-supernode-auth"]
        else:
            self._prepare(address + "insecure = true\n")
            transport = ["--insecure"]
        try:
            self._start("superlink", ["flower-superlink", *transport, "--port", str(self.port),
                                      "--database", str(self.out / "superlink.db")])
            self._wait_listening(self.port, "superlink", 60.0)
            for i in range(self.nodes):
                if self.secure:
                    self.register_node(i)
                self.start_node(i)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def register_node(self, index: int, public_key: Path | None = None) -> int:
        """Register SuperNode ``index``'s public key (``flwr supernode register``; by default
        the deployment's ``node-<index>.pub``) with the SuperLink; returns its node id."""
        if self.credentials is None:
            raise ValueError("an insecure deployment admits any node: nothing to register")
        key = public_key or self.credentials.node_public_keys[index]
        text = self.flwr("supernode", "register", str(key), self.connection,
                         "--format", "json")
        found = re.search(r'"node-id":\s*(\d+)', text)
        if not found:
            raise DeploymentError(f"flwr supernode register printed no node id:\n{text}")
        self.node_ids[index] = int(found.group(1))
        return self.node_ids[index]

    def unregister_node(self, index: int) -> None:
        """Remove SuperNode ``index``'s key (``flwr supernode unregister``): the SuperLink
        refuses the node from then on, and the SuperNode, refused, ends itself (Flower 1.42:
        exit code 0); its process is no longer watched, and is stopped with the rest."""
        self.flwr("supernode", "unregister", str(self.node_ids.pop(index)), self.connection)
        p = self.procs.pop(f"supernode-{index}", None)
        if p is not None:
            self._retired.append(p)
            self._killed.append(p.pid)

    def start_node(self, index: int, *, name: str | None = None, key: Path | None = None,
                   root_certificates: Path | None = None, tls: bool | None = None) -> Path:
        """Start SuperNode ``index`` (``partition-id``), or start it again after
        ``kill_node``: a new Flower process that takes the partition over. Returns its log.

        ``name`` (default ``supernode-<index>``), ``key`` (its private key; default the
        deployment's ``node-<index>.key``), ``root_certificates`` (default the deployment's
        CA) and ``tls`` (default ``secure``) start a node that is not the deployment's own:
        one with an unregistered key, another CA or no TLS, which the SuperLink must
        refuse."""
        name = name or f"supernode-{index}"
        if name in self.procs:
            raise ValueError(f"{name} is running; kill_node({index}) first")
        tls = self.secure if tls is None else tls
        if tls and key is None and not 0 <= index < self.nodes:
            raise ValueError(f"SuperNode {index} has no key of this deployment (it made "
                             f"node-0 to node-{self.nodes - 1}); give key= for another node")
        transport = ["--insecure"]
        if tls:
            creds = self.credentials
            root = root_certificates or (creds.ca_certificate if creds else None)
            key = key or (creds.node_keys[index] if creds else None)
            if root is None:
                raise ValueError("a TLS node needs root certificates")
            transport = ["--root-certificates", str(root)]
            if key is not None:
                transport += ["--auth-supernode-private-key", str(key)]
        self._start(name, [
            "flower-supernode", *transport, "--superlink", f"127.0.0.1:{self.port}",
            "--port", str(free_port()),
            "--node-config", f"partition-id={index} num-partitions={self.nodes}"])
        return self.logs / f"{name}.log"

    def kill_node(self, index: int, name: str | None = None) -> None:
        """SIGKILL SuperNode ``index`` (or the node started as ``name``) and its process
        group, as a lost machine would end; the SuperLink learns of it only by its missed
        heartbeats."""
        p = self.procs.pop(name or f"supernode-{index}")
        self._killed.append(p.pid)  # its leftovers are stopped with the rest
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def _start(self, name: str, cmd: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("ab")  # a restarted node appends
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=self.out, env=self.env,
                                            start_new_session=True)
        log.close()

    def _wait_listening(self, port: int, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            time.sleep(0.2)
        raise DeploymentError(f"{name} did not listen on port {port} within {timeout:.0f} s"
                              + self.log_tails())

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise DeploymentError(f"{name} exited with code {p.returncode}"
                                      + self.log_tails())

    def stop(self) -> None:
        """Stop every process started here (its whole process group), by PID."""
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        for pgid in self._killed:  # children that outlived a killed node
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for p in self._retired:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        for p in self.procs.values():  # the group: children that outlived their parent too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        # Flower may start a process in a session of its own (outside these groups); every
        # process of this deployment carries its private FLWR_HOME, and nothing else does.
        # A killed process that is not our child (a grandchild, or one of those) dies a moment
        # later on a busy machine: wait until none is left, killing any that appears.
        deadline = time.monotonic() + 30
        while (pids := self.alive()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def alive(self) -> list[int]:
        """PIDs of live processes (zombies aside) started by this deployment: those in the
        process groups started here, and any other whose environment holds its FLWR_HOME."""
        groups = {p.pid for p in self.procs.values()} | set(self._killed)
        marker = f"FLWR_HOME={self.home}".encode()
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if fields[0] == "Z" or int(stat.parent.name) == os.getpid():
                    continue
                if (int(fields[2]) in groups
                        or marker in (stat.parent / "environ").read_bytes().split(b"\0")):
                    pids.append(int(stat.parent.name))
        return pids

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted(self.logs.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"\n--- {path.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "".join(out)

    # ------------------------------------------------------------------ flwr CLI

    def flwr(self, *args: str, timeout: float = 120.0) -> str:
        try:
            done = subprocess.run(["flwr", *args], capture_output=True, text=True, env=self.env,
                                  timeout=timeout, cwd=self.out, check=False)
        except subprocess.TimeoutExpired as e:
            raise DeploymentError(f"flwr {' '.join(args)} timed out" + self.log_tails()) from e
        if done.returncode:
            said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            raise DeploymentError(f"flwr {' '.join(args)} failed ({done.returncode}):\n"
                                  f"{done.stdout}\n{done.stderr}" + self.log_tails(),
                                  summary=f"flwr {args[0]} failed ({done.returncode})"
                                  + (f": {said[-1].strip()}" if said else ""))
        return done.stdout

    def submit(self, run_config: Mapping[str, FlowerValue], project: Path | None = None
               ) -> int:
        """``flwr run`` the project (or another app's, on the same deployment); returns the
        run id."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        args = ["run", str(project or self.project), self.connection]
        if overrides:
            args += ["--run-config", overrides]
        text = self.flwr(*args)
        found = re.search(r"started run (\d+)", text)
        if not found:
            raise DeploymentError(f"flwr run printed no run id:\n{text}" + self.log_tails())
        return int(found.group(1))

    def run_row(self, run_id: int) -> dict:
        """Flower's record of the run (``flwr ls --format json``): status, status details,
        times and traffic."""
        text = self.flwr("ls", self.connection, "--run-id", str(run_id), "--format", "json")
        return dict(json.loads(text[text.index("{"):])["runs"][0])

    def status(self, run_id: int) -> str:
        return str(self.run_row(run_id)["status"])

    def wait(self, run_id: int, timeout: float) -> str:
        """Block until the run is finished; returns Flower's final status. The status
        details of a run that did not complete are kept in ``details``.

        Each look is a ``flwr ls``, a process that imports Flower's command line (about 1.8 s
        of a core here), so the looks thin out while the run goes on (``STATUS_WAITS``): a
        look every 2 s took most of a core for as long as a run lasted."""
        deadline = time.monotonic() + timeout
        self.details = ""
        waits = iter(STATUS_WAITS)
        while time.monotonic() < deadline:
            self._check_alive()
            row = self.run_row(run_id)
            status = str(row["status"])
            if status.startswith("finished"):
                detail = str(row.get("status-details") or "")
                self.details = "" if detail in ("", "N/A") else detail
                return status
            time.sleep(min(next(waits, STATUS_WAITS[-1]),
                           max(0.0, deadline - time.monotonic())))
        raise DeploymentError(f"run {run_id} did not finish within {timeout:.0f} s"
                              + self.log_tails())


class LocalSimulation(Loopback):
    """``flwr run`` of the app on Flower's local simulation runtime: ``nodes`` virtual
    SuperNodes in one machine, no processes of ours. ``flwr run`` starts a detached local
    SuperLink (``flower-superlink --simulation``) and leaves it running; it carries this
    deployment's private FLWR_HOME, so ``stop`` finds and stops it and everything it
    started."""

    connection = "local"

    def __init__(self, nodes: int, out: Path, project: Path = PROJECT) -> None:
        # one machine, no network between its virtual SuperNodes: nothing to encrypt
        super().__init__(nodes, out, project, secure=False)

    def __enter__(self) -> LocalSimulation:  # noqa: PYI034
        self._prepare(f'address = ":local:"\noptions.num-supernodes = {self.nodes}\n')
        return self

    def stop(self) -> None:
        """Stop the detached SuperLink and its simulation: SIGTERM, then SIGKILL."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)

    def _check_alive(self) -> None:
        pass  # no processes of ours to watch: flwr ls reports the run's fate


def run_loopback(nodes: int, out: Path, run_config: Mapping[str, FlowerValue],
                 timeout: float = 900.0, project: Path = PROJECT, secure: bool = True
                 ) -> tuple[Path, str]:
    """Deploy on loopback (with TLS and SuperNode authentication unless ``secure`` is
    False), run the app to the end, stop everything.

    ``flower.run_dir`` defaults to ``<out>/run`` and ``flower.min_nodes`` to ``nodes``.

    Returns:
        (run directory, Flower's final status, e.g. "finished:completed").
    """
    out = out.resolve()
    cfg = {"flower.run_dir": str(out / "run"), "flower.min_nodes": nodes, **run_config}
    check_run_config(cfg, project)
    with Loopback(nodes, out, project, secure) as deployment:
        run_id = deployment.submit(cfg)
        status = deployment.wait(run_id, timeout)
        if status != "finished:completed":
            reason = f": {deployment.details}" if deployment.details else ""
            raise DeploymentError(f"run {run_id} ended {status}{reason} (logs in "
                                  f"{deployment.logs})" + deployment.log_tails(),
                                  summary=f"run {run_id} ended {status}{reason}")
    return Path(str(cfg["flower.run_dir"])), status


def declared_keys(project: Path = PROJECT) -> dict[str, FlowerValue]:
    """The run-config keys the app declares (``[tool.flwr.app.config]`` of its
    ``pyproject.toml``), flattened to dotted names, with their defaults."""
    table = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"]
    flat: dict[str, FlowerValue] = {}

    def walk(prefix: str, node: Mapping) -> None:
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(value, Mapping):
                walk(name, value)
            else:
                flat[name] = value

    walk("", table)
    return flat


def check_run_config(run_config: Mapping[str, FlowerValue], project: Path = PROJECT) -> None:
    """Refuse, before anything starts, what Flower or the app would refuse later: a key the
    app does not declare (Flower: "Invalid run configuration", the key only in the
    SuperLink's log) or a value dcco refuses (a failed run). Raises ``ConfigError`` naming
    the key."""
    declared = declared_keys(project)
    for key in run_config:
        if key not in declared:
            close = difflib.get_close_matches(key, list(declared), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"run-config key '{key}' is not declared by the app "
                              f"({project / 'pyproject.toml'}, [tool.flwr.app.config]){hint}")
    parse_run_config({**declared, **run_config})


def seconds_per_round(run_dir: Path) -> list[float]:
    """Wall seconds per round of each metrics window (``1 / rounds_per_sec``)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [1 / r["rounds_per_sec"] for r in map(json.loads, lines) if "rounds_per_sec" in r]


def _parse_set(items: list[str]) -> dict[str, FlowerValue]:
    out: dict[str, FlowerValue] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = text  # a bare string
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3, help="SuperNodes (default 3)")
    ap.add_argument("--out", type=Path, required=True, help="folder for logs and the run")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="KEY=VALUE", help="a run-config override, e.g. train.rounds=5")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    ap.add_argument("--insecure", action="store_true",
                    help="plaintext, and any process may join as a SuperNode: for local tests "
                         "only (default: TLS under a throwaway CA and registered SuperNodes)")
    ap.add_argument("--verbose", action="store_true",
                    help="on failure, print the tails of the processes' logs too")
    ap.add_argument("--timing", action="store_true",
                    help="time every message and exchange (dcco.flower.timing) and print "
                         "where a round's seconds go")
    ap.add_argument("--record", type=Path, default=None, metavar="JSON",
                    help="with --timing: add this run's row to a JSON record (rows of "
                         "method, secagg, s_per_round and breakdown)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    _stop_on_signals()
    if args.timing:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = args.out.resolve() / "timing.jsonl"
        stamp.unlink(missing_ok=True)
        os.environ[timing.ENV] = str(stamp)  # every process of the deployment inherits it
    try:
        run_dir, status = run_loopback(args.nodes, args.out, _parse_set(args.overrides),
                                       args.timeout, secure=not args.insecure)
    except ConfigError as e:
        print(f"dcco loopback: {e}", file=sys.stderr)
        return 2
    except DeploymentError as e:
        print(f"dcco loopback: {e if args.verbose else e.summary}", file=sys.stderr)
        if not args.verbose:
            print(f"dcco loopback: the processes' logs are in {args.out.resolve() / 'logs'} "
                  f"(--verbose prints their tails)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dcco loopback: interrupted; every process it started has been stopped",
              file=sys.stderr)
        return 130
    except Stopped as e:
        print(f"dcco loopback: stopped by {e}; every process it started has been stopped",
              file=sys.stderr)
        return 128 + e.signum
    per_round = seconds_per_round(run_dir)
    print(f"run {status}: {run_dir} ({time.perf_counter() - started:.0f} s in all, "
          f"{args.nodes} SuperNodes, "
          + ("plaintext, any node admitted)" if args.insecure else
             "TLS, registered SuperNodes only)"))
    print("seconds per round, by metrics window: "
          + ", ".join(f"{s:.2f}" for s in per_round))
    if args.timing:
        parts = timing.breakdown(Path(os.environ[timing.ENV]))
        print("per exchange (mean s): " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
        if args.record is not None:
            cfg = json.loads(json.dumps(_parse_set(args.overrides)))
            summary = json.loads((run_dir / "summary.json").read_text())
            row = {"method": summary.get("method"), "secagg": bool(cfg.get("flower.secagg")),
                   "nodes": args.nodes, "overrides": cfg,
                   "command": "python -m dcco.flower.testing.loopback " + " ".join(
                       sys.argv[1:] if argv is None else argv),
                   "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                   "s_per_round": sum(per_round[1:] or per_round) / len(per_round[1:] or
                                                                          per_round),
                   "breakdown": parts}
            record = (json.loads(args.record.read_text()) if args.record.is_file()
                      else {"rows": []})
            record["rows"].append(row)
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
