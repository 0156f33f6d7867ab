"""One GPU session, start to end: the measurements that wait for a GPU, within a time budget
sized for a lent machine's 15 minutes of device time (``--minutes 9``: docs/performance.md,
"A GPU session").

On a lent GPU machine (bare, no network, minutes counted) or a researcher's own, with dcco
importable and a budget in minutes, ``run``:

1. records the machine (``machine.json``: GPU, driver, torch, CPU, the code's commit);
2. runs the `full`-scale round-cost ladder (``benchmarks/round_cost.py``), cut to the rungs
   that decide ``auto`` on CUDA (eager float32, + bf16, + compile, + CUDA graphs) for DCCO
   and contrastive FedAvg (a third of the budget, at most 3 minutes); it writes after every
   rung;
3. profiles one round of the grid's non-IID 4 DCCO cell (``benchmarks/round_profile.py``),
   only when ``--profile-minutes`` gives it time;
4. runs the recipe pilot (``benchmarks/recipe_pilot.py``): centralized CCO at each candidate
   scale side by side, and picks the grid's scale by a rule fixed beforehand (a quarter, at
   most 2.5 minutes);
5. runs the precision check (``benchmarks/precision_check.py``): eager float32 against bf16 +
   compile, the same seed, the k-NN monitor within 1 point (a sixth, at most 1.5 minutes);
   the ladder, the pilot and the precision check run once on a GPU: once a GPU's record of
   one is committed, its default share is none (``phase_shares``);
6. gives the rest of the budget to ``dcco reproduce GRID --scale PICKED --jobs 2
   --time-budget M``, the cells in ``CELL_ORDER`` (DCCO and centralized CCO at non-IID 4,
   seed 0, first); cells stop at a checkpoint when it ends;
7. packs every small record (the phases' records, the cells' config, metrics, summary and
   version files, the logs) into one ``records.tar.gz`` of at most 16 MiB, and the unfinished
   cells' checkpoints that the next lease can carry into ``checkpoints.tar.part<k>`` files of
   at most 16 MiB each (``unpack`` joins them and puts them back in the grid's folder).

Each phase is a process with its share of the budget (``--ladder-minutes``, ...); one that
overruns is interrupted and recorded as such in ``session.json``, which is rewritten after
every phase, and the session goes on. ``--detach`` starts the session in a new process
session (so that it outlives the command that started it) and returns at once; follow its
``session.log`` and collect the archive with later, shorter commands. ``DONE`` appears in
``--out`` when the archive is written.

On the project's CPU machine, ``prepare`` puts what a bare lent machine lacks into ``.gpu/``
(in .gitignore; the device tool's ``carry`` takes it along): the wheels of kornia and kornia_rs
for its Python 3.12, the Fashion-MNIST files, and the commit. The exact commands are in
docs/performance.md ("A GPU session").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE_LIMIT = 16 << 20
"""The most one file may hold to come back from a lent machine."""
CARRY_LIMIT = 64 << 20
"""The most one device call's working tree may hold: tracked and untracked-not-ignored files,
and the carried paths (``.gpu/``, and the unfinished cells' checkpoints)."""
CARRY_MARGIN = 1 << 20
"""Left free under ``CARRY_LIMIT`` for the records a session adds to the tree."""
CELL_ORDER = ("non-iid-4-dcco-s0", "centralized_cco-s0", "non-iid-4-contrastive_fedavg-s0",
              "supervised-s0", "non-iid-4-dcco-s1", "centralized_cco-s1",
              "non-iid-4-contrastive_fedavg-s1", "supervised-s1", "non-iid-4-dcco-s2",
              "centralized_cco-s2", "non-iid-4-contrastive_fedavg-s2", "supervised-s2",
              "non-iid-4-cco_fedavg-s0", "non-iid-16-dcco-s0",
              "non-iid-16-contrastive_fedavg-s0", "*-s0", "*")
"""The order the cells start in (``dcco reproduce --cells``), each named, never left to a
pattern's alphabetical order: DCCO at non-IID 4 and centralized CCO (seed 0) first, then
what the verdict sets them beside (contrastive FedAvg at non-IID 4, supervised training),
then seeds 1 and 2 of those cells, so that the verdict at non-IID 4 gets the seeds it needs
to be decided (the third lease, 2026-11-28, finished seed 0's three and left each difference
"undecided" on one seed), then CCO + FedAvg at non-IID 4 (the other FedAvg, far below
contrastive FedAvg at the `gpu-paper` scale), then non-IID 16, then the rest. Finished cells
are skipped."""
PILOT_SCALES = ("gpu", "gpu-paper", "gpu-lars", "gpu-warmup")
"""The recipes the pilot (``benchmarks/recipe_pilot.py``) weighs, in its tie order: the
`gpu` scale's, chosen on the CPU (docs/results/collapse.md), then the paper's Adam 5e-3,
LARS and Adam 5e-3 with a long warm-up."""
GPU_RUNGS = ("eager float32", "+ bf16", "+ compile", "+ CUDA graphs")
"""The ladder's rungs that decide ``auto`` on CUDA (precision and compilation)."""
CELL_FILES = ("config.toml", "metrics.jsonl", "summary.json", "version.json")
"""What a grid cell keeps in the repository (the checkpoints stay behind)."""
JOBS = 2
"""Cells side by side. The first lease (2026-11-27, an H100) ran eight (``--jobs auto``): 42
rounds/s together, the GPU full, so each ran at a fifth of its speed alone and none finished
in the lease; and a `gpu`-scale checkpoint (35 to 60 MiB) does not fit what the next lease can
carry (``carry_budget``), so an unfinished cell starts again. Two side by side keep the GPU
busy and finish the decisive cells first."""
WHEELS = ("kornia==0.9.0", "kornia_rs==0.2.0")
"""What dcco needs that a lent GPU machine's image lacks (KINDS.md's package list)."""


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _say(text: str) -> None:
    print(f"[{_now()}] {text}", flush=True)


def _write_json(path: Path, record: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ prepare


def prepare(args: argparse.Namespace) -> int:
    """Fill ``.gpu/`` for a lent machine: wheels, data, commit."""
    folder = ROOT / ".gpu"
    (folder / "whl").mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                    "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
                    "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d",
                    str(folder / "whl"), *WHEELS], check=True)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        source = args.data_dir / name
        if not source.is_file():
            raise SystemExit(f"prepare: {source} is missing; install dataset-fashion-mnist or "
                             f"give --data-dir")
        shutil.copy2(source, data / name)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
                           capture_output=True, text=True, check=False).stdout.strip()
    (folder / "commit.txt").write_text(commit + ("+dirty" if dirty else "") + "\n")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"wrote {folder} ({size / 2**20:.1f} MiB); carry '.gpu' with the device tool and "
          f"start the session as docs/performance.md ('A GPU session') shows")
    return 0


