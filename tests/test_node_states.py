"""A node's clients' states on its own disk (``dcco.flower.node_states``): they outlive the
Flower run, so a run resumed with ``flower.resume = true`` (a new Flower run, whose nodes'
contexts start empty) gives FedU's, FedEMA's and MoCo's clients the states they had at the
checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dcco.config import load_config
from dcco.flower.app.client_app import app as client_app
from dcco.flower.app.federation import Federation
from dcco.flower.app.nodes import node_data
from dcco.flower.app.run import STATES_KEY, run_federated
from dcco.flower.appconfig import FlowerConfig, run_config_entries
from dcco.flower.codec import Instruction, decode_instruction, encode_instruction
from dcco.flower.node_states import (
    ENVIRONMENT,
    FolderStates,
    StateFolderError,
    new_states_key,
    state_folder,
)
from dcco.flower.testing.inprocess import InProcessGrid
from dcco.run.splits import load_splits

NODES = 3
ROOT = Path(__file__).resolve().parents[1]


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 3), value), "n": torch.tensor([value], dtype=torch.float64)}


def test_folder_states__a_round_starts_from_the_newest_earlier_state_and_prunes_what_no_resume_needs(
        tmp_path):
    """Round r reads the newest version before r; a version of round r or later (a stopped
    run's) is never read and is replaced or deleted by round r's own; with checkpoints every
    2 rounds, round r keeps the versions from the last checkpoint's round on and the newest
    one before it (what a resume from that checkpoint reads)."""
    key = new_states_key()

    def at(r: int) -> FolderStates:
        return FolderStates(tmp_path, key, r, checkpoint_every=2)

    assert at(0).get(7) is None
    at(0).put(7, _state(0.0))
    at(1).put(7, _state(1.0))
    assert at(1).versions(7) == [0, 1]
    at(3).put(7, _state(3.0))  # the checkpoint of 2 rounds done needs version 1, not 0
    assert at(3).versions(7) == [1, 3]
    assert torch.equal(at(2).get(7)["w"], _state(1.0)["w"])  # 3 is a stopped run's future
    assert at(4).get(7)["n"].dtype == torch.float64
    assert float(at(4).get(7)["w"][0, 0]) == 3.0
    at(2).put(7, _state(20.0))  # the rerun of round 2: round 3's old version goes
    assert at(2).versions(7) == [1, 2]
    assert float(at(3).get(7)["w"][0, 0]) == 20.0
    for r in (3, 4):
        at(r).put(7, _state(float(r)))
    # at round 4 the checkpoint of 4 rounds done is on disk: of versions 0-3 only 3 stays
    assert at(4).versions(7) == [3, 4]
    at(5).put(7, _state(5.0))
    assert at(5).versions(7) == [3, 4, 5]
    assert at(6).versions(8) == [] and at(6).get(8) is None  # another client: none
    assert {p.parent.name for p in tmp_path.rglob("*.safetensors")} == {key}


def test_folder_states__float16_holding_and_bad_settings_are_named(tmp_path, monkeypatch):
    half = FolderStates(tmp_path, "k", 1, checkpoint_every=1, dtype=torch.float16)
    half.put(3, {"w": torch.tensor([1.0 / 3.0])})
    back = FolderStates(tmp_path, "k", 2, checkpoint_every=1, dtype=torch.float16).get(3)
    assert back["w"].dtype == torch.float32
    assert float(back["w"]) == float(torch.tensor(1.0 / 3.0).half())
    with pytest.raises(StateFolderError, match="no usable run key.*older dcco"):
        FolderStates(tmp_path, "", 0, checkpoint_every=1)
    with pytest.raises(StateFolderError, match="no usable run key"):
        FolderStates(tmp_path, "../elsewhere", 0, checkpoint_every=1)
    (tmp_path / "file").write_text("")
    with pytest.raises(StateFolderError, match="client-state-dir .* cannot hold"):
        FolderStates(tmp_path / "file", "k", 0, checkpoint_every=1)
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    assert state_folder({"partition-id": 0}) is None
    assert state_folder({"client-state-dir": "/x"}) == Path("/x")
    with pytest.raises(StateFolderError, match="client-state-dir must be a folder path"):
        state_folder({"client-state-dir": 3})
    assert state_folder({"client-state-dir": "rel"}) == Path.cwd() / "rel"
    monkeypatch.setenv(ENVIRONMENT, "")
    with pytest.raises(StateFolderError, match="DCCO_CLIENT_STATE_DIR must be a folder"):
        state_folder({})
    monkeypatch.setenv(ENVIRONMENT, str(tmp_path / "env"))
    assert state_folder({}) == tmp_path / "env"
    assert state_folder({"client-state-dir": "/y"}) == Path("/y")  # the node config first


def test_node_config__the_documented_flag_gives_the_folder():
    """docs/flower.md's ``--node-config`` string, as Flower's SuperNode parses it."""
    from flwr.common.config import parse_config_args

    text = (ROOT / "docs" / "flower.md").read_text()
    assert """client-state-dir="PATH"'`""" in text
    parsed = parse_config_args(['partition-id=0 num-partitions=2 client-state-dir="/d/s t"'])
    assert state_folder(parsed) == Path("/d/s t")


def test_instruction__carries_the_states_key_and_older_messages_read_without_one():
    ins = Instruction("update", 2, (1, 4), states_key="abc")
    assert decode_instruction(encode_instruction(ins)).states_key == "abc"
    assert decode_instruction(encode_instruction(replace(ins, states_key=""))).states_key == ""


class _Crash(Exception):
    pass


def test_flower_resume__clients_on_the_nodes_disk_get_their_checkpoint_state_back_bit_identically(
        tiny_config, tmp_path, monkeypatch):
    """A FedEMA run that dies in its 4th round (checkpoints every 2, so its nodes hold states
    of round 3 that the checkpoint does not) and resumes in a new Flower run (new node
    contexts, empty) ends with the model of a run that never stopped and kept its states in
    ``context.state``, to the bit, when the nodes keep their clients' states on disk; with
    the states in ``context.state`` only, the resumed run's returning clients start afresh
    and the model differs."""
    cfg = load_config(tiny_config(method="fedema", rounds=4, checkpoint_every=2), [
        'train.precision="float64"', 'train.backend="reference"', "data.num_clients=6",
        "train.clients_per_round=4", "train.local_steps=2", "train.local_lr=0.05",
        'optim.optimizer="sgd"', "optim.lr=1.0"])
    train, _ = load_splits(cfg)

    def grid(fcfg: FlowerConfig, folder: str | None) -> InProcessGrid:
        extra = {} if folder is None else {"client-state-dir": folder}
        return InProcessGrid(client_app, [{"partition-id": i, "num-partitions": NODES} | extra
                                          for i in range(NODES)], run_config_entries(cfg, fcfg))

    def final(name: str) -> dict[str, torch.Tensor]:
        assert json.loads((tmp_path / name / "summary.json").read_text())["rounds"] == 4
        saved = load_file(tmp_path / name / "checkpoint.safetensors")
        return {k: v for k, v in saved.items() if k.startswith("model.")}

    monkeypatch.delenv(ENVIRONMENT, raising=False)
    real_step = Federation.step

    def dies_in_round_4(self):
        if self.pt.rounds_done == 3:
            raise _Crash
        return real_step(self)

    disk = str(tmp_path / "nodes")  # the uninterrupted run keeps them in context.state
    for name, folder in (("whole", None), ("cut", disk), ("cut-context", None)):
        fcfg = FlowerConfig(min_nodes=NODES, run_dir=str(tmp_path / name))
        if name != "whole":
            monkeypatch.setattr(Federation, "step", dies_in_round_4)
            with pytest.raises(_Crash):
                run_federated(grid(fcfg, folder), cfg, fcfg, train)
            monkeypatch.setattr(Federation, "step", real_step)
            fcfg = replace(fcfg, resume=True)
        assert run_federated(grid(fcfg, folder), cfg, fcfg, train)["rounds"] == 4
    node_data.cache_clear()

    whole, cut, context_only = final("whole"), final("cut"), final("cut-context")
    assert any(k.startswith("model.target.") for k in whole)
    for k in whole:
        assert torch.equal(whole[k], cut[k]), k
    assert any(not torch.equal(whole[k], context_only[k]) for k in whole)
    # one folder, named by the run's key, which the resumed run kept; most of the 6 clients
    # came back, each under its own name
    key = json.loads((tmp_path / "cut" / "summary.json").read_text())[STATES_KEY]
    assert [p.name for p in (tmp_path / "nodes").iterdir()] == [key]
    files = list((tmp_path / "nodes" / key).glob("*.safetensors"))
    assert len({p.name.split(".")[0] for p in files}) > 4
