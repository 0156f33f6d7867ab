"""Checkpoints: atomic, exact round trip of model and optimiser state, clear errors."""

import pytest
import torch
from torch import nn

from dcco.config import OptimConfig
from dcco.core.optim import build_optimizer
from dcco.run.checkpoint import CheckpointError, checkpoint_meta, load_checkpoint, save_checkpoint


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.GroupNorm(2, 8), nn.Linear(8, 3))


@pytest.mark.parametrize("name", ["adam", "lars"])
def test_checkpoint__round_trip_restores_model_and_optimizer_exactly(tmp_path, name):
    net = _net()
    opt = build_optimizer(net.named_parameters(), OptimConfig(optimizer=name, weight_decay=1e-4))
    for _ in range(3):
        net(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, net, opt, rounds_done=3, meta={"method": "dcco"})
    net2 = _net(seed=1)
    opt2 = build_optimizer(net2.named_parameters(), OptimConfig(optimizer=name, weight_decay=1e-4))
    assert load_checkpoint(path, net2, opt2) == 3
    assert checkpoint_meta(path) == {"method": "dcco"}
    for a, b in zip(net.state_dict().values(), net2.state_dict().values()):
        assert torch.equal(a, b)
    x = torch.randn(5, 4)
    for n, o in ((net, opt), (net2, opt2)):  # the next step is identical too
        n(x).square().mean().backward()
        o.step()
    for a, b in zip(net.parameters(), net2.parameters()):
        assert torch.equal(a, b)


def test_checkpoint__leaves_no_temporary_files(tmp_path):
    save_checkpoint(tmp_path / "c.safetensors", _net(), None, 0)
    save_checkpoint(tmp_path / "c.safetensors", _net(), None, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors"]


def test_checkpoint__corrupt_or_mismatched_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        load_checkpoint(bad, _net())
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors", _net())
    good = tmp_path / "good.safetensors"
    save_checkpoint(good, _net(), None, 0)
    with pytest.raises(CheckpointError, match="does not fit"):
        load_checkpoint(good, nn.Linear(4, 3))


def test_checkpoint__a_file_broken_after_it_was_opened_is_named_when_a_tensor_is_read(tmp_path):
    """The tensors are read when asked for: a checkpoint that breaks after it was opened
    gives a CheckpointError naming it, not the reader's own error."""
    from dcco.run.checkpoint import checkpoint_state

    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, _net(), None, rounds_done=1, state={"a": torch.ones(3)})
    state = checkpoint_state(path)
    assert torch.equal(state["a"], torch.ones(3))
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="ckpt.safetensors is unreadable or corrupt"):
        state["a"]
