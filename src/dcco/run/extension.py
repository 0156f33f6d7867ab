"""Training a run for longer: whether the rounds a run has trained are the first rounds of a
run of the new total, so that continuing it gives, bit for bit, the run of that total.

A run's length reaches its rounds through its schedules: the server rate's cosine decay
(``optim.schedule``), the local rate's (``train.local_lr_schedule``), FedSC's own-weight α
(``train.own_weight = "fedsc"``), the target network's decay (``loss.target_decay``) and a
noise multiplier solved for ε over the run (``privacy.target_epsilon``). A run can be
extended only when each of them gives its trained rounds the same values under the new
total; ``extension_refusal`` says which does not.
"""

from __future__ import annotations

from dataclasses import replace

from dcco.config import RunConfig
from dcco.core.optim import scheduled_lr
from dcco.methods.predictive import head_parts, target_decay
from dcco.methods.registry import build_method
from dcco.run.algorithms import fedsc_alpha


def _schedules(cfg: RunConfig, round_index: int) -> dict[str, float]:
    """The values at ``round_index`` of each setting that depends on the run's length."""
    t, o = cfg.train, cfg.optim
    values = {"the server rate (optim.schedule)":
              scheduled_lr(round_index, t.rounds, o.lr, o.warmup_rounds, o.schedule),
              "the local rate (train.local_lr_schedule)":
              scheduled_lr(round_index, t.rounds, t.local_lr, schedule=t.local_lr_schedule)}
    if head_parts(build_method(t.method, cfg.loss))[1]:  # a target network moved by EMA
        values["the target network's decay (loss.target_decay)"] = target_decay(
            cfg.loss.target_decay, round_index, t.rounds)
    if t.own_weight == "fedsc":
        values["FedSC's α (train.own_weight)"] = fedsc_alpha(round_index, t.rounds)
    return values


def extension_refusal(cfg: RunConfig, rounds: int, done: int) -> str | None:
    """Why a run of ``cfg`` that has trained ``done`` rounds cannot continue to ``rounds`` in
    all as the run of ``rounds`` would have; None when it can."""
    if rounds < done:
        return f"it has trained {done} rounds, more than the {rounds} asked"
    if cfg.privacy.enabled and cfg.privacy.target_epsilon is not None:
        return (f"its noise multiplier was solved for ε = {cfg.privacy.target_epsilon} over "
                f"{cfg.train.rounds} rounds (privacy.target_epsilon)")
    longer = replace(cfg, train=replace(cfg.train, rounds=rounds))
    for r in range(done):
        before, after = _schedules(cfg, r), _schedules(longer, r)
        for what, value in before.items():
            if after[what] != value:
                return (f"{what} depends on the run's length: its round {r + 1} was trained "
                        f"at {value:.6g} for {cfg.train.rounds} rounds, where a run of "
                        f"{rounds} takes {after[what]:.6g}")
    return None


__all__ = ["extension_refusal"]
