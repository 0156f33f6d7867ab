"""Secure aggregation of both exchanges with Flower's SecAgg+: the server sees only sums.

Flower's SecAgg+ (``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on the clients)
securely computes the weighted average Σ_k w_k x_k / Σ_k w_k of the clients' vectors x_k with
weights w_k = N_k / max_weight. Each client scales x_k by w_k, clips it to ±c, quantises it
stochastically to Q levels over [−c, c] and masks it; the server unmasks only the sum. So the
server learns the average and the counts N_k (which it assigned anyway: Dirichlet clients have
equal sizes), nothing of one client's statistics, update or loss.

The ranges. Values must lie in ±c to survive, and the error is one quantisation step
Δ = 2c/Q per value and client, so each phase sends values of a known scale:

- statistics: a node sends the moments of its encodings standardised by a reference frame,
  u = (F − μ)/σ and v = (G − ν)/τ per dimension: ⟨u⟩, ⟨v⟩, ⟨u²⟩, ⟨v²⟩, ⟨u vᵀ⟩ (all bounded by
  the second moments ⟨u²⟩, ⟨v²⟩ by Cauchy–Schwarz). The map from raw moments is affine, so
  the server maps the secure average back exactly (``unstandardise``), in float64; and the
  catastrophic cancellation of ⟨F²⟩ − ⟨F⟩² happens there, not in fixed point;
- updates: a node sends Δ / s with one scale s per round;
- two auxiliary entries in [0, 1]-ish units: the loss / ℓ (ℓ a reference loss) and the
  fraction of the node's values that the clipping cut, so the server learns the average
  loss and how much was clipped, never one node's.

The frame (μ, σ, ν, τ), s and ℓ come from a calibration step the server runs each round on
its own data (``calibrate``: the round's model, 64 of the server's training images): public
values, no state across rounds, so a resumed run uses the same ranges. With the defaults
(c = 64, Q = 2^22), Δ ≈ 3·10⁻⁵: a statistic is exact to ~3·10⁻⁵ σ², an update to ~3·10⁻⁵ of
the calibration step's largest |Δ|, per node; the bound used by the tests is
``error_bound``. A node's encodings up to ~8σ from the frame's mean, and updates up to 64
times the calibration step, pass unclipped; anything larger is clipped and reported in the
metrics (``secagg_clipped``), as a warning to raise the clipping range.

Malformed replies cannot be checked one by one under SecAgg+ (the server never sees one); the
server checks the unmasked aggregate (shapes, finite values) instead, and SecAgg+ itself drops
clients that fail to take part. Flower's protocol needs at least 2 nodes per exchange.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid
from torch import Tensor, nn

from dcco.core.client import ClientUpdate, client_statistics, client_update
from dcco.core.server import ReplyTally
from dcco.core.stats import CCO_STATS, EncodingStats, Moments, StatsSpec
from dcco.flower import codec
from dcco.flower.appconfig import FlowerConfig
from dcco.flower.codec import Instruction
from dcco.methods.base import Method

FIT_CONFIG, FIT_PARAMETERS = "fitins.config", "fitins.parameters"
STD_FLOOR = 1e-2
"""σ² of the frame is var + STD_FLOOR·mean(var): a dimension that barely varies on the
calibration batch does not blow up the standardised moments of the nodes."""


# ------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class SecureScales:
    """The public reference values that put a round's secure payloads in range.

    Attributes:
        mean_f, std_f: μ, σ of F per dimension, float64 (d_f,).
        mean_g, std_g: ν, τ of G per dimension, float64 (d_g,).
        update: s, the unit of the update values.
        loss: ℓ, the unit of the loss entry.
    """

    mean_f: Tensor
    std_f: Tensor
    mean_g: Tensor
    std_g: Tensor
    update: float
    loss: float


def _frame(mean: Tensor, second: Tensor) -> Tensor:
    var = (second - mean * mean).clamp_min(0)
    return torch.sqrt(var + STD_FLOOR * var.mean() + 1e-12)


def calibrate(model: nn.Module, method: Method, x1: Tensor, x2: Tensor,
              local_lr: float) -> SecureScales:
    """The round's ranges from one client-style step on the server's own batch.

    Args:
        model: the round's global model.
        method: the run's method (its ``client_update`` gives the update scale).
        x1, x2: both views of the server's calibration batch, (B, C, H, W).
        local_lr: the clients' learning rate η.
    """
    m = client_statistics(model, x1, x2).moments()  # the frame: means and variances
    shared = (client_statistics(model, x1, x2, method.stats).moments()
              if method.stats is not None else None)
    step = client_update(model, method, x1, x2, shared, local_lr)
    update = max(float(d.abs().max()) for d in step.delta.values())
    return SecureScales(m.mean_f, _frame(m.mean_f, m.mean_ff), m.mean_g,
                        _frame(m.mean_g, m.mean_gg), max(update, 1e-12),
                        max(abs(step.loss), 1e-6))


def _frames(s: SecureScales, spec: StatsSpec = CCO_STATS) -> dict[str, tuple[Tensor, Tensor]]:
    """Each factor's (shift, scale): (μ, σ) when the spec shares the factor's first moment;
    (0, √(μ² + σ²)), its root mean square, when it does not (FedSC's uncentred second moments:
    the standardised ⟨u uᵀ⟩ then lies in [−1, 1] by Cauchy–Schwarz, and needs no ⟨F⟩)."""
    firsts = {f.left for f in spec.fields if f.right is None}
    out = {}
    for factor, mean, std in (("f", s.mean_f, s.std_f), ("g", s.mean_g, s.std_g)):
        out[factor] = ((mean, std) if factor in firsts else
                       (torch.zeros_like(mean), torch.sqrt(mean * mean + std * std)))
    return out


def _combine(form: str, a: Tensor, b: Tensor) -> Tensor:
    """a ⊗ b for an ``outer`` statistic, a ∘ b for a ``diag`` one."""
    return a[:, None] * b[None, :] if form == "outer" else a * b


def standardise(m: Moments, s: SecureScales, spec: StatsSpec = CCO_STATS) -> Moments:
    """Raw moments → the moments of u = (F − μ)/σ, v = (G − ν)/τ (all float64).

    For a first moment, (⟨A⟩ − μ_A)/σ_A; for a product moment of A and B (element-wise or
    outer), (⟨A B⟩ − μ_A⟨B⟩ − ⟨A⟩μ_B + μ_A μ_B)/(σ_A σ_B). A factor whose first moment the
    spec does not share is only scaled, by its root mean square (``_frames``).
    """
    frames, out = _frames(s, spec), {}
    firsts = {f.left for f in spec.fields if f.right is None}
    for fld in spec.fields:
        x = m[f"mean_{fld.name}"]
        mu_a, sd_a = frames[fld.left]
        if fld.right is None:
            out[f"mean_{fld.name}"] = (x - mu_a) / sd_a
            continue
        mu_b, sd_b = frames[fld.right]
        centred = x
        if fld.right in firsts:
            centred = centred - _combine(fld.form, mu_a, m[f"mean_{fld.right}"])
        if fld.left in firsts:
            centred = centred - _combine(fld.form, m[f"mean_{fld.left}"], mu_b)
        centred = centred + _combine(fld.form, mu_a, mu_b)
        out[f"mean_{fld.name}"] = centred / _combine(fld.form, sd_a, sd_b)
    return Moments(out, count=m.count)


def unstandardise(u: Moments, s: SecureScales, spec: StatsSpec = CCO_STATS) -> Moments:
    """The inverse of ``standardise``; affine, so it commutes with weighted averages."""
    frames = _frames(s, spec)
    first = {k: mu + sd * u[f"mean_{k}"] for k, (mu, sd) in frames.items()
             if f"mean_{k}" in u}
    out = {}
    for fld in spec.fields:
        x = u[f"mean_{fld.name}"]
        mu_a, sd_a = frames[fld.left]
        if fld.right is None:
            out[f"mean_{fld.name}"] = first[fld.left]
            continue
        mu_b, sd_b = frames[fld.right]
        raw = x * _combine(fld.form, sd_a, sd_b) - _combine(fld.form, mu_a, mu_b)
        if fld.right in first:
            raw = raw + _combine(fld.form, mu_a, first[fld.right])
        if fld.left in first:
            raw = raw + _combine(fld.form, first[fld.left], mu_b)
        out[f"mean_{fld.name}"] = raw
    return Moments(out, count=u.count)


def secure_moments(arrays: Sequence[np.ndarray], spec: StatsSpec, scales: SecureScales,
                   count: float) -> Moments:
    """Raw moments (float64) from a secure exchange's averages of the standardised ones,
    one array a field of ``spec`` in its order."""
    u = Moments({f"mean_{f.name}": torch.from_numpy(np.asarray(a, dtype=np.float64))
                 for f, a in zip(spec.fields, arrays, strict=True)},
                count=torch.tensor(count, dtype=torch.float64))
    return unstandardise(u, scales, spec)


def error_bound(max_weight: float, counts: Sequence[int], clip: float, levels: int,
                max_abs: float) -> float:
    """Worst-case |secure − plain| of one averaged value, in the units it is sent in.

    Each of the n nodes adds at most one quantisation step Δ = 2c/Q after scaling by its
    quantised weight q_k/Q ≈ N_k/max_weight; the server divides by Σ q_k/Q. The weights
    themselves are rounded to 1/Q, which moves the average by at most
    2·max|x|·max_k 1/(2 q_k). Valid when nothing was clipped.

    Args:
        max_weight: the exchange's max_weight.
        counts: N_k of the nodes that took part.
        clip: c. levels: Q. max_abs: max |x| over the nodes' values.
    """
    q = [round(n / max_weight * levels) for n in counts]
    step = 2 * clip / levels
    return len(q) * step / (sum(q) / levels) + max_abs * max(1 / qk for qk in q)


# ------------------------------------------------------------------------- wire format


@dataclass(frozen=True)
class SecureParams:
    """The range settings a node needs to prepare its payload."""

    max_weight: float
    clip: float
    quantization: int
    scales: SecureScales


def _scales_config(s: SecureScales) -> dict[str, list[float] | float]:
    return {"mean_f": s.mean_f.tolist(), "std_f": s.std_f.tolist(), "mean_g": s.mean_g.tolist(),
            "std_g": s.std_g.tolist(), "update_scale": s.update, "loss_scale": s.loss}


def secure_instruction(ins: Instruction, params: SecureParams) -> FitIns:
    """An instruction in the ``FitIns`` layout that SecAgg+ delivers in its masking stage.

    The payload is positional: the model's ``state_dict`` in its order, or S_A's averages in
    the order of the method's ``StatsSpec``; in stale mode the model and S_A both travel.
    """
    arrays, payload = [], []
    if ins.model is not None:
        payload.append("model")
        arrays += [v.detach().cpu().numpy() for v in ins.model.values()]
    if ins.shared is not None:
        payload.append("shared")
        arrays += [t.cpu().numpy() for t in ins.shared.tensors()]
    config = {"phase": ins.phase, "round": ins.round, "clients": list(ins.clients),
              "max_weight": float(params.max_weight), "clip": float(params.clip),
              "quantization": int(params.quantization), "payload": "+".join(payload) or "none",
              "with_stats": ins.with_stats,
              "shared_count": float(ins.shared.count) if ins.shared is not None else 0.0}
    if ins.states_key:
        config["states_key"] = ins.states_key
    return FitIns(ndarrays_to_parameters(arrays), config | _scales_config(params.scales))


def is_secure(content: RecordDict) -> bool:
    """Whether a ``train`` message comes from SecAgg+ (the FitIns layout)."""
    return FIT_CONFIG in content.config_records


def decode_secure_instruction(content: RecordDict, model_keys: Sequence[str],
                              spec: StatsSpec | None) -> tuple[Instruction, SecureParams]:
    """The node's side of ``secure_instruction``; ``model_keys`` orders the model payload and
    ``spec`` (the method's statistics) the shared one."""
    # read the FitIns records directly: compat.recorddict_to_fitins refuses list values
    cfg = content.config_records[FIT_CONFIG]
    arrays = parameters_to_ndarrays(compat.arrayrecord_to_parameters(
        content.array_records[FIT_PARAMETERS], keep_input=True))
    tensors = [torch.from_numpy(np.array(a, copy=True)) for a in arrays]
    model = shared = None
    payload = str(cfg["payload"]).split("+")
    names = [f"mean_{f.name}" for f in spec.fields] if spec is not None else []
    expected = len(model_keys) * ("model" in payload) + len(names) * ("shared" in payload)
    if len(tensors) != expected:
        raise ValueError(f"the server sent {len(tensors)} arrays ({'+'.join(payload)}), this "
                         f"node expects {expected}; do server and nodes run one config?")
    if "model" in payload:
        model = dict(zip(model_keys, tensors[:len(model_keys)], strict=True))
        tensors = tensors[len(model_keys):]
    if "shared" in payload:
        shared = Moments(dict(zip(names, tensors, strict=True)),
                         count=torch.tensor(float(cfg["shared_count"]), dtype=torch.float64))
    scales = SecureScales(*(torch.tensor(cfg[k], dtype=torch.float64)
                            for k in ("mean_f", "std_f", "mean_g", "std_g")),
                          update=float(cfg["update_scale"]), loss=float(cfg["loss_scale"]))
    ins = Instruction(str(cfg["phase"]), int(cfg["round"]),
                      tuple(int(k) for k in cfg["clients"]), model, shared,
                      bool(cfg.get("with_stats", False)), codec.states_key(cfg))
    params = SecureParams(float(cfg["max_weight"]), float(cfg["clip"]),
                          int(cfg["quantization"]), scales)
    return ins, params


def _clipped_fraction(values: list[np.ndarray], count: int, params: SecureParams) -> float:
    """Share of the values that SecAgg+ will clip after scaling by the node's weight."""
    q = round(count / params.max_weight * params.quantization) / params.quantization
    total = sum(v.size for v in values)
    cut = sum(int((np.abs(v) * q > params.clip).sum()) for v in values)
    return cut / max(total, 1)


def _fitres(values: list[np.ndarray], aux: list[float], count: int,
            params: SecureParams) -> RecordDict:
    aux = [*aux, _clipped_fraction(values, count, params)]
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([*values, np.array(aux)]), count,
                 {})
    return compat.fitres_to_recorddict(res, keep_input=True)


