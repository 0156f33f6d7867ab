"""Checkpoints in safetensors, written atomically: a crash never leaves a half-written file.

A checkpoint holds the model, the optimiser state and the number of finished rounds. Nothing
else is needed to resume exactly: every random stream is a pure function of (seed, round).
It is written and read a tensor at a time (``dcco.tensorfile``): the clients' kept models of
FedEMA and FedU are saved row by row and restored tensor by tensor, never copied whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dcco.errors import UserError
from dcco.files import atomic_write_bytes, atomic_write_text, umask_mode  # noqa: F401 (re-exported)
from dcco.tensorfile import SafetensorError, Stacked, TensorFile, write_tensors

FORMAT = "dcco-checkpoint/1"


class CheckpointError(UserError):
    """A checkpoint file is missing, corrupt or does not fit the model."""


def save_checkpoint(path: str | Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None, rounds_done: int,
                    meta: dict[str, Any] | None = None,
                    state: Mapping[str, torch.Tensor | Stacked] | None = None) -> None:
    """Save model and optimiser state atomically to ``path`` (a .safetensors file), with the
    run's other round state (``state``, e.g. the last aggregated statistics, the clients'
    kept models as ``Stacked`` rows) if any."""
    path = Path(path)
    tensors: dict[str, torch.Tensor | Stacked] = {
        f"model.{k}": v.detach() for k, v in model.state_dict().items()}
    tensors |= {f"state.{k}": v if isinstance(v, Stacked) else v.detach()
                for k, v in (state or {}).items()}
    opt_meta: dict[str, Any] = {}
    if optimizer is not None:
        state = optimizer.state_dict()
        for pid, pstate in state["state"].items():
            for key, value in pstate.items():
                if torch.is_tensor(value):
                    tensors[f"optim.{pid}.{key}"] = value.detach()
                else:
                    opt_meta[f"{pid}.{key}"] = value
        opt_meta["param_groups"] = state["param_groups"]
    header = {
        "format": FORMAT,
        "rounds_done": str(rounds_done),
        "optim": json.dumps(opt_meta),
        "meta": json.dumps(meta or {}),
    }
    write_tensors(path, tensors, header)


def read_checkpoint(path: str | Path, prefix: str = ""
                    ) -> tuple[Mapping[str, torch.Tensor], dict[str, str]]:
    """The tensors (those whose names start with ``prefix``, the prefix dropped; each read
    from the file when asked for) and header of a checkpoint, with clear errors for bad
    files."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        tensors = _CheckpointTensors(path, prefix)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt: {e}") from None
    header = tensors.metadata
    if header.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a dcco checkpoint (format {header.get('format')!r})")
    return tensors, header


class _CheckpointTensors(TensorFile):
    """A checkpoint's tensors, read when asked for; a read that fails (the file changed or
    broke since it was opened) is a ``CheckpointError`` naming the file."""

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return super().__getitem__(key)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"checkpoint {self.path} is unreadable or corrupt: "
                                  f"{e}") from None


def load_checkpoint(path: str | Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> int:
    """Restore model (and optimiser) state in place; returns the number of finished rounds."""
    tensors, header = read_checkpoint(path)
    model_state = {k[len("model."):]: tensors[k] for k in tensors if k.startswith("model.")}
    try:
        model.load_state_dict(model_state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {e}") from None
    if optimizer is not None:
        opt_meta = json.loads(header["optim"])
        state: dict[int, dict[str, Any]] = {}
        for key in tensors:
            if key.startswith("optim."):
                _, pid, name = key.split(".", 2)
                state.setdefault(int(pid), {})[name] = tensors[key]
        for key, value in opt_meta.items():
            if key != "param_groups":
                pid, name = key.split(".", 1)
                state.setdefault(int(pid), {})[name] = value
        optimizer.load_state_dict({"state": state, "param_groups": opt_meta["param_groups"]})
    return int(header["rounds_done"])


def checkpoint_rounds(path: str | Path) -> int:
    """The rounds a checkpoint holds (0 when there is none yet)."""
    if not Path(path).is_file():
        return 0
    return int(read_checkpoint(path)[1]["rounds_done"])


def checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """The ``meta`` dictionary stored with a checkpoint."""
    return json.loads(read_checkpoint(path)[1]["meta"])


def checkpoint_state(path: str | Path) -> Mapping[str, torch.Tensor]:
    """The round state saved with a checkpoint (``save_checkpoint``'s ``state``), each
    tensor read from the file when asked for."""
    return read_checkpoint(path, "state.")[0]
