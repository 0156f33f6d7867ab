"""One round per method on 2 ranks (gloo, float64), clients of uneven sizes split unevenly,
and FedSC's rounds of partial participation with the server's cache of absent clients;
rank 0 saves each one's pseudo-gradient and loss to the file given. Run by
tests/test_distributed.py through ``python -m torch.distributed.run``."""

import functools
import sys

import torch
import torch.distributed as dist

from dcco.config import ModelConfig
from dcco.core.algorithm import Algorithm
from dcco.core.distributed import AllReduceExecutor, local_segments, split_batch
from dcco.core.simulator import EXECUTORS
from dcco.core.statistics_cache import StatisticsCache
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder

SIZES = [1, 3, 5, 2, 4]
SIZES_FEDAVG = [2, 3, 5, 2, 4]
METHODS = ["dcco", "dvicreg", "cco_fedavg", "contrastive_fedavg", "vicreg_fedavg",
           "centralized_cco", "fedsc", "spectral_fedavg", "dcco+ldawa", "cco_fedavg+ldawa"]
"""Each method's round; "+ldawa": under L-DAWA's aggregation (``train.aggregation``)."""


CACHED_ROUNDS = [([0, 1, 2, 3, 4], [1, 3, 5, 2, 4]), ([5, 2, 0], [2, 4, 3]),
                 ([6, 1, 5, 3], [3, 1, 2, 2])]
"""FedSC's rounds with the cache: (client ids, their sizes) a round, clients coming back."""


def views(n, seed=0):
    from dcco.config import AugmentConfig
    from dcco.data.augment import augment_pair

    gen = torch.Generator().manual_seed(seed)
    imgs = (255 * torch.rand(n, 1, 12, 12, generator=gen)).to(torch.uint8)
    return augment_pair(imgs, torch.arange(n) + 1000, 3, 5, AugmentConfig.byol(),
                        dtype=torch.float64)


def algorithm(name, method):
    """The round's algorithm for a name of ``METHODS`` (its method, built by ``case``)."""
    return Algorithm(method, aggregation="ldawa" if name.endswith("+ldawa") else "fedavg")


def case(name):
    """A method's round: (method, client sizes, float64 model, both views of its samples)."""
    method = build_method(name.split("+")[0])
    sizes = SIZES_FEDAVG if method.min_client_samples > 1 else SIZES
    model = build_dual_encoder(ModelConfig(widths=(4, 8, 8)), 1, (24, 24, 16), seed=7).double()
    return method, sizes, model, views(sum(sizes))


def main():
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in METHODS:
        method, sizes, model, (x1, x2) = case(name)
        segments = Segments.from_counts(sizes)
        if method.federated:
            part, local = local_segments(segments, rank, size)
            rule = algorithm(name, method)
        else:
            part, local = split_batch(sum(sizes), rank, size)
            rule = Algorithm(build_method("dcco"))
        for backend in ("batched", "reference", "grouped-kept"):
            if backend == "grouped-kept":  # train.max_batch = "auto" on a CPU, in groups of 4
                inner = EXECUTORS["batched"](model, x1[part], x2[part], local, 4, True)
            else:
                inner = EXECUTORS[backend](model, x1[part], x2[part], local)
            result = rule.round(AllReduceExecutor(inner, local.num_samples,
                                                           sum(sizes)))
            out[f"{name}/{backend}"] = {"pseudo": result.pseudo_gradient,
                                        "loss": float(result.loss),
                                        "clients": result.num_clients}
    for backend in ("batched", "reference"):
        cache = StatisticsCache()
        for r, (clients, sizes) in enumerate(CACHED_ROUNDS):
            method, _, model, _ = case("fedsc")
            x1, x2 = views(sum(sizes), seed=r)
            part, local = local_segments(Segments.from_counts(sizes), rank, size)
            inner = EXECUTORS[backend](model, x1[part], x2[part], local)
            executor = AllReduceExecutor(inner, local.num_samples, sum(sizes), len(sizes))
            result = Algorithm(method).round(
                executor, absent=functools.partial(cache.merge_round, clients))
            out[f"fedsc-cached/{backend}/{r}"] = {"pseudo": result.pseudo_gradient,
                                                  "loss": float(result.loss)}
    if rank == 0:
        torch.save(out, sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
