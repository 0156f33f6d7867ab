"""dcco's batched round against what a user would run instead, on the same workload, measured
in one run (issue 40; README, "Speed against the alternatives").

The workload: K clients of n samples (Fashion-MNIST-sized 1 × 28 × 28 images, their two views
made once and shared by every peer), the Table 1 `small` network from dcco (ResNet14 GN + WS,
widths 16/32/64, projector 128³), one local SGD step of rate 1.0 per client, the server's
update the sample-weighted average of the clients' deltas. Two methods:

- ``contrastive``: contrastive FedAvg (NT-Xent within each client, τ = 0.1; n ≥ 2);
- ``dcco``: DCCO (two phases: statistics, then the anchored step; any n).

The peers (each skipped, and said so, when it cannot be imported):

- ``dcco``: dcco's batched simulator (``dcco.core.simulator.run_round``, the clients in one forward
  and backward, or on a CPU in groups of at most 256 samples: ``train.max_batch = "auto"``);
- ``loop-deepcopy``: the plain loop, a ``copy.deepcopy`` of the global model per client, an
  SGD step, the deltas accumulated;
- ``loop-reload``: the same with one model refilled by ``load_state_dict`` per client;
- ``flower``: Flower's simulation (``flwr.simulation.run_simulation``, Ray), one virtual node
  per client, Flower's ``FedAvg`` (contrastive) or ``dcco.flower.DCCOStrategy`` (dcco), the round
  timed on the server. Whatever ``--threads``, Ray runs its default of one actor per core,
  each of one thread (``FLOWER_THREADS``): Flower's own parallelism, across clients, on
  every core of the machine (at ``--threads 1`` more cores than the other peers get);
- ``pfl``: Apple's pfl 0.6 (``pip install 'dcco[peers]'``), its ``FederatedAveraging`` on
  its ``SimulatedBackend`` in this process (one user per client, a cohort of all K, one local
  step on the whole user's data, updates weighted by samples with ``WeightByDatapoints``, the
  central SGD at rate 1): contrastive FedAvg only (pfl has no round of shared statistics),
  each round timed by a pfl callback.

Every peer's first-round update must equal dcco's to float32 tolerance (relative 1e-4 of the
update's norm) before it is timed. The in-process peers run interleaved in blocks (a slow
spell hits all alike); Flower runs its own rounds in the same process afterwards. Reported:
the median seconds per round of each peer and its ratio to dcco's, and each peer's peak
resident memory (this process's over the peer's first round, or over its own run for
Flower and pfl, from a reset of Linux's VmHWM; the workload's own memory is
``baseline_rss_gib``; Flower's ClientApps run in Ray's actor processes, not counted).

    python benchmarks/peers.py --clients 32 256 1024 --samples 1 4 --threads 1 2 \\
        --record benchmarks/results/peers.json --plot benchmarks/results/peers.png
    python benchmarks/peers.py --small     # 2 clients, 1 round: the test's mode

An existing ``--record`` is extended, not overwritten: the points it holds are kept and only
the others are measured, so a long sweep can be stopped and run on later (``--rounds 1
--blocks 2`` for the slowest points: Flower then runs 2 rounds and reports its second).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from dcco.config import AugmentConfig, ModelConfig
from dcco.core.simulator import run_round
from dcco.data.augment import augment_pair
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder
from dcco.run.device_plan import keeps_graphs, max_batch_of
from dcco.run.rundir import code_version, cpu_name

WIDTHS, PROJECTOR, SIDE = (16, 32, 64), (128, 128, 128), 28
SEED = 0
TOLERANCE = 1e-4
PEERS = ("dcco", "loop-deepcopy", "loop-reload", "flower", "pfl")


# ------------------------------------------------------------------------------ workload


def workload(clients: int, samples: int, widths=WIDTHS, projector=PROJECTOR, side=SIDE):
    """The model, both views of every sample (client 0's first) and the segments."""
    torch.manual_seed(SEED)
    model = build_dual_encoder(ModelConfig(widths=tuple(widths)), 1, tuple(projector),
                               seed=SEED)
    x1, x2 = node_views(0, clients * samples, side)
    return model, x1, x2, Segments.from_counts([samples] * clients)


def node_views(first: int, count: int, side: int = SIDE) -> tuple[torch.Tensor, torch.Tensor]:
    """Both views of samples ``first .. first + count``: each sample's image and views are a
    function of its id alone, so a node computes its own slice of the batch's views."""
    ids = torch.arange(first, first + count)
    images = torch.stack([(255 * torch.rand(1, side, side, generator=torch.Generator()
                                            .manual_seed(int(i)))).to(torch.uint8)
                          for i in ids])
    return augment_pair(images, ids, SEED, 0, AugmentConfig.byol())


def _params(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


# ------------------------------------------------------------------------------ peers


def dcco_round(model, method: str, x1, x2, segments) -> dict[str, torch.Tensor]:
    """The batched round's averaged delta, −pseudo-gradient."""
    name = "contrastive_fedavg" if method == "contrastive" else "dcco"
    # as a run on this machine computes it: train.max_batch = "auto"
    device = next(model.parameters()).device
    out = run_round(model, build_method(name), x1, x2, segments, "batched",
                    chunk=max_batch_of("auto", device),
                    keep_graphs=keeps_graphs("auto", device))
    return {k: -v for k, v in out.pseudo_gradient.items()}


def _client_loss(method: str):
    if method == "contrastive":
        from dcco.core.losses import nt_xent

        return lambda f, g, shared: nt_xent(f, g)
    m = build_method("dcco")
    return m.client_loss


def loop_round(model, method: str, x1, x2, segments, reload: bool) -> dict[str, torch.Tensor]:
    """The plain loop: each client on its own copy of the global model (``copy.deepcopy``,
    or one model refilled with ``load_state_dict``), one SGD step, the deltas averaged by
    sample count. DCCO's clients first send their statistics (a no-gradient forward each),
    which the loop merges before the steps."""
    from dcco.core.stats import encoding_stats, merge

    sizes = segments.counts.tolist()
    parts = list(zip(x1.split(sizes), x2.split(sizes), strict=True))
    total = sum(sizes)
    shared = None
    loss = _client_loss(method)
    if method == "dcco":
        with torch.no_grad():
            shared = merge([encoding_stats(*model(a, b)) for a, b in parts]).moments()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    worker = copy.deepcopy(model) if reload else None
    avg = {n: torch.zeros_like(p) for n, p in _params(model)}
    for (a, b), n in zip(parts, sizes, strict=True):
        if reload:
            worker.load_state_dict(start)
            local = worker
        else:
            local = copy.deepcopy(model)
        opt = torch.optim.SGD([p for _, p in _params(local)], lr=1.0)
        opt.zero_grad(set_to_none=True)
        loss(*local(a, b), shared).backward()
        opt.step()
        with torch.no_grad():
            for name, p in _params(local):
                avg[name] += (n / total) * (p - start[name])
    return avg


FLOWER_THREADS = 1
"""Each of Flower's Ray actors runs one torch thread, and Ray its default of one actor per
core. Its actors' threads times their number is then the machine's cores: two threads an
actor on this 2-core machine (a first two-thread try) oversubscribed the cores and ran a
round 14 times dcco's, against 2.2 times at one thread."""


def flower_rounds(method: str, clients: int, samples: int, rounds: int, threads: int,
                  widths=WIDTHS, projector=PROJECTOR, side=SIDE) -> dict:
    """Flower's simulation: one virtual node per client; the server's FedAvg (contrastive)
    or DCCO strategy; the seconds of each round (from the server) and round 1's update."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from dcco.flower import DCCOStrategy, answer

    def build():
        return build_dual_encoder(ModelConfig(widths=tuple(widths)), 1, tuple(projector),
                                  seed=SEED)

    client = ClientApp()
    cache: dict[int, tuple] = {}

    def views_of(pid: int):
        if pid not in cache:  # made once per actor, as every peer's views are made once
            torch.set_num_threads(FLOWER_THREADS)
            cache[pid] = node_views(pid * samples, samples, side)
        return cache[pid]

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        x1, x2 = views_of(int(context.node_config["partition-id"]))
        model = build()
        if "phase" in msg.content["config"]:
            return answer(msg, context, model, x1, _fixed_views(x1, x2))
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        loss = _client_loss("contrastive")
        opt = torch.optim.SGD([p for _, p in _params(model)], lr=1.0)
        opt.zero_grad(set_to_none=True)
        loss(*model(x1, x2), None).backward()
        opt.step()
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics":
                                   MetricRecord({"num-examples": samples})}), reply_to=msg)

    out: dict = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(SEED)
        initial = ArrayRecord(build().state_dict())
        stamps: list[float] = []
        first: dict = {}

        def evaluate(r: int, arrays: ArrayRecord):
            stamps.append(time.perf_counter())
            if r == 1:
                first.update(arrays.to_torch_state_dict())

        if method == "contrastive":
            strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                              min_train_nodes=clients, min_evaluate_nodes=0,
                              min_available_nodes=clients)
        else:
            strategy = DCCOStrategy(fraction_train=1.0, min_train_nodes=clients,
                                    min_available_nodes=clients, optimizer="sgd", lr=1.0,
                                    weight_decay=0.0, warmup_rounds=0, schedule="constant",
                                    fraction_evaluate=0.0,  # dcco's own round's λ (the paper's)
                                    lambd=build_method("dcco").loss.lambd)
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                       evaluate_fn=evaluate)
        start = initial.to_torch_state_dict()
        out["first"] = {k: first[k] - start[k] for k in first}
        out["seconds"] = [b - a for a, b in itertools.pairwise(stamps)]

    env = {"OMP_NUM_THREADS": str(FLOWER_THREADS)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run_simulation(server_app=server, client_app=client, num_supernodes=clients,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def pfl_rounds(method: str, clients: int, samples: int, rounds: int, threads: int,
               widths=WIDTHS, projector=PROJECTOR, side=SIDE) -> dict:
    """pfl's FedAvg simulation of contrastive FedAvg: the seconds of each round (a pfl
    callback after each central iteration) and round 1's averaged update."""
    import dataclasses

    os.environ.setdefault("PFL_PYTORCH_DEVICE", "cpu")
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.pytorch import PyTorchTensorDataset
    from pfl.data.sampling import MinimizeReuseUserSampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    loss = _client_loss(method)

    class User(torch.nn.Module):  # pfl calls the module's loss and metrics on a user's data
        def __init__(self) -> None:
            super().__init__()
            self.dual = build_dual_encoder(ModelConfig(widths=tuple(widths)), 1,
                                           tuple(projector), seed=SEED)

        def loss(self, x1, x2):
            return loss(*self.dual(x1, x2), None)

        @torch.no_grad()
        def metrics(self, x1, x2):
            return {"loss": Weighted(float(self.loss(x1, x2)) * len(x1), len(x1))}

    class FedAvg(FederatedAveraging):
        """pfl's FedAvg without its evaluation (it has no switch), keeping round 1's update."""

        def __init__(self) -> None:
            super().__init__()
            self.first: dict = {}

        def process_aggregated_statistics(self, central_context, aggregate_metrics, model,
                                          statistics):
            out = super().process_aggregated_statistics(central_context, aggregate_metrics,
                                                        model, statistics)
            if central_context.current_central_iteration == 0:
                self.first = {k.removeprefix("dual."): v.clone()
                              for k, v in statistics.items()}
            return out

        def get_next_central_contexts(self, *args, **kwargs):
            contexts, model, metrics = super().get_next_central_contexts(*args, **kwargs)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(c, do_evaluation=False)
                                 for c in contexts)
            return contexts, model, metrics

    class Timer(TrainingProcessCallback):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_train_begin(self, *, model):
            self.stamps.append(time.perf_counter())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.stamps.append(time.perf_counter())
            return False, Metrics()

    torch.set_num_threads(threads)
    users = {k: PyTorchTensorDataset(node_views(k * samples, samples, side), user_id=str(k))
             for k in range(clients)}
    data = FederatedDataset(make_dataset_fn=lambda k: users[k],
                            user_sampler=MinimizeReuseUserSampler(list(range(clients))))
    module = User()
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    algorithm, timer = FedAvg(), Timer()
    algorithm.run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds,
                                           evaluation_frequency=1, train_cohort_size=clients,
                                           val_cohort_size=None),
        backend=SimulatedBackend(training_data=data, val_data=data,
                                 postprocessors=[WeightByDatapoints()]),
        model=model,
        model_train_params=NNTrainHyperParams(local_num_epochs=1, local_learning_rate=1.0,
                                              local_batch_size=None),
        model_eval_params=None, callbacks=[timer], send_metrics_to_platform=False)
    return {"first": algorithm.first,
            "seconds": [b - a for a, b in itertools.pairwise(timer.stamps)]}