def _standardised(stats: EncodingStats, params: SecureParams, spec: StatsSpec) -> list:
    return [t.numpy() for t in standardise(stats.moments(), params.scales, spec).tensors()]


def secure_stats_reply(stats: EncodingStats, params: SecureParams,
                       spec: StatsSpec = CCO_STATS) -> RecordDict:
    """Phase 1 under SecAgg+: the node's standardised moments, weighted by its count."""
    return _fitres(_standardised(stats, params, spec), [], int(stats.count.item()), params)


def secure_update_reply(update: ClientUpdate, params: SecureParams,
                        stats: EncodingStats | None = None,
                        spec: StatsSpec = CCO_STATS) -> RecordDict:
    """Phase 2 under SecAgg+: Δ / s per parameter, then (stale statistics) the node's
    standardised moments, and the loss / ℓ. Everything is weighted by the node's count, so
    one secure sum gives both averages."""
    s = params.scales
    values = [(d.detach().double().cpu() / s.update).numpy() for d in update.delta.values()]
    if stats is not None:
        values += _standardised(stats, params, spec)
    return _fitres(values, [update.loss / s.loss], update.num_samples, params)


# ------------------------------------------------------------------------- server


@dataclass(frozen=True)
class SecureAverage:
    """The unmasked outcome of one secure exchange.

    Attributes:
        values: the weighted average of the nodes' payload arrays (float64), aux last.
        counts: node id → N_k of the nodes whose masked vectors were summed.
    """

    values: list[np.ndarray]
    counts: dict[int, int]


