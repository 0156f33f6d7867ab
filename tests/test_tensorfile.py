"""dcco.tensorfile: safetensors files written row by row and read a tensor at a time, which
safetensors' own reader and writer agree with to the bit."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dcco.tensorfile import Stacked, TensorFile, write_tensors


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "f64": torch.randn(3, generator=gen, dtype=torch.float64),
        "f32": torch.randn(2, 3, generator=gen),
        "f16": torch.randn(5, generator=gen).half(),
        "bf16": torch.randn(4, generator=gen).bfloat16(),
        "i64": torch.arange(7),
        "u8": torch.arange(3, dtype=torch.uint8),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(0.25, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(4, 6, generator=gen)[:, ::2],  # not contiguous
    }


def test_write_tensors__safetensors_reads_every_dtype_and_the_metadata_to_the_bit(tmp_path):
    path = tmp_path / "t.safetensors"
    tensors = _tensors()
    write_tensors(path, tensors, {"format": "x", "n": 3})
    back = load_file(path)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    lazy = TensorFile(path)
    assert lazy.metadata == {"format": "x", "n": "3"}
    assert sorted(lazy) == sorted(tensors) and len(lazy) == len(tensors)
    assert all(torch.equal(lazy[k], v) for k, v in tensors.items())
    # each tensor's bytes start at a multiple of its element size, as safetensors places them
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    assert n % 8 == 0
    for name, value in tensors.items():
        assert header[name]["data_offsets"][0] % value.dtype.itemsize == 0, name


def test_stacked__is_written_as_the_stack_of_its_rows_without_stacking(tmp_path):
    rows = tuple(torch.full((2, 3), float(i)) for i in range(5))
    stacked = Stacked(rows)
    assert stacked.shape == (5, 2, 3) and stacked.dtype == torch.float32
    write_tensors(tmp_path / "s.safetensors", {"rows": stacked, "other": torch.ones(2)})
    assert torch.equal(load_file(tmp_path / "s.safetensors")["rows"], torch.stack(rows))
    assert torch.equal(stacked.tensor(), torch.stack(rows))
    with pytest.raises(ValueError, match="at least one row"):
        Stacked(())
    with pytest.raises(ValueError, match="row 1 .* rows must match"):
        Stacked((torch.zeros(2), torch.zeros(3)))
    with pytest.raises(ValueError, match="row 1 .*float16"):
        Stacked((torch.zeros(2), torch.zeros(2, dtype=torch.float16)))


def test_tensor_file__reads_safetensors_own_files_with_a_prefix(tmp_path):
    path = tmp_path / "o.safetensors"
    save_file({"model.w": torch.ones(2), "state.a": torch.arange(3), "state.b": torch.zeros(1)},
              path, metadata={"k": "v"})
    state = TensorFile(path, "state.")
    assert sorted(state) == ["a", "b"] and "a" in state and "w" not in state
    assert torch.equal(state["a"], torch.arange(3)) and state.metadata == {"k": "v"}
    with pytest.raises(KeyError):
        state["model.w"]


def test_write_tensors__is_atomic_and_refuses_a_dtype_safetensors_lacks(tmp_path,
                                                                         monkeypatch):
    import dcco.tensorfile as tf

    path = tmp_path / "t.safetensors"
    write_tensors(path, {"a": torch.ones(2)})
    with pytest.raises(ValueError, match="'bad' is torch.complex64"):
        write_tensors(path, {"z": torch.ones(2), "bad": torch.ones(2, dtype=torch.complex64)})
    written = []

    def failing(t):  # the disk fills up after the first row
        if written:
            raise OSError("No space left on device")
        written.append(t)
        return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())

    monkeypatch.setattr(tf, "_bytes", failing)
    with pytest.raises(OSError, match="No space"):
        write_tensors(path, {"rows": Stacked((torch.zeros(3), torch.zeros(3)))})
    assert torch.equal(load_file(path)["a"], torch.ones(2))  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]  # no temporary left
