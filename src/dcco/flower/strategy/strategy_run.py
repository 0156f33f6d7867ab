"""``DCCOStrategy.start``'s run: the initial model's evaluation (or the checkpoint's rounds,
on a resume), then each round trained, evaluated, logged, checkpointed and written to the
metrics file, and the closing summary by round."""

from __future__ import annotations

import logging
import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from dcco.flower.roundlog import evaluation_by_round, round_line, run_summary
from dcco.flower.strategy.federated_evaluation import ServerEvaluation, evaluate_round
from dcco.flower.strategy.metrics_file import MetricsFile
from dcco.flower.strategy.round_steps import RoundsSkipped, skipped_round
from dcco.flower.strategy.strategy_checkpoint import resume_strategy, save_strategy

LOG = logging.getLogger("flwr.dcco")


def run_rounds(strategy: Any, grid: Grid, initial_arrays: ArrayRecord,
               num_rounds: int, timeout: float, config: dict,
               evaluate_config: ConfigRecord | None,
               evaluate_fn: ServerEvaluation | None) -> Result:
    """``num_rounds`` rounds of ``strategy`` (a ``DCCOStrategy``, which imports this
    module) on ``grid``: ``DCCOStrategy.start``, whose arguments are checked; ``config`` the
    nodes' checked ``train_config``."""
    began = time.perf_counter()
    result = Result(arrays=initial_arrays)
    strategy.begin(initial_arrays, num_rounds)
    metrics = (MetricsFile(strategy.metrics_file, strategy.model.lr_of)
               if strategy.metrics_file is not None else None)
    first, skipped = _opening(strategy, grid, result, num_rounds, timeout, evaluate_config,
                              evaluate_fn, metrics)
    failing: list[frozenset[str]] = []  # the errors of consecutive rounds every node failed
    for r in range(first, num_rounds + 1):
        started = time.perf_counter()
        strategy.asked_nodes = set(nodes := strategy.sampler.train(grid))
        outcome = strategy.rounds.run(grid, r, nodes, config, timeout)
        record = outcome.metrics | {"skipped": float(outcome.skipped),
                                    "round-seconds": time.perf_counter() - started}
        result.train_metrics_clientapp[r] = MetricRecord(record)
        if not outcome.skipped:
            result.arrays = outcome.arrays
            LOG.info("DCCO round %d/%d: %s", r, num_rounds, round_line(record))
        else:
            skipped_round(r, num_rounds, outcome, skipped, failing, result)
        evaluate_round(strategy.evaluation, grid, r, num_rounds, result, evaluate_config,
                       timeout, evaluate_fn)
        if strategy.checkpoint is not None:
            save_strategy(strategy.checkpoint, r, num_rounds, result, skipped, strategy.model,
                          strategy.sampler, strategy.cache, strategy.rounds.watch)
        if metrics is not None:
            metrics.append(r, result)
    LOG.info("DCCO: %s", run_summary(result, num_rounds, time.perf_counter() - began))
    for line in evaluation_by_round(result):
        LOG.info("DCCO %s", line)
    if len(skipped) == num_rounds:
        raise RoundsSkipped(
            f"every one of the {num_rounds} rounds was skipped, so the model was never "
            f"trained: " + "; ".join(skipped[:3])
            + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""), result)
    return result


def _opening(strategy: Any, grid: Grid, result: Result, num_rounds: int,
             timeout: float, evaluate_config: ConfigRecord | None,
             evaluate_fn: ServerEvaluation | None, metrics: MetricsFile | None
             ) -> tuple[int, list[str]]:
    """A run's start: the checkpoint's rounds restored when there is one, else the initial
    model evaluated as round 0; the metrics file begun to match. Returns the first round to
    run and the rounds skipped so far."""
    if strategy.checkpoint is not None and strategy.checkpoint.is_file():
        first, skipped, cache = resume_strategy(strategy.checkpoint, result, num_rounds,
                                                strategy.model, strategy.sampler,
                                                strategy.rounds.watch)
        strategy.rounds.cache = cache if cache is not None else strategy.rounds.cache
        LOG.info("DCCO: resuming from %s after round %d of %d (initial_arrays ignored)",
                 strategy.checkpoint, first - 1, num_rounds)
    else:
        first, skipped = 1, []
        evaluate_round(strategy.evaluation, grid, 0, num_rounds, result, evaluate_config,
                       timeout, evaluate_fn)
    if metrics is not None:
        metrics.restart(result, first - 1)
    return first, skipped


__all__ = ["run_rounds"]