# ------------------------------------------------------------------------------ run


def machine_record(out: Path) -> dict:
    import torch

    record = {"python": platform.python_version(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "platform": platform.platform(),
              "cpus": os.cpu_count(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        record |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                   "multiprocessors": props.multi_processor_count}
        smi = shutil.which("nvidia-smi")
        if smi:
            record["nvidia_smi"] = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                 "--format=csv,noheader"], capture_output=True, text=True,
                check=False).stdout.strip()
    commit = ROOT / ".gpu" / "commit.txt"
    record["commit"] = (commit.read_text().strip() if commit.is_file()
                        else os.environ.get("DCCO_SOURCE_COMMIT", "unknown"))
    from dcco.run.rundir import code_version

    record["code"] = code_version()
    _write_json(out / "records" / "machine.json", record)
    return record


def gpu_record(prefix: str) -> Path | None:
    """A committed record of a phase (``round_cost``, ``recipe_pilot``, ``precision_check``)
    made on a GPU, if any: the ladder, the pilot and the precision check run once on CUDA,
    and a later lease gives their minutes to the cells."""
    found = sorted(p for p in (ROOT / "benchmarks" / "results").glob(f"{prefix}_*.json")
                   if "_cpu" not in p.stem)
    return found[0] if found else None


def picked_scale(record: Path | None, default: str) -> tuple[str, str]:
    """The scale a recipe pilot's record picked, and why; ``default`` (and why) when there
    is no record, or it picked none."""
    if record is None or not record.is_file():
        return default, f"no pilot record: the grid runs --scale {default}"
    data = json.loads(record.read_text())
    if data.get("picked"):
        return data["picked"], f"the pilot ({record.name}) picked it: {data['why']}"
    return default, f"the pilot ({record.name}) picked none ({data.get('why')}); {default}"


