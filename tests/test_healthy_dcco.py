"""The healthy-DCCO study (issue 97; docs/results/healthy-dcco.md): its grid starts from the
fair fight's DCCO pick on the same validation split, and its doc shows the table its records
give."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

from dcco.reproduce import load_grid, plan_cells

ROOT = Path(__file__).resolve().parents[1]


def _table_module():
    spec = importlib.util.spec_from_file_location(
        "healthy_dcco_table", ROOT / "experiments" / "healthy_dcco_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthy_dcco_grid__r1_is_the_fair_fights_dcco_pick_on_its_validation_split():
    study = load_grid(ROOT / "experiments" / "healthy_dcco.toml", "study")
    fair = load_grid(ROOT / "experiments" / "fair_fmnist.toml", "tune")
    ours, theirs = study.recipe_bases["dcco", "r1"], fair.recipe_bases["dcco", "r1"]
    # client_state_dtype is for the methods whose clients keep a state; DCCO's keep none
    assert replace(ours, train=replace(ours.train, client_state_dtype="float16")) == theirs
    cells = {c.path.name: c.cfg for c in plan_cells(study, Path("out"))}
    pick = cells["non-iid-4-dcco-r1-s0"]
    assert (pick.data.alpha, pick.data.samples_per_client, pick.train.clients_per_round) == (
        0.0, 4, 32) and pick.data.validation == 5000
    assert cells["non-iid-4-dcco-r2-s0"].loss.eps == 1e-12
    assert cells["non-iid-4-dcco-r3-s0"].optim.vector_lr_scale == 0.024
    assert cells["non-iid-4-at-64-a-round-dcco-r1-s0"].train.clients_per_round == 64


def test_healthy_dcco_doc__shows_the_table_its_records_give():
    table = _table_module()
    assert table.main(["--check"]) == 0, \
        "docs/results/healthy-dcco.md is stale: python experiments/healthy_dcco_table.py --write"
    changes = table.recipes()
    assert changes["r1"] == [] and changes["r2"] == ["loss.eps=1e-12"]
    assert changes["r3"] == ["optim.vector_lr_scale=0.024"]
    assert "| non-iid-4 r1 s0 | — (the pick) |" in table.table()


def test_eq1_config__is_the_studys_r13_on_the_small_config():
    """configs/fmnist_small_eq1.toml trains the study's r13 (Adam 1e-3, 120 warm-up rounds,
    1,200 rounds) on configs/fmnist_small.toml's data, model, augmentation and loss, so that
    what the study measured is what the file runs."""
    from dcco.config import load_config

    small = load_config(ROOT / "configs" / "fmnist_small.toml")
    eq1 = load_config(ROOT / "configs" / "fmnist_small_eq1.toml")
    study = load_grid(ROOT / "experiments" / "healthy_dcco.toml", "study")
    r13, = (c.cfg for c in plan_cells(study, Path("out"))
            if c.path.name == "non-iid-4-dcco-r13-s0")
    assert (eq1.data, eq1.model, eq1.augment, eq1.loss) == (
        small.data, small.model, small.augment, small.loss)
    assert (eq1.model.widths, eq1.model.projector, eq1.model.norm) == (
        r13.model.widths, r13.model.projector, r13.model.norm)
    for field in ("optimizer", "lr", "warmup_rounds", "weight_decay", "schedule"):
        assert getattr(eq1.optim, field) == getattr(r13.optim, field), field
    assert (eq1.train.rounds, eq1.train.clients_per_round) == (
        r13.train.rounds, r13.train.clients_per_round) == (1200, 32)
    assert eq1.loss.eps == r13.loss.eps == 1e-5
