"""The strategy's log, one line a round and one for the run, as Flower's FedAvg logs its
rounds and its closing summary: what a user sees of a run without reading its ``Result``."""

from __future__ import annotations

from collections.abc import Mapping

from flwr.serverapp.strategy import Result

from dcco.core.server import ReplyTally


def _number(value: float) -> str:
    return f"{value:.4g}"


def round_line(record: dict) -> str:
    """A trained round in one line: its loss, each phase's accepted replies of those sent,
    and S_A's collapse figures (a statistics method's)."""
    parts = [f"loss {_number(record['loss'])}"]
    phases = [f"{p} {int(record[p + '-accepted'])}/{int(record[p + '-sent'])}"
              for p in ("stats", "update") if p + "-sent" in record]
    if phases:
        parts.append("replies " + ", ".join(phases))
    if "eff_rank" in record:
        parts.append(f"S_A effective rank {record['eff_rank']:.1f}, "
                     f"{record['dead_dims']:.0%} dead")
    return "; ".join(parts)


def metrics_line(metrics: Mapping[str, object]) -> str:
    """A MetricRecord's numbers in one line, ``num-examples`` last."""
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    order = sorted(shown, key=lambda k: (k == "num-examples", k))
    return ", ".join(f"{k} {_number(float(shown[k]))}" for k in order) or "no metrics"


def run_summary(result: Result, num_rounds: int, seconds: float) -> str:
    """The run in one line, as FedAvg's closing log: rounds trained and skipped, the time,
    the first and last loss, and the last federated and server evaluation."""
    trained = {r: m for r, m in result.train_metrics_clientapp.items() if not m["skipped"]}
    parts = [f"{len(trained)} of {num_rounds} rounds trained in {seconds:.1f} s"]
    if trained:
        first, last = min(trained), max(trained)
        parts.append(f"loss {_number(trained[first]['loss'])} (round {first}) → "
                     f"{_number(trained[last]['loss'])} (round {last})")
    for name, records in (("federated evaluation", result.evaluate_metrics_clientapp),
                          ("server evaluation", result.evaluate_metrics_serverapp)):
        if records:
            r = max(records)
            parts.append(f"{name} at round {r}: {metrics_line(records[r])}")
    return "; ".join(parts)


def evaluation_by_round(result: Result) -> list[str]:
    """The evaluations round by round, as FedAvg's closing "Final results" lists them: a
    heading and a line a round for each history that holds any (round 0: the initial
    model)."""
    lines = []
    for name, records in (("federated evaluation", result.evaluate_metrics_clientapp),
                          ("server evaluation", result.evaluate_metrics_serverapp)):
        if records:
            lines.append(f"{name} by round:")
            lines += [f"  round {r}: {metrics_line(records[r])}" for r in sorted(records)]
    return lines


def tally_metrics(phase: str, tally: ReplyTally) -> dict:
    """An exchange's reply counters as metrics named ``<phase>-<counter>``."""
    out = {f"{phase}-{k}": float(v) for k, v in tally.as_dict().items() if k != "rejected"}
    out |= {f"{phase}-rejected-{k}": float(v) for k, v in tally.rejected.items()}
    return out


__all__ = ["evaluation_by_round", "metrics_line", "round_line", "run_summary", "tally_metrics"]