def phase_shares(minutes: float, on_gpu: bool, ladder: float | None,
                 precision: float | None,
                 pilot: float | None = None) -> dict[str, tuple[float, Path | None]]:
    """The ladder's, the recipe pilot's and the precision check's minutes, and the GPU
    record that made a phase's default none: a third of the budget (at most 3 min), a
    quarter (at most 2.5 min) and a sixth (at most 1.5 min) unless asked for (``ladder``,
    ``pilot``, ``precision``), none on a GPU once a GPU's record is committed.

    The precision check's record counts at any scale: four checks on the H100 (2026-11-27)
    could not tell bf16 from the GPU's run-to-run noise, and bf16 buys a tenth of a round's
    arithmetic (the ladder) where a `gpu` cell's round is 40 to 45 ms against 13 to 15 ms of
    compiled arithmetic (the third lease's cells): its minute and a half is worth more to
    the grid, where it decides whether a second pair of cells finishes (docs/performance.md,
    "A GPU session")."""
    shares = {}
    for name, asked, prefix, share, most in (
            ("ladder", ladder, "round_cost", 1 / 3, 3.0),
            ("pilot", pilot, "recipe_pilot", 1 / 4, 2.5),
            ("precision", precision, "precision_check", 1 / 6, 1.5)):
        done = gpu_record(prefix) if on_gpu and asked is None else None
        shares[name] = (asked if asked is not None else 0.0 if done is not None
                        else min(most, share * minutes), done)
    return shares


