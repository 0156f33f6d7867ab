"""A real Flower deployment on 127.0.0.1: one SuperLink, N SuperNodes, the dcco app.

Starts ``flower-superlink --insecure`` and N ``flower-supernode --insecure`` processes, each
node with its own ``--node-config "partition-id=i num-partitions=N"`` and runtime port, in a
private ``FLWR_HOME`` (nothing in the user's home is touched) with
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``; submits the app with ``flwr run``; waits
until Flower reports the run finished; and stops every process it started (each in its own
process group, so the SuperExec, ServerApp and ClientApp processes they spawn go with them),
also on a timeout, an error or Ctrl-C. Logs of every process are kept in ``<out>/logs``.

    python -m dcco.flower.loopback --nodes 3 --out runs/loopback \\
        --set train.rounds=10 --set train.clients_per_round=16

prints the run directory and the wall time per round (from ``metrics.jsonl``). The same
commands by hand are in docs/flower.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from dcco.flower.appconfig import FlowerValue

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CONNECTION = "loopback"
PROJECT = Path(__file__).resolve().parents[3]
"""The project whose ``pyproject.toml`` declares the app (this source checkout)."""


class DeploymentError(RuntimeError):
    """The deployment failed; the message carries the tail of the processes' logs."""


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
    """

    def __init__(self, nodes: int, out: Path, project: Path = PROJECT) -> None:
        if nodes < 1:
            raise ValueError(f"a deployment needs at least one SuperNode, got {nodes}")
        self.nodes, self.out, self.project = nodes, out.resolve(), project
        self.logs = self.out / "logs"
        self.home = self.out / "flwr-home"
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        # Flower's commands (flower-superlink, flwr, and the flwr-clientapp a SuperNode
        # starts) come from this interpreter's environment first, so a virtual environment
        # works without being activated.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = os.environ | {"FLWR_HOME": str(self.home),
                                 "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                                 "PYTHONUNBUFFERED": "1", "PATH": path}

    # ------------------------------------------------------------------ processes

    def __enter__(self) -> Loopback:  # noqa: PYI034
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        try:
            self._start("superlink", ["flower-superlink", "--insecure", "--port", str(self.port),
                                      "--database", str(self.out / "superlink.db")])
            self._wait_listening(self.port, "superlink", 60.0)
            for i in range(self.nodes):
                self._start(f"supernode-{i}", [
                    "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                    "--port", str(free_port()),
                    "--node-config", f"partition-id={i} num-partitions={self.nodes}"])
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self, name: str, cmd: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("wb")
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
        for p in self.procs.values():  # the group: children that outlived their parent too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def alive(self) -> list[int]:
        """PIDs of live processes (zombies aside) in the process groups started here."""
        groups = {p.pid for p in self.procs.values()}
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[2]) in groups:
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
            raise DeploymentError(f"flwr {' '.join(args)} failed ({done.returncode}):\n"
                                  f"{done.stdout}\n{done.stderr}" + self.log_tails())
        return done.stdout

    def submit(self, run_config: Mapping[str, FlowerValue]) -> int:
        """``flwr run`` the project; returns the run id."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        args = ["run", str(self.project), CONNECTION]
        if overrides:
            args += ["--run-config", overrides]
        text = self.flwr(*args)
        found = re.search(r"started run (\d+)", text)
        if not found:
            raise DeploymentError(f"flwr run printed no run id:\n{text}" + self.log_tails())
        return int(found.group(1))

    def status(self, run_id: int) -> str:
        text = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        runs = json.loads(text[text.index("{"):])["runs"]
        return str(runs[0]["status"])

    def wait(self, run_id: int, timeout: float) -> str:
        """Block until the run is finished; returns Flower's final status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            time.sleep(2.0)
        raise DeploymentError(f"run {run_id} did not finish within {timeout:.0f} s"
                              + self.log_tails())


def run_loopback(nodes: int, out: Path, run_config: Mapping[str, FlowerValue],
                 timeout: float = 900.0, project: Path = PROJECT) -> tuple[Path, str]:
    """Deploy on loopback, run the app to the end, stop everything.

    ``flower.run_dir`` defaults to ``<out>/run`` and ``flower.min_nodes`` to ``nodes``.

    Returns:
        (run directory, Flower's final status, e.g. "finished:completed").
    """
    out = out.resolve()
    cfg = {"flower.run_dir": str(out / "run"), "flower.min_nodes": nodes, **run_config}
    with Loopback(nodes, out, project) as deployment:
        run_id = deployment.submit(cfg)
        status = deployment.wait(run_id, timeout)
        if status != "finished:completed":
            raise DeploymentError(f"run {run_id} ended {status}" + deployment.log_tails())
    return Path(str(cfg["flower.run_dir"])), status


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
    args = ap.parse_args(argv)
    started = time.perf_counter()
    try:
        run_dir, status = run_loopback(args.nodes, args.out, _parse_set(args.overrides),
                                       args.timeout)
    except DeploymentError as e:
        print(f"dcco loopback: {e}", file=sys.stderr)
        return 1
    per_round = seconds_per_round(run_dir)
    print(f"run {status}: {run_dir} ({time.perf_counter() - started:.0f} s in all, "
          f"{args.nodes} SuperNodes)")
    print("seconds per round, by metrics window: "
          + ", ".join(f"{s:.2f}" for s in per_round))
    return 0


if __name__ == "__main__":
    sys.exit(main())