@dataclass
class _Proxy:
    """What ``SecAggPlusWorkflow`` reads of a legacy ``ClientProxy``: the node id."""

    node_id: int


class _OneExchange:
    """The part of a legacy ``Strategy`` that ``SecAggPlusWorkflow`` calls: it hands out our
    instructions and keeps the unmasked average (the workflow puts it in every FitRes)."""

    def __init__(self, instructions: dict[int, FitIns]) -> None:
        self.instructions = instructions
        self.result: SecureAverage | None = None

    def configure_fit(self, server_round: int, parameters: object,
                      client_manager: object) -> list[tuple[_Proxy, FitIns]]:
        return [(_Proxy(nid), fitins) for nid, fitins in self.instructions.items()]

    def aggregate_fit(self, server_round: int, results: list[tuple[_Proxy, FitRes]],
                      failures: list[object]) -> tuple[None, dict[str, float]]:
        if results:
            average = parameters_to_ndarrays(results[0][1].parameters)
            counts = {proxy.node_id: int(res.num_examples) for proxy, res in results}
            self.result = SecureAverage([np.asarray(a, dtype=np.float64) for a in average],
                                        counts)
        return None, {}


LOG = logging.getLogger("flwr.dcco")


def shares_and_threshold(nodes: int, shares: float, threshold: float) -> tuple[int, int]:
    """The number of shares of each node's secrets and the threshold that recovers one, as
    Flower 1.42's ``SecAggPlusWorkflow`` makes them from fractions for ``nodes`` nodes.

    >>> shares_and_threshold(3, 1.0, 0.5), shares_and_threshold(2, 1.0, 0.5)
    ((3, 2), (2, 2))
    """
    k = round(shares * nodes)
    if k < nodes and k % 2 == 0:  # Flower makes an even count odd
        k += 1
    if k <= 2:
        k = nodes
    return k, max(round(threshold * k), 2)