def run_phase(name: str, command: list[str], seconds: float, log: Path,
              session: dict, session_path: Path) -> None:
    """One phase as a process with ``seconds`` to run (SIGINT past them, SIGKILL 20 s
    later), its output appended to ``log`` and its outcome to the session record."""
    _say(f"{name}: {' '.join(command)} ({seconds / 60:.1f} min at most)")
    start = time.monotonic()
    entry = {"phase": name, "command": " ".join(command), "minutes_allowed": seconds / 60}
    if seconds <= 1:
        entry |= {"outcome": "skipped: no time left"}
    else:
        with open(log, "a") as fh:
            fh.write(f"\n===== {name} ({_now()})\n")
            fh.flush()
            # its own process group, so that a phase's children (the precision check's two
            # runs, the grid's cells) are stopped with it
            process = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT,
                                       cwd=ROOT, start_new_session=True)
            timed_out = False
            try:
                process.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _signal_group(process, signal.SIGINT)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    _signal_group(process, signal.SIGKILL)
                    process.wait()
        entry |= {"returncode": process.returncode, "timed_out": timed_out,
                  "outcome": "interrupted at its time limit" if timed_out else
                  "ok" if process.returncode == 0 else f"failed ({process.returncode})"}
    entry["minutes"] = round((time.monotonic() - start) / 60, 2)
    session["phases"].append(entry)
    _write_json(session_path, session)
    _say(f"{name}: {entry['outcome']} after {entry['minutes']:.1f} min")


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def pack(out: Path, grid_out: Path) -> Path:
    """``records.tar.gz``: the records, the session files, and the small files of every cell
    of the grid folder; logs are dropped, largest first, if the archive would pass the
    limit."""
    files: list[tuple[Path, str]] = []
    for path in sorted((out / "records").rglob("*")):
        if path.is_file():
            files.append((path, f"records/{path.relative_to(out / 'records')}"))
    for name in ("session.json", "session.log"):
        if (out / name).is_file():
            files.append((out / name, name))
    if grid_out.is_dir():
        for cell in sorted(p for p in grid_out.iterdir() if p.is_dir()):
            keep = CELL_FILES if not cell.name.startswith(".") else ()
            for name in keep:
                if (cell / name).is_file():
                    files.append((cell / name, f"{grid_out.name}/{cell.name}/{name}"))
        for path in sorted((grid_out / ".logs").glob("*.log")):
            files.append((path, f"{grid_out.name}/.logs/{path.name}"))
        if (grid_out / "results.md").is_file():
            files.append((grid_out / "results.md", f"{grid_out.name}/results.md"))
    archive = out / "records.tar.gz"
    logs = sorted((f for f in files if f[1].endswith(".log")),
                  key=lambda f: f[0].stat().st_size)
    while True:
        tmp = archive.with_suffix(".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for path, arcname in files:
                tar.add(path, arcname=arcname)
        if tmp.stat().st_size <= ARCHIVE_LIMIT or not logs:
            os.replace(tmp, archive)
            break
        files.remove(logs.pop())  # the largest log goes first
    return archive


def tree_bytes() -> int:
    """The bytes of the working tree that travels to a lent machine, less any checkpoint (the
    next lease carries its own): where this is a git checkout, the tracked and
    untracked-not-ignored files and ``.gpu/``; elsewhere (a lent machine's copy) every file
    under the repository but ``.git``."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, check=False)
    if listed.returncode == 0:
        files = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
        files += list((ROOT / ".gpu").rglob("*"))
    else:
        files = [p for p in ROOT.rglob("*") if p.relative_to(ROOT).parts[0] != ".git"]
    return sum(p.stat().st_size for p in files
               if p.is_file() and p.name != "checkpoint.safetensors")


def carry_budget() -> int:
    """The bytes of checkpoints the next lease can carry beside this tree and ``.gpu/``."""
    return max(0, CARRY_LIMIT - CARRY_MARGIN - tree_bytes())


def unfinished_checkpoints(grid_out: Path) -> list[Path]:
    """The checkpoints of the cells whose pretraining stopped before its last round (no
    ``final_loss`` in their summary), the most advanced first: what the next session needs to
    resume them."""
    found = []
    for cell in sorted(p for p in grid_out.glob("*") if p.is_dir() and p.name[0] != "."):
        checkpoint = cell / "checkpoint.safetensors"
        summary = cell / "summary.json"
        done = summary.is_file() and "final_loss" in json.loads(summary.read_text() or "{}")
        if checkpoint.is_file() and not done:
            rounds = [json.loads(line).get("round", 0) for line in
                      (cell / "metrics.jsonl").read_text().splitlines()] if (
                cell / "metrics.jsonl").is_file() else [0]
            found.append((max(rounds, default=0), checkpoint))
    return [c for _, c in sorted(found, key=lambda x: -x[0])]


def pack_checkpoints(out: Path, grid_out: Path, budget: int) -> dict:
    """``checkpoints.tar.part<k>``: the unfinished cells' checkpoints (most advanced first), as
    many as fit in ``budget`` bytes (what the next lease can carry, ``carry_budget``), cut in
    parts of at most ``ARCHIVE_LIMIT`` (a returned file's limit); ``unpack`` joins them again.
    Returns what was carried and what was left behind (those cells start again at round 0)."""
    for old in out.glob("checkpoints.tar.part*"):
        old.unlink()
    chosen, left, total = [], [], 0
    for checkpoint in unfinished_checkpoints(grid_out):
        size = checkpoint.stat().st_size
        if total + size > budget:
            left.append({"cell": checkpoint.parent.name, "bytes": size})
            continue
        chosen.append(checkpoint)
        total += size
    record = {"budget_bytes": budget, "left_behind": left,
              "carried": [{"cell": c.parent.name, "bytes": c.stat().st_size} for c in chosen]}
    if left:
        sizes = ", ".join(f"{x['cell']} {x['bytes'] / 2**20:.1f} MiB" for x in left)
        _say(f"checkpoints: {len(left)} unfinished cells' checkpoints ({sizes}) do not "
             f"fit the {budget / 2**20:.1f} MiB the next lease can carry beside the tree and "
             f".gpu/: those cells start again at round 0")
    if not chosen:
        return record
    whole = out / "checkpoints.tar"
    with tarfile.open(whole, "w") as tar:  # weights hardly compress; plain tar
        for checkpoint in chosen:
            tar.add(checkpoint, arcname=f"{grid_out.name}/{checkpoint.parent.name}/"
                                        f"{checkpoint.name}")
    parts = []
    with open(whole, "rb") as fh:
        while chunk := fh.read(ARCHIVE_LIMIT):
            part = out / f"checkpoints.tar.part{len(parts)}"
            part.write_bytes(chunk)
            parts.append(part)
    whole.unlink()
    record["parts"] = [p.name for p in parts]
    return record


def run(args: argparse.Namespace) -> int:
    if args.detach:
        return detach(args)
    out = args.out
    (out / "records").mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * args.minutes
    session_path, log = out / "session.json", out / "phases.log"
    session: dict = {"minutes": args.minutes, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "phases": []}
    record = machine_record(out)
    if record["commit"] != "unknown":  # the cells' version.json, where git is not
        os.environ.setdefault("DCCO_SOURCE_COMMIT", record["commit"])
    session["machine"] = record.get("gpu", "cpu")
    session["tree"] = str(ROOT)
    _write_json(session_path, session)
    on_gpu = record["cuda_available"] and args.device != "cpu"
    _say(f"machine: {session['machine']}, torch {record['torch']}; budget "
         f"{args.minutes:g} min")
    session["carry_budget_bytes"] = carry_budget()
    _write_json(session_path, session)
    py = sys.executable
    records = str(out / "records")
    reserve = max(10.0, 0.02 * 60 * args.minutes)  # for the pack at the end
    shares = phase_shares(args.minutes, on_gpu, args.ladder_minutes, args.precision_minutes,
                          args.pilot_minutes)

    def left() -> float:
        return deadline - time.monotonic() - reserve

    overrides = [x for s in args.set for x in ("--set", s)]
    rungs = args.ladder_steps or (list(GPU_RUNGS) if on_gpu else ["eager float32"])
    steps = ["--steps", *rungs]
    methods = ["--methods", *args.ladder_methods] if args.ladder_methods else []
    pilot_record = out / "records" / "recipe_pilot.json"
    pilot_share = shares["pilot"]
    phases = [
        ("ladder", [py, "benchmarks/round_cost.py", "--scale", args.ladder_scale, "--device",
                    "cuda" if on_gpu else "cpu", "--out", records, *steps, *methods],
         shares["ladder"]),
        ("profile", [py, "benchmarks/round_profile.py", "--grid", str(args.grid), "--scale",
                     args.scale, "--warmup", str(args.profile_warmup), "--out", records,
                     *overrides], (args.profile_minutes, None)),
        ("pilot", [py, "benchmarks/recipe_pilot.py", "--grid", str(args.grid), "--scales",
                   *args.pilot_scales, "--rounds", str(args.pilot_rounds), "--jobs",
                   str(len(args.pilot_scales)), "--out", str(out / "pilot-work"), "--record",
                   str(pilot_record)], pilot_share),
    ]
    for name, command, (minutes, done) in phases:
        _phase(name, command, minutes, done, left, log, session, session_path)
    scale, why = picked_scale(pilot_record if pilot_record.is_file() else pilot_share[1],
                              args.scale)
    session["scale"], session["scale_why"] = scale, why
    _say(f"the grid's scale: {scale} ({why})")
    grid_out = args.grid_out or Path("experiments/results") / f"{args.grid.stem}-{scale}"
    precision = shares["precision"]
    _phase("precision", [py, "benchmarks/precision_check.py", "--grid", str(args.grid),
                         "--scale", scale, "--tag", scale, "--rounds",
                         str(args.precision_rounds), "--knn-every",
                         str(max(1, args.precision_rounds // 4)), "--fast-precision", "bf16",
                         "--fast-compile", "on" if on_gpu else "off", "--work",
                         str(out / "precision-work"), "--out", records, *overrides],
           *precision, left, log, session, session_path)
    # the grid's own start-up and table come out of its share
    grid_minutes = (left() - max(5.0, min(30.0, 0.05 * 60 * args.minutes))) / 60
    grid_command = [py, "-m", "dcco", "reproduce", str(args.grid), "--scale", scale,
                    "--out", str(grid_out), "--jobs", args.jobs, "--time-budget",
                    f"{max(grid_minutes, 0.01):.2f}", "--no-progress",
                    *[x for p in args.cells for x in ("--cells", p)]]
    if grid_minutes > 0.05:
        # its own budget stops it; the phase limit is a backstop a few minutes later
        run_phase("grid", grid_command, left() + min(180.0, 0.1 * 60 * args.minutes), log,
                  session, session_path)
    else:
        run_phase("grid", grid_command, 0, log, session, session_path)
    args.grid_out = grid_out
    session["checkpoints"] = pack_checkpoints(out, args.grid_out,
                                              session["carry_budget_bytes"])
    archive = pack(out, args.grid_out)
    session["archive"] = {"path": str(archive), "bytes": archive.stat().st_size}
    session["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
    _write_json(session_path, session)
    archive = pack(out, args.grid_out)  # again, with the final session record in it
    (out / "DONE").write_text(f"{archive}\n")
    _say(f"wrote {archive} ({archive.stat().st_size / 2**20:.2f} MiB); session over")
    return 0


def _phase(name: str, command: list[str], minutes: float, done: Path | None,
           left, log: Path, session: dict, session_path: Path) -> None:
    """One phase with its share of minutes, or its record of being skipped (``done``: the
    committed record that made its share none)."""
    if minutes <= 0:
        why = (f"skipped: a GPU's record exists ({done.relative_to(ROOT)}); "
               f"--{name}-minutes runs it again" if done is not None
               else "skipped: not asked for (0 minutes)")
        session["phases"].append({"phase": name, "command": " ".join(command),
                                  "minutes_allowed": 0, "minutes": 0, "outcome": why})
        _say(f"{name}: {why}")
        _write_json(session_path, session)
        return
    run_phase(name, command, min(60 * minutes, left()), log, session, session_path)


def detach(args: argparse.Namespace) -> int:
    """Start this session in a new process session, from a copy of the tree outside it
    (``session_tree``), output to ``--out``/session.log: a lent machine's device tool copies
    the working tree afresh at every call, which would change or delete the files of a
    session running inside it."""
    args.out.mkdir(parents=True, exist_ok=True)
    tree = session_tree(args.out)
    argv = [a for a in sys.argv[1:] if a != "--detach"]
    log = args.out / "session.log"
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(
        str(tree / Path(p).resolve().relative_to(ROOT)) if _inside(p, ROOT) else p
        for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    with open(log, "a") as fh:
        process = subprocess.Popen([sys.executable, str(tree / "benchmarks" / "gpu_session.py"),
                                    *argv], stdout=fh, stderr=subprocess.STDOUT, cwd=tree,
                                   env=env, start_new_session=True)
    print(f"started the session as process {process.pid} in a new process session, from a "
          f"copy of the tree in {tree}; follow it with: tail -n 20 {log}; the archive is "
          f"{args.out / 'records.tar.gz'} once {args.out / 'DONE'} exists")
    return 0


SKIPPED_IN_COPY = (".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache",
                   ".hypothesis")
"""What the session's copy of the tree leaves out (``session_tree``)."""


def session_tree(out: Path) -> Path:
    """A copy of the tree (``.gpu`` included, ``SKIPPED_IN_COPY`` left out) in a folder of its
    own beside ``out``, for a detached session to run from."""
    tree = out.resolve().parent / f"{out.resolve().name}-tree"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*SKIPPED_IN_COPY), symlinks=True)
    return tree


