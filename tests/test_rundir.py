"""The run directory's record of where and with which code a run was made."""

from __future__ import annotations

import subprocess
from pathlib import Path

import dcco
from dcco.run import rundir
from dcco.run.rundir import RunDir, source_digest


def test_code_version__names_the_code_loaded_not_the_checkout_later(monkeypatch):
    before = rundir.code_version()
    assert before["source_sha256"] == source_digest(Path(dcco.__file__).resolve().parent)
    assert len(before["source_sha256"]) == 16 and before["gpu"] and before["cpu"]

    def git_moved_on(*args, **kwargs):  # a commit made while a long grid runs
        raise AssertionError("code_version must not ask git again")

    monkeypatch.setattr(subprocess, "run", git_moved_on)
    assert rundir.code_version()["git_commit"] == before["git_commit"]


def test_source_digest__changes_with_a_file_name_or_its_contents(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = source_digest(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    second = source_digest(tmp_path)
    (tmp_path / "a.py").rename(tmp_path / "b.py")
    assert len({first, second, source_digest(tmp_path)}) == 3


def test_compare__an_unfinished_run_shows_what_it_has_logged(tmp_path):
    from dcco.config import RunConfig
    from dcco.run.report import comparison_rows
    from dcco.run.rundir import RunDir

    cfg = RunConfig()
    run = RunDir.create(tmp_path / "stopped", cfg)
    for record in ({"round": 10, "loss": 9.5},
                   {"round": 20, "knn": 0.25, "knn_features": "standardized"},
                   {"round": 20, "loss": 8.25}):
        run.append_metrics(record)
    header, [row] = comparison_rows([run])
    shown = dict(zip(header, row, strict=True))
    assert shown["rounds"] == f"20 of {cfg.train.rounds} (unfinished)"
    assert shown["method"] == cfg.train.method and shown["final loss"] == "8.25"
    assert shown["k-NN"] == "25.0"


def test_open_or_create__another_config_is_refused_naming_the_keys(tmp_path):
    import pytest

    from dcco.config import load_config
    from dcco.run.rundir import RunDir, RunDirError

    RunDir.create(tmp_path / "run", load_config(None, ["train.rounds=10"]))
    with pytest.raises(RunDirError) as err:
        RunDir.open_or_create(tmp_path / "run",
                              load_config(None, ["train.rounds=20", "optim.lr=0.1"]))
    message = str(err.value)
    assert "train.rounds: 10 here, 20 asked" in message and "optim.lr: 0.005 here, 0.1 asked" \
        in message


def test_atomic_writes__files_get_the_umask_permissions(tmp_path):
    import os

    import torch

    from dcco.run.checkpoint import atomic_write_text, save_checkpoint

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        save_checkpoint(tmp_path / "c.safetensors", torch.nn.Linear(2, 2), None, 1)
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "c.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600


def test_run_dir__stores_a_relative_data_folder_as_absolute(tmp_path, monkeypatch):
    """So that `dcco evaluate RUN` finds the data from any working directory."""
    from dcco.config import load_config

    monkeypatch.chdir(tmp_path)
    run = RunDir.create(tmp_path / "r", load_config(None, ['data.data_dir="table"']))
    assert run.config().data.data_dir == str(tmp_path / "table")


def test_data_errors__show_a_relative_path_resolved(tmp_path, monkeypatch):
    import pytest

    from dcco.data import load_dataset
    from dcco.data.datasets import DataError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"nosuch/fmnist \(= .*/nosuch/fmnist\).*does not exist"):
        load_dataset("fashion_mnist", "train", "nosuch/fmnist", download=False)


def test_config_differences__compare_auto_as_this_machine_resolves_it():
    """A stored config that still says ``auto`` (written by hand, or from code before run
    directories stored it resolved) is compared as this machine resolves it: resuming it
    with the same settings finds no difference; another setting is named."""
    from dataclasses import replace

    from dcco.config import RunConfig
    from dcco.run.setup import resolved

    auto = replace(RunConfig(), train=replace(RunConfig().train, device="cpu"))
    assert auto.train.precision == "auto"
    assert rundir.config_differences(auto, auto) == ""
    assert rundir.config_differences(auto, resolved(auto)) == ""
    other = replace(auto, train=replace(auto.train, rounds=7))
    assert rundir.config_differences(auto, other) == "train.rounds: 100000 here, 7 asked"


def test_run_dir_errors__say_the_callers_words_and_paths_resolved(tmp_path, monkeypatch):
    """A relative path is shown as given and in full; the CLI's messages say --run-dir and
    --resume, fit's say run_dir=; a run directory under a file is refused by name."""
    import pytest
    import torch

    from dcco.config import ConfigError, load_config
    from dcco.run.rundir import FIT_WORDS, RunDirError

    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, [])
    (tmp_path / "afile").write_text("x")
    for words, name in ((rundir.CLI_WORDS, "--run-dir"), (FIT_WORDS, "run_dir=")):
        with pytest.raises(RunDirError, match=rf"^afile/sub \(= {tmp_path}/afile/sub\) cannot "
                                              rf"be a run directory: {tmp_path}/afile is a "
                                              rf"file, not a folder; choose another {name}$"):
            RunDir.create("afile/sub", cfg, words)
        with pytest.raises(RunDirError, match=rf"^afile \(= {tmp_path}/afile\) is a file"):
            RunDir.create("afile", cfg, words)
    with pytest.raises(RunDirError, match=rf"^no_such_run \(= {tmp_path}/no_such_run\) is not a "
                                          rf"dcco run directory \(it does not exist\)$"):
        RunDir.open("no_such_run")
    with pytest.raises(ConfigError, match=rf"missing.toml \(= {tmp_path}/missing.toml\) does "
                                          rf"not exist"):
        load_config("missing.toml")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="resume it with --resume full, or choose another "
                                          "--run-dir"):
        RunDir.create("full", cfg)
    with pytest.raises(RunDirError, match="call fit again with the same arguments to continue "
                                          "it, or choose another run_dir="):
        RunDir.create("full", cfg, FIT_WORDS)
    # dcco.fit under a file: its own words, nothing written
    with pytest.raises(RunDirError, match="choose another run_dir="):
        dcco.fit(torch.nn.Linear(4, 4), {f"c{k}": torch.randn(3, 4) for k in range(8)},
                 rounds=1, clients_per_round=2, augment=lambda x: x + torch.randn_like(x),
                 run_dir="afile/run", progress=False)
