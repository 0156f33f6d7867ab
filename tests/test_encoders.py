"""A trained encoder in the user's own code: dcco.load_encoder and dcco export."""

from __future__ import annotations

import json

import pytest
import torch

import dcco
from dcco.cli import main
from dcco.errors import UserError
from dcco.evaluate import extract_features
from dcco.run.evaluations import pretrained_model
from dcco.run.rundir import RunDir
from dcco.run.splits import load_splits


@pytest.fixture
def trained_run(tiny_config, tmp_path):
    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    return run


def _evaluated_features(run_dir, images):
    """The features dcco's own evaluation computes for ``images``."""
    run = RunDir.open(run_dir)
    cfg = run.config()
    model = pretrained_model(cfg, run, images.shape[1], torch.device("cpu"))
    return extract_features(model, images, 64, torch.device("cpu"))


def test_load_encoder__same_features_as_dccos_evaluation_bit_for_bit(trained_run):
    cfg = RunDir.open(trained_run).config()
    _, test = load_splits(cfg)
    encoder = dcco.load_encoder(trained_run)
    assert isinstance(encoder, torch.nn.Module) and not encoder.training
    assert encoder.input_shape == (1, 12, 12) and "[−1, 1]" in encoder.normalisation
    with torch.no_grad():
        ours = encoder(encoder.preprocess(test.images[:40]))
    assert ours.shape == (40, encoder.output_dim)
    assert torch.equal(ours, _evaluated_features(trained_run, test.images[:40]))
    with torch.no_grad():
        projected = dcco.load_encoder(trained_run, with_projector=True)(
            encoder.preprocess(test.images[:5]))
    assert projected.shape == (5, 16)


def test_export__a_file_that_loads_without_the_run_directory(trained_run, tmp_path, capsys):
    out = tmp_path / "exported" / "encoder"
    assert main(["export", str(trained_run), "--out", str(out)]) == 0
    weights, meta = out.with_suffix(".safetensors"), out.with_suffix(".json")
    assert weights.is_file() and json.loads(meta.read_text())["input_shape"] == [1, 12, 12]
    assert "dcco.load_encoder" in capsys.readouterr().out
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for f in (weights, meta):
        f.rename(moved / f.name)
    import shutil

    cfg = RunDir.open(trained_run).config()
    _, test = load_splits(cfg)
    expected = _evaluated_features(trained_run, test.images[:20])
    shutil.rmtree(trained_run)
    encoder = dcco.load_encoder(moved / "encoder.safetensors")
    with torch.no_grad():
        assert torch.equal(encoder(encoder.preprocess(test.images[:20])), expected)
    assert encoder.info["method"] == "dcco" and encoder.info["rounds"] == 2


def test_export_and_load__refusals_name_the_problem(trained_run, tmp_path, capsys):
    out = tmp_path / "enc.safetensors"
    assert main(["export", str(trained_run), "--out", str(out)]) == 0
    assert main(["export", str(trained_run), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(UserError, match="tower 1 was asked for"):
        dcco.load_encoder(trained_run, tower=1)
    out.with_suffix(".json").unlink()
    with pytest.raises(UserError, match="neither a dcco run directory nor an encoder"):
        dcco.load_encoder(out)
