"""Tables and plots from run directories: comparable losses only, accuracy in %, bars by family."""

from __future__ import annotations

import pytest

from dcco.config import load_config
from dcco.run.report import (
    family,
    loss_panels,
    plot_accuracy_bars,
    plot_loss_curves,
    plot_run_curves,
)
from dcco.run.rundir import RunDir


def _run(path, method: str, records: list[dict]) -> RunDir:
    run = RunDir.create(path, load_config(None, [f"train.method={method}"]))
    for record in records:
        run.append_metrics(record)
    return run


def test_loss_panels__only_comparable_losses_share_a_panel(tmp_path):
    runs = [_run(tmp_path / m, m, [{"round": 10, "loss": 100.0}, {"round": 20, "loss": 90.0}])
            for m in ("dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco")]
    runs.append(_run(tmp_path / "none-logged", "dcco", []))
    panels = loss_panels(runs)
    methods = {kind: [m for m, _ in curves] for kind, curves in panels.items()}
    assert sorted(methods.values()) == [["cco_fedavg"], ["contrastive_fedavg"],
                                        ["dcco", "centralized_cco"]]
    assert panels[next(k for k in panels if "pooled" in k)][0][1] == [(10, 100.0), (20, 90.0)]
    assert plot_loss_curves(runs, tmp_path / "loss.png", "title").stat().st_size > 0


def test_plot_run_curves__one_logged_point_and_knn_in_percent(tmp_path):
    run = _run(tmp_path / "short", "dcco", [{"round": 5, "loss": 120.0}, {"round": 5, "knn": 0.613}])
    written = plot_run_curves(run)
    assert sorted(p.name for p in written) == ["knn.png", "loss.png"]


def test_family__colours_federated_centralized_and_reference_bars(tmp_path):
    assert [family(m) for m in ("dcco", "contrastive_fedavg", "centralized_cco", "supervised",
                                "random_init", None)] == [
        "federated", "federated", "centralized", "reference baseline", "reference baseline",
        "reference baseline"]
    path = plot_accuracy_bars(["dcco", "supervised"], [0.7, 0.8], tmp_path / "acc.png", "t",
                              families=["federated", "reference baseline"])
    assert path.stat().st_size > 0


def test_tensorboard__metrics_and_evaluations_read_back_with_tensorboards_reader(tiny_config,
                                                                               tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dcco.cli import main

    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=4)), "--run-dir", str(run),
                 "--no-progress", "--tensorboard"]) == 0
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "lr", "rounds_per_sec", "clients", "samples", "exchanges", "knn_percent",
            "bytes_per_client/up", "bytes_per_client/down", "eval/linear@40",
            "dead_dims", "corr_diag", "eff_rank"} <= tags  # the collapse figures too
    logged = [r for r in RunDir(run).metrics() if "loss" in r]
    assert [e.step for e in events.Scalars("loss")] == [r["round"] for r in logged]
    assert [e.value for e in events.Scalars("loss")] == [
        pytest.approx(r["loss"], rel=1e-6) for r in logged]
    summary = RunDir(run).summary()
    [accuracy] = events.Scalars("eval/linear@40")
    assert accuracy.step == 4
    assert accuracy.value == pytest.approx(
        100 * summary["evaluations"]["linear@40"]["accuracy"], rel=1e-6)


def test_tensorboard__off_by_default_and_missing_package_named(tiny_config, tmp_path,
                                                               monkeypatch, capsys):
    import importlib.util

    from dcco.cli import main

    run = tmp_path / "plain"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    assert not (run / "tensorboard").exists()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else find_spec(name, *a))
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(tmp_path / "tb"),
                 "--tensorboard"]) == 2
    assert "pip install 'dcco[tensorboard]'" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()


def test_knn_cell__old_raw_records_are_marked_new_standardized_ones_are_not():
    from dcco.run.report import knn_cell, knn_features

    assert knn_features({"knn": 0.5}) == "raw"  # written before records named their monitor
    assert knn_cell({"knn": 0.5}) == "50.0 (raw)"
    assert knn_cell({"knn": 0.612, "knn_features": "standardized"}) == "61.2"
    assert knn_cell({"knn": 0.612, "knn_features": "centered"}) == "61.2 (centered)"
    assert knn_cell({}) == "—"