def _inside(path: str, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root)
    except ValueError:
        return False
    return True


def record_tag(session: dict) -> str:
    """The name part of a session's records: the machine and the minute it started
    (``nvidia-h100-80gb-hbm3-2026-11-27-17-02``), so that two leases of one day keep apart."""
    import re

    started = session.get("started", "")[:16]
    return re.sub(r"[^a-z0-9]+", "-", f"{session.get('machine', 'cpu')} {started}".lower()
                  ).strip("-")


def unpack(args: argparse.Namespace) -> int:
    """Put an archive's records where the repository keeps them: the phases' records and the
    session's in ``benchmarks/results/`` (the session and machine records named by GPU and
    start time, ``record_tag``), the cells' small files in ``experiments/results/<grid
    folder>/`` (``--grid-folder`` renames it); logs stay in the archive. A file already there
    with other contents is never overwritten: nothing is placed, and the command names it
    (exit 2)."""
    results = args.into / "benchmarks" / "results"
    cells_root = args.into / "experiments" / "results"
    with tarfile.open(args.archive) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        session = json.load(tar.extractfile(members["session.json"]))
        tag = record_tag(session)
        targets: dict[Path, bytes] = {}
        for name, member in members.items():
            parts = Path(name).parts
            if name.endswith(".log") or (len(parts) > 1 and parts[1] == ".logs"):
                continue
            if parts[0] == "records":
                target = results / ({"machine.json": f"gpu_session_{tag}_machine.json",
                                     "recipe_pilot.json": f"recipe_pilot_{tag}.json"}
                                    .get(parts[-1], parts[-1]))
            elif name == "session.json":
                target = results / f"gpu_session_{tag}.json"
            elif len(parts) == 3 and parts[2] in CELL_FILES:
                target = cells_root / (args.grid_folder or parts[0]) / parts[1] / parts[2]
            else:
                continue
            targets[target] = tar.extractfile(member).read()
    clashes = [t for t, data in targets.items() if t.exists() and t.read_bytes() != data]
    if clashes:
        print(f"unpack: {len(clashes)} record(s) already in the repository with other "
              f"contents, e.g. {clashes[0].relative_to(args.into)}; nothing was placed "
              f"(move them, or --grid-folder for the cells)", file=sys.stderr)
        return 2
    for target, data in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    placed = [t.relative_to(args.into) for t in targets]
    parts = sorted(args.archive.parent.glob("checkpoints.tar.part*"),
                   key=lambda p: int(p.name.rsplit("part", 1)[1]))
    carried = []
    if parts:
        joined = args.archive.parent / "checkpoints.tar.joined"
        with open(joined, "wb") as fh:
            fh.writelines(part.read_bytes() for part in parts)
        with tarfile.open(joined) as tar:
            for member in tar.getmembers():
                parts_ = Path(member.name).parts
                if not member.isfile() or len(parts_) != 3 or parts_[2] != "checkpoint.safetensors":
                    continue
                target = cells_root / (args.grid_folder or parts_[0]) / parts_[1] / parts_[2]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                carried.append(target.relative_to(args.into))
        joined.unlink()
    print("\n".join(str(p) for p in sorted(placed)))
    print(f"{len(placed)} files placed; rewrite the grid's table with its reproduce "
          f"command (--table-only) and commit them")
    if carried:
        print("unfinished cells' checkpoints (not committed: carry them to the next lease, "
              "with .gpu): " + " ".join(f'"{p}"' for p in carried))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="fill .gpu/ for a lent machine (on this CPU machine)")
    p.add_argument("--data-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    p = sub.add_parser("run", help="the session (on the GPU machine)")
    p.add_argument("--minutes", type=float, required=True, help="the whole session's budget")
    p.add_argument("--out", type=Path, required=True, help="records, logs and the archive")
    p.add_argument("--detach", action="store_true",
                   help="start in a new process session and return at once")
    p.add_argument("--device", choices=["auto", "cpu"], default="auto",
                   help="cpu: run every phase on the CPU (the test of this script)")
    p.add_argument("--grid", type=Path, default=Path("experiments/table1_fmnist.toml"))
    p.add_argument("--scale", default="gpu",
                   help="the grid scale when no pilot picks one (and the profile's)")
    p.add_argument("--grid-out", type=Path, default=None,
                   help="the cells' folder (default: experiments/results/<grid>-<scale>, at "
                        "the scale the pilot picked)")
    p.add_argument("--jobs", default=str(JOBS),
                   help=f"cells side by side (default {JOBS}: see JOBS)")
    p.add_argument("--ladder-scale", default="full")
    p.add_argument("--ladder-steps", nargs="+", default=None, metavar="STEP",
                   help="only these rungs of the ladder (default: those that decide auto: "
                        "eager float32, + bf16, + compile, + CUDA graphs on CUDA; eager "
                        "float32 on the CPU)")
    p.add_argument("--ladder-methods", nargs="+", default=["dcco", "contrastive_fedavg"],
                   help="the ladder's methods (default: one of each loss family)")
    p.add_argument("--cells", nargs="+", default=list(CELL_ORDER), metavar="PATTERN",
                   help="the cells, in the order they start (default: the decisive ones "
                        "first, CELL_ORDER)")
    p.add_argument("--pilot-scales", nargs="+", default=list(PILOT_SCALES),
                   help="the recipe pilot's candidate scales, in its tie order")
    p.add_argument("--pilot-rounds", type=int, default=300)
    p.add_argument("--pilot-minutes", type=float, default=None,
                   help="the pilot's share (default: a quarter of the budget, at most 2.5 "
                        "min; none once benchmarks/results/ holds a GPU's pilot, whose pick "
                        "the grid then runs)")
    p.add_argument("--profile-warmup", type=int, default=10,
                   help="rounds before the profiled ones")
    p.add_argument("--precision-rounds", type=int, default=600)
    p.add_argument("--ladder-minutes", type=float, default=None,
                   help="the ladder's share (default: a third of the budget, at most 3 min; "
                        "none on a GPU once benchmarks/results/ holds a GPU's ladder)")
    p.add_argument("--profile-minutes", type=float, default=0.0,
                   help="the profile's share (default: none; the ladder decides auto)")
    p.add_argument("--precision-minutes", type=float, default=None,
                   help="the precision check's share (default: a sixth of the budget, at "
                        "most 1.5 min; none on a GPU once benchmarks/results/ holds a GPU's "
                        "check); the grid gets the rest")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a value of the checked cell's config (profile, precision)")
    p = sub.add_parser("unpack", help="place an archive's records in the repository (here)")
    p.add_argument("archive", type=Path)
    p.add_argument("--into", type=Path, default=ROOT, help="the repository (default: this one)")
    p.add_argument("--grid-folder", default=None,
                   help="the cells' folder under experiments/results/ (default: the "
                        "archive's), e.g. for cells of a scale since renamed")
    args = ap.parse_args(argv)
    if args.command == "prepare":
        return prepare(args)
    if args.command == "unpack":
        return unpack(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
