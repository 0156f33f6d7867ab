"""The public strategy's copy of the model (``dcco.flower.DCCOStrategy``): its weights, the
names of the arrays the nodes train, and the server's step on the round's pseudo-gradient
(the update exchange's server side).

The strategy holds no ``nn.Module``: the nodes own the model's code, and the server only its
arrays. The trained arrays are parameters of the server optimiser (LARS, Adam or SGD,
``dcco.core.optim``); the other floating arrays (batch norm's running statistics) are the
sample-weighted average of what the nodes hold after their step, as FedAvg averages them;
integer arrays stay as they are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import Tensor

from dcco.config import OptimConfig
from dcco.core.optim import apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.flower import codec
from dcco.flower.node_states import new_states_key


class ServerModel:
    """The model's arrays on the server, and its optimiser.

    Args:
        optim: the server optimiser and its schedule over the run's rounds.
        trained: the names of the arrays the nodes train; None: fixed from the first round's
            updates (``learn_trained``).
    """

    def __init__(self, optim: OptimConfig, trained: Iterable[str] | None = None) -> None:
        self.optim = optim
        self.given = None if trained is None else list(trained)
        self.weights: dict[str, Tensor] = {}
        self.trained: list[str] | None = self.given
        self.rounds = 1
        self.states_key = ""
        """The run's key for its clients' states on the nodes' disks (``begin`` draws one)."""
        self._params: dict[str, torch.nn.Parameter] = {}
        self._optimizer: torch.optim.Optimizer | None = None

    def begin(self, initial: ArrayRecord, rounds: int) -> None:
        """A run's start: the weights of ``initial``, a fresh optimiser, the run's length.

        Raises:
            ValueError: ``trained`` names arrays ``initial`` does not hold as floating
                tensors.
        """
        self.weights = {k: v.clone() for k, v in codec.tensors_of(initial).items()}
        self.rounds, self._params, self._optimizer = rounds, {}, None
        self.states_key = new_states_key()  # a resumed run's comes back with ``load``
        self.trained = None if self.given is None else list(self.given)
        floating = {k for k, v in self.weights.items() if v.is_floating_point()}
        if self.trained is not None and not set(self.trained) <= floating:
            raise ValueError(f"trained names arrays that initial_arrays does not hold as "
                             f"floating tensors: {sorted(set(self.trained) - floating)[:3]}")

    def arrays(self) -> ArrayRecord:
        """The model as Flower's ``ArrayRecord``."""
        return ArrayRecord(dict(self.weights))

    def learn_trained(self, contents: list[RecordDict]) -> None:
        """With ``trained`` unset, the names most of these update replies train, fixed from
        now on."""
        if self.trained is not None:
            return
        names = Counter()
        for c in contents:
            try:
                names[tuple(sorted(codec.tensors_of(c.array_records["arrays"])))] += 1
            except (KeyError, TypeError, ValueError):
                continue
        if names:
            common = set(names.most_common(1)[0][0])
            self.trained = [k for k in self.weights if k in common]

    def params(self) -> dict[str, torch.nn.Parameter]:
        """The trained arrays as the optimiser's parameters (built on first use)."""
        if not self._params:
            self._params = {k: torch.nn.Parameter(self.weights[k].clone())
                            for k in self.trained or ()}
            self._optimizer = build_optimizer(list(self._params.items()), self.optim)
        return self._params

    def lr_of(self, r: int) -> float:
        """The server's scheduled rate in round ``r`` (from 1) of the run."""
        return scheduled_lr(r - 1, self.rounds, self.optim.lr, self.optim.warmup_rounds,
                            self.optim.schedule)

    def step(self, pseudo: dict[str, Tensor], r: int) -> None:
        """The server's step of round ``r`` (from 0) with the round's pseudo-gradient (the
        negated average update), at the scheduled rate."""
        params = self.params()
        set_lr(self._optimizer, self.lr_of(r + 1))
        apply_pseudo_gradient(self._optimizer, list(params.values()),
                              [pseudo[k] for k in params])
        for k, p in params.items():
            self.weights[k] = p.detach().clone()

    def average_buffers(self, contents: list[RecordDict], counts: list[int]) -> None:
        """The floating arrays that nobody trains (nor a target network's parameters) as the
        sample-weighted average of what the valid replies hold after their step (their
        ``buffers`` record); a reply that holds none (or of other shapes, or not finite)
        leaves them."""
        own = set(self.trained or ()) | {t for t, _ in self.target_pairs()}
        kept = [k for k, v in self.weights.items() if v.is_floating_point() and k not in own]
        if not kept:
            return
        sums, total = {}, 0
        for content, n in zip(contents, counts, strict=True):
            try:
                buffers = codec.tensors_of(content.array_records["buffers"])
            except (KeyError, TypeError, ValueError):
                continue
            if any(k not in buffers or buffers[k].shape != self.weights[k].shape
                   or not torch.isfinite(buffers[k]).all() for k in kept):
                continue
            for k in kept:
                sums[k] = sums.get(k, 0) + n * buffers[k].to(torch.float64)
            total += n
        for k, value in sums.items():
            self.weights[k] = (value / total).to(self.weights[k].dtype)

    def target_pairs(self) -> list[tuple[str, str]]:
        """(target name, online name) of each parameter of a target network in the model
        (``dcco.dual_encoder(..., method=...)``'s ``target.0.*`` for ``backbone.*``,
        ``target.1.*`` for ``projector.*``), as ``DualEncoder.target_pairs`` pairs them: the
        targets of the trained arrays. The nodes never send them: the server moves BYOL's
        (``move_target``), and FedU's, FedEMA's and MoCo's clients keep their own."""
        pairs = []
        for name in self.trained or ():
            tower, _, rest = name.partition(".")
            target = {"backbone": "target.0.", "projector": "target.1."}.get(tower, "") + rest
            if target in self.weights and tower in ("backbone", "projector"):
                pairs.append((target, name))
        return pairs

    def move_target(self, tau: float) -> None:
        """BYOL's target update after the server's step: ξ ← τ ξ + (1 − τ) θ for each target
        parameter ξ and its online parameter θ (``DualEncoder.update_target``)."""
        for target, online in self.target_pairs():
            self.weights[target] = self.weights[target].lerp(self.weights[online], 1.0 - tau)

    def state(self) -> dict:
        """What a checkpoint keeps: the weights, the trained names, the optimiser's state,
        and the run's key for its clients' states on the nodes' disks."""
        return {"weights": self.weights, "trained": list(self.trained or []),
                "optimizer": self._optimizer.state_dict() if self._optimizer else None,
                "states_key": self.states_key}

    def load(self, state: dict) -> None:
        """``state``'s weights, names and optimiser (after ``begin``)."""
        self.weights = {k: v.clone() for k, v in state["weights"].items()}
        self.trained = list(state["trained"]) or self.trained
        self.states_key = str(state.get("states_key") or self.states_key)
        if state["optimizer"] is not None:
            self._params = {}
            self.params()
            self._optimizer.load_state_dict(state["optimizer"])


__all__ = ["ServerModel"]