def survives_a_lost_node(nodes: int, shares: float, threshold: float) -> bool:
    """Whether a SecAgg+ exchange of ``nodes`` nodes still unmasks with one of them lost:
    every node keeps at least the threshold of its share holders (itself among them).

    >>> survives_a_lost_node(3, 1.0, 0.5), survives_a_lost_node(2, 1.0, 0.5)
    (True, False)
    """
    k, t = shares_and_threshold(nodes, shares, threshold)
    return nodes >= 3 and k - 1 >= t


_WARNED: set[tuple[int, float, float]] = set()


def _warn_if_fragile(nodes: int, fcfg: FlowerConfig) -> None:
    """Once a process for each exchange size and setting: a SecAgg+ exchange that a single
    lost node halts."""
    key = (nodes, fcfg.secagg_shares, fcfg.secagg_threshold)
    if nodes < 2 or key in _WARNED or survives_a_lost_node(*key):
        return
    _WARNED.add(key)
    k, t = shares_and_threshold(*key)
    # a lower threshold helps only where a share holder can be spared (3 nodes or more)
    fix = ("sample more nodes a round (at least 3)" if nodes < 3 else
           "lower flower.secagg_threshold (DCCOStrategy: SecAgg(threshold=))")
    LOG.warning("SecAgg+ over %d nodes (%d shares a secret, %d recover it) cannot survive a "
                "lost node: one lost node skips the exchange; %s", nodes, k, t, fix)


class EarlyLossWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow, finishing when a node is lost before its key shares went out.

    flwr 1.42's workflow counts as dropped, at the unmask stage, every node sampled at setup
    that is no longer active (``sampled_node_ids - active_node_ids``), and asks each survivor
    for its share of every such node's key. A node lost at setup or while shares are
    exchanged never sent any shares, so no survivor holds one: the survivors' mod fails on
    the missing share (``KeyError``) and the exchange halts for all of them, at any number of
    nodes. In SecAgg+ (Bell et al. 2020) such a node is simply not a participant: no survivor
    masks with it (a survivor's pairwise masks are with the nodes whose shares reached it,
    ``secaggplus_mod._collect_masked_vectors``). After the share-keys stage this workflow
    therefore takes the nodes still active as the participants, and their neighbours among
    them alone, so that the unmask stage recovers the masks of nodes lost later, as the
    protocol intends; a node lost at or after the masked-vectors stage is handled by Flower's
    own code, unchanged.
    """

    def share_keys_stage(self, grid: Grid, context: Context, state) -> bool:
        shared = super().share_keys_stage(grid, context, state)
        participants = set(state.active_node_ids)
        state.sampled_node_ids = participants
        state.nid_to_neighbours = {nid: set(nb) & participants
                                   for nid, nb in state.nid_to_neighbours.items()
                                   if nid in participants}
        return shared


def secure_average(grid: Grid, instructions: dict[int, FitIns], round_index: int,
                   max_weight: float, clip: float, fcfg: FlowerConfig) -> SecureAverage | None:
    """Run one SecAgg+ exchange with Flower's workflow (``EarlyLossWorkflow``); None when
    the protocol halted (too few nodes left to unmask)."""
    _warn_if_fragile(len(instructions), fcfg)
    workflow = EarlyLossWorkflow(
        num_shares=fcfg.secagg_shares, reconstruction_threshold=fcfg.secagg_threshold,
        max_weight=max_weight, clipping_range=clip, quantization_range=fcfg.secagg_quantization,
        modulus_range=fcfg.secagg_modulus, timeout=fcfg.timeout,
    )
    exchange = _OneExchange(instructions)
    state = RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND:
                                                           round_index}),
                        MAIN_PARAMS_RECORD: compat.parameters_to_arrayrecord(
                            ndarrays_to_parameters([]), keep_input=True)})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state,
                                    run_config={}), strategy=exchange)
    workflow(grid, context)
    return exchange.result


def secure_exchange(grid: Grid, instructions: dict[int, Instruction], params: SecureParams,
                    fcfg: FlowerConfig, round_index: int, tally: ReplyTally,
                    extra: dict | None = None) -> SecureAverage | None:
    """One exchange through SecAgg+, counted in ``tally`` (nodes summed: accepted; the
    others: failed): node id → its instruction, ``extra`` added to every node's config. None
    when the protocol halted or the unmasked averages are not finite (counted ``nonfinite``).
    dcco's app and the public strategy (``dcco.flower.secure_round``) both run it."""
    fitins = {}
    for node, ins in instructions.items():
        fitins[node] = secure_instruction(ins, params)
        fitins[node].config = dict(extra or {}) | fitins[node].config  # SecAgg+'s keys win
    tally.sent += len(fitins)
    result = secure_average(grid, fitins, round_index, params.max_weight, params.clip, fcfg)
    took = len(result.counts) if result is not None else 0
    tally.failed += len(fitins) - took
    if result is not None and not all(bool(np.isfinite(v).all()) for v in result.values):
        for _ in range(took):  # the nodes summed: one of them (unknown) sent such values
            tally.reject("nonfinite")
        return None
    tally.accepted += took
    return result


# ------------------------------------------------------------------------- client


__all__ = [
    "EarlyLossWorkflow",
    "SecureAverage",
    "SecureParams",
    "SecureScales",
    "calibrate",
    "decode_secure_instruction",
    "error_bound",
    "is_secure",
    "secure_average",
    "secure_exchange",
    "secure_instruction",
    "secure_moments",
    "secure_stats_reply",
    "secure_update_reply",
    "shares_and_threshold",
    "standardise",
    "survives_a_lost_node",
    "unstandardise",
]