def _fixed_views(x1, x2):
    """``answer``'s augmentation for precomputed views: the first call gives view 1, the
    second view 2 (its two calls a round, in order)."""
    calls = iter((x1, x2, x1, x2))
    return lambda samples: next(calls)


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    fa = torch.cat([a[k].flatten().double() for k in sorted(b)])
    fb = torch.cat([b[k].flatten().double() for k in sorted(b)])
    return float((fa - fb).norm() / fb.norm())


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (Linux: ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ------------------------------------------------------------------------------ one point


def reset_peak() -> None:
    """Start this process's peak resident memory afresh (Linux: ``/proc/self/clear_refs``
    with 5 resets VmHWM), so that the next ``peak_gib`` is one peer's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def memory_gib(field: str = "VmHWM") -> float | None:
    """This process's peak (``VmHWM``) or current (``VmRSS``) resident memory, GiB; None
    where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 2**20, 3)
    except OSError:
        pass
    return None


def measure(method: str, clients: int, samples: int, threads: int, rounds: int, blocks: int,
            peers: list[str], small: bool = False) -> dict:
    """One point of the sweep: every peer's equality check, then its seconds per round."""
    torch.set_num_threads(threads)
    shape = {"widths": (4, 8, 8), "projector": (16, 16, 16), "side": 12} if small else {}
    model, x1, x2, segments = workload(clients, samples, **shape)
    point = {"method": method, "clients": clients, "samples_per_client": samples,
             "threads": threads, "peers": {}, "skipped": {}}
    reference = dcco_round(model, method, x1, x2, segments)
    point["baseline_rss_gib"] = memory_gib("VmRSS")  # the workload's views and model held
    runs = {"dcco": lambda: dcco_round(model, method, x1, x2, segments),
            "loop-deepcopy": lambda: loop_round(model, method, x1, x2, segments, False),
            "loop-reload": lambda: loop_round(model, method, x1, x2, segments, True)}
    timed = {}
    for name in [p for p in peers if p in runs]:
        reset_peak()
        error = _rel(runs[name](), reference)
        point["peers"][name] = {"equal_to_dcco": error, "peak_rss_gib": memory_gib()}
        if error > TOLERANCE:
            point["skipped"][name] = f"its update differs from dcco's by {error:.2e}"
            continue
        timed[name] = []
    for _ in range(blocks):  # interleaved: a slow spell of the machine hits every peer
        for name, seconds in timed.items():
            start = time.perf_counter()
            for _ in range(rounds):
                runs[name]()
            seconds.append((time.perf_counter() - start) / rounds)
    for name, seconds in timed.items():
        point["peers"][name] |= {"seconds": seconds, "median_s": statistics.median(seconds)}
    if "flower" in peers:
        try:
            import flwr  # noqa: F401
        except ImportError:
            point["skipped"]["flower"] = "flwr is not installed (pip install 'dcco[flower]')"
        else:
            reset_peak()
            _timed_elsewhere(point, "flower", flower_rounds(
                method, clients, samples, max(2, rounds * blocks // 2 + 1), threads, **shape),
                reference)
            # this process's: the ServerApp and the simulation's driver; the ClientApps run
            # in Ray's actor processes, which this does not count
            point["peers"]["flower"]["peak_rss_gib"] = memory_gib()
    if "pfl" in peers:
        try:
            import pfl  # noqa: F401
        except ImportError:
            point["skipped"]["pfl"] = "pfl is not installed (pip install 'dcco[peers]')"
        else:
            if method != "contrastive":
                point["skipped"]["pfl"] = "pfl has no round of shared statistics (DCCO)"
            else:
                reset_peak()
                _timed_elsewhere(point, "pfl", pfl_rounds(
                    method, clients, samples, max(2, rounds * blocks // 2 + 1), threads,
                    **shape), reference)
                point["peers"]["pfl"]["peak_rss_gib"] = memory_gib()
    base = point["peers"]["dcco"].get("median_s")
    for entry in point["peers"].values():
        if "median_s" in entry and base:
            entry["ratio_to_dcco"] = entry["median_s"] / base
    point["peak_rss_gib"] = round(peak_rss_gib(), 2)  # the process's, over the whole run
    return point


def _timed_elsewhere(point: dict, name: str, out: dict, reference: dict) -> None:
    """A peer that runs its own rounds (Flower, pfl): its round-1 update checked against
    dcco's, then the median of its rounds after the first (which starts actors or builds
    state)."""
    error = _rel(out["first"], reference)
    point["peers"][name] = {"equal_to_dcco": error}
    if error > TOLERANCE:
        point["skipped"][name] = f"its update differs from dcco's by {error:.2e}"
        return
    kept = out["seconds"][1:] or out["seconds"]
    point["peers"][name] |= {"seconds": out["seconds"], "median_s": statistics.median(kept)}


def show(point: dict) -> str:
    head = (f"{point['method']}, K = {point['clients']} × {point['samples_per_client']}, "
            f"{point['threads']} thread(s): ")
    cells = []
    for name, e in point["peers"].items():
        if "median_s" in e:
            cells.append(f"{name} {e['median_s'] * 1e3:.1f} ms ({e.get('ratio_to_dcco', 1):.2f}×)")
    skipped = "; ".join(f"{k} skipped: {v}" for k, v in point["skipped"].items())
    return head + ", ".join(cells) + (f"; {skipped}" if skipped else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", nargs="+", default=["contrastive", "dcco"],
                    choices=["contrastive", "dcco"])
    ap.add_argument("--clients", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--samples", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per timed block")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    ap.add_argument("--small", action="store_true",
                    help="2 clients, 1 round, a tiny network: the test's mode")
    ap.add_argument("--record", type=Path, help="written after every point")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--table", type=Path, metavar="RECORD",
                    help="print a record's Markdown table (README) and exit")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if args.small:
        args.clients, args.samples, args.threads = [2], [2], [1]
        args.rounds, args.blocks = 1, 1
    command = "python benchmarks/peers.py " + " ".join(sys.argv[1:])
    code = code_version()
    record = {"command": command,
              "machine": f"{cpu_name()} ({os.cpu_count()} cores), {platform.system()}",
              "code": code, "tolerance": TOLERANCE, "points": []}
    if args.record and args.record.exists():
        record = resumed(args.record, record)
    done = {_key(p) for p in record["points"]}
    for method, clients, samples, threads in itertools.product(
            args.methods, args.clients, args.samples, args.threads):
        if method == "contrastive" and samples < 2:
            continue  # NT-Xent within a client needs two samples
        if (method, clients, samples, threads) in done:
            print(f"{method}, K = {clients} × {samples}, {threads} thread(s): in the record, "
                  "kept", flush=True)
            continue
        point = measure(method, clients, samples, threads, args.rounds, args.blocks,
                        args.peers, args.small)
        point |= {"command": command, "git_commit": code.get("git_commit")}
        record["points"].append(point)
        print(show(point), flush=True)
        if args.record:  # after every point: a long sweep stopped keeps what it measured
            args.record.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.record.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            tmp.replace(args.record)
    if args.record:
        print(f"record: {args.record}")
    if args.plot:
        plot(record["points"], args.plot)


def _key(point: dict) -> tuple:
    return (point["method"], point["clients"], point["samples_per_client"], point["threads"])


def resumed(path: Path, fresh: dict) -> dict:
    """An earlier record at ``path`` to extend: its points are kept (each says the command
    and commit that measured it) and only the points it lacks are measured. A record of
    another tolerance or machine is refused rather than mixed."""
    try:
        old = json.loads(path.read_text())
        points = old["points"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.exit(f"peers.py: {path} is not a record of this benchmark ({err}); move it away "
                 "or name another --record")
    if old.get("tolerance") != fresh["tolerance"] or old.get("machine") != fresh["machine"]:
        sys.exit(f"peers.py: {path} was measured on {old.get('machine')!r} at tolerance "
                 f"{old.get('tolerance')}; this run is {fresh['machine']!r} at "
                 f"{fresh['tolerance']}: name another --record")
    for point in points:  # the first sweep's points predate per-point provenance
        point.setdefault("command", old.get("command"))
        point.setdefault("git_commit", old.get("code", {}).get("git_commit"))
    commands = old.get("commands") or [old.get("command")]
    return old | {"commands": commands + [fresh["command"]], "command": fresh["command"],
                  "points": points}


def table(record: dict) -> str:
    """The record as a Markdown table: seconds per round of dcco and each peer's ratio to it
    (— where a peer was skipped), and the peak memory of each."""
    peers = [p for p in PEERS if any(p in pt["peers"] for pt in record["points"])]
    head = ("| method | K × samples | threads | " + " | ".join(peers)
            + " | peak memory, GiB (" + ", ".join(peers) + ") | commit |")
    lines = [head, "|" + "---|" * (5 + len(peers))]
    for pt in sorted(record["points"], key=lambda p: (p["method"], p["threads"],
                                                     p["samples_per_client"], p["clients"])):
        cells = []
        for name in peers:
            e = pt["peers"].get(name, {})
            if name == "dcco" and "median_s" in e:
                cells.append(f"{e['median_s']:.2f} s")
            elif "ratio_to_dcco" in e:
                cells.append(f"{e['ratio_to_dcco']:.2f} ×")
            else:
                cells.append("—")
        memory = ", ".join(f"{pt['peers'][n]['peak_rss_gib']:.2f}"
                           if pt["peers"].get(n, {}).get("peak_rss_gib") is not None else "—"
                           for n in peers)
        commit = (pt.get("git_commit") or record.get("code", {}).get("git_commit") or "?")[:7]
        lines.append(f"| {pt['method']} | {pt['clients']} × {pt['samples_per_client']} | "
                     f"{pt['threads']} | " + " | ".join(cells) + f" | {memory} | {commit} |")
    return "\n".join(lines)


def plot(points: list[dict], path: Path) -> None:
    """Seconds per round against K, a line per peer, a panel per (method, samples, threads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(p["method"], p["samples_per_client"], p["threads"]) for p in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (method, samples, threads) in zip(axes[0], panels, strict=True):
        mine = sorted((p for p in points if (p["method"], p["samples_per_client"],
                                             p["threads"]) == (method, samples, threads)),
                      key=lambda p: p["clients"])
        for peer in PEERS:
            xs = [p["clients"] for p in mine if "median_s" in p["peers"].get(peer, {})]
            ys = [p["peers"][peer]["median_s"] for p in mine
                  if "median_s" in p["peers"].get(peer, {})]
            if xs:
                ax.plot(xs, ys, marker="o", label=peer)
        ax.set(xscale="log", yscale="log", xlabel="clients per round K",
               ylabel="seconds per round", title=f"{method}, {samples} a client, "
                                                 f"{threads} thread(s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
