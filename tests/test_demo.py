"""The main job's pipeline on tiny data: every method, the baselines, the table; rerun resumes."""

from dcco.cli import main

TINY = ["model.widths=[4,8,8]", "model.projector=[16,16,16]", "train.rounds=2",
        "train.clients_per_round=4", "train.log_every=1", "eval.labels=40", "eval.probe_steps=5",
        "eval.scratch_epochs=1", "eval.scratch_batch=16", "eval.knn_k=5"]


def test_demo__runs_every_method_and_writes_table_and_plots(tiny_fmnist, tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["demo", "--run-dir", str(out), "--data-dir", str(tiny_fmnist), "--no-progress"]
    args += [x for o in TINY for x in ("--set", o)]
    assert main(args) == 0
    first = capsys.readouterr().out
    table = (out / "results.md").read_text()
    for name in ("dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco", "supervised",
                 "random_init", "raw_pixels"):
        assert f"| {name} |" in table and f"| {name} |" in first
    assert (out / "accuracy.png").is_file() and (out / "loss.png").is_file()
    assert (out / "results.csv").read_text().count("\n") == 8
    # at 40 labels (under the few-label probe's 50) one probe column; the raw pixels' probe is
    # a linear probe of the flattened images
    assert "test accuracy, 40 labels" in table and "50 labels" not in table
    import json

    raw = json.loads((out / "raw_pixels" / "summary.json").read_text())
    assert raw["method"] == "raw_pixels" and set(raw["evaluations"]) == {"linear@40"}
    assert main(args) == 0  # a rerun finds everything done and only rebuilds the table
    second = capsys.readouterr().out
    assert "] pretraining" not in second and "linear probe with" not in second


def test_demo__table_says_round_in_the_singular_for_one(tiny_fmnist, tmp_path):
    out = tmp_path / "demo"
    args = ["demo", "--run-dir", str(out), "--data-dir", str(tiny_fmnist), "--no-progress"]
    args += [x for o in TINY for x in ("--set", o.replace("train.rounds=2", "train.rounds=1"))]
    assert main(args) == 0
    table = (out / "results.md").read_text()
    assert "| 1 round |" in table and "1 rounds" not in table


def test_demo__a_refused_demo_leaves_no_trace_and_the_corrected_one_runs(tiny_fmnist, tmp_path,
                                                                       capsys):
    out = tmp_path / "demo"
    args = ["demo", "--run-dir", str(out), "--data-dir", str(tiny_fmnist), "--no-progress"]
    args += [x for o in TINY for x in ("--set", o)]
    assert main([*args, "--set", "train.clients_per_round=20000"]) == 2
    assert "train.clients_per_round = 20000" in capsys.readouterr().err
    assert not out.exists()
    assert main(args) == 0


def test_demo__its_config_file_is_the_demos_config():
    """configs/demo_fmnist.toml, the demo's settings as a file a user can read and run a part
    of, is ``DEMO_CONFIG`` key for key."""
    from pathlib import Path

    from dcco.config import load_config
    from dcco.demo import DEMO_CONFIG

    path = Path(__file__).resolve().parents[1] / "configs" / "demo_fmnist.toml"
    assert load_config(path) == DEMO_CONFIG


def test_recipes__one_place_for_every_entry_points_defaults():
    """The demo, ``dcco.fit``, the Flower strategy and a config file start from the named
    recipes of ``dcco.config.recipes``, and nothing else holds a set of defaults."""
    import inspect

    from dcco.config import RunConfig
    from dcco.config.recipes import DEMO, PAPER, RECIPES, USER
    from dcco.demo import DEMO_CONFIG
    from dcco.fitting import fit_config
    from dcco.flower import DCCOStrategy

    assert set(RECIPES) == {"paper", "user", "demo"}
    assert DEMO_CONFIG is DEMO and PAPER == RunConfig()
    fitted = fit_config("dcco", 1, USER.clients_per_round, list(USER.projector), 0, [])
    assert fitted.optim == USER.optim and fitted.loss.lambd == USER.lambd
    # every default a public entry point exposes for a user's model is the recipe's
    import dcco

    expected = {"optimizer": USER.optim.optimizer, "lr": USER.optim.lr,
                "weight_decay": USER.optim.weight_decay,
                "warmup_rounds": USER.optim.warmup_rounds, "schedule": USER.optim.schedule,
                "vector_lr_scale": USER.optim.vector_lr_scale, "lambd": USER.lambd,
                "projector": USER.projector, "clients_per_round": USER.clients_per_round}
    checked = set()
    for entry in (dcco.fit, dcco.dual_encoder, DCCOStrategy, dcco.flower.answer,
                  dcco.flower.evaluate_encoder, dcco.linear_probe):
        for name, parameter in inspect.signature(entry).parameters.items():
            if name in expected and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == expected[name], (entry.__qualname__, name)
                checked.add((entry.__qualname__, name))
    assert {("fit", "projector"), ("fit", "clients_per_round"), ("dual_encoder", "projector"),
            ("DCCOStrategy", "lr"), ("DCCOStrategy", "lambd"),
            ("DCCOStrategy", "weight_decay")} <= checked
    assert not hasattr(dcco.config, "USER_RECIPE")  # one home: dcco.config.recipes


def test_demo__probes_at_few_labels_beside_its_labels(tiny_fmnist, tmp_path, capsys):
    """With more labels than the few-label probe's 50, every part is probed at both counts
    (supervised trained at both), each a column of the table."""
    import json

    out = tmp_path / "demo"
    args = ["demo", "--run-dir", str(out), "--data-dir", str(tiny_fmnist), "--no-progress"]
    args += [x for o in TINY for x in ("--set", o.replace("eval.labels=40", "eval.labels=80"))]
    assert main(args) == 0
    table = (out / "results.md").read_text()
    assert "test accuracy, 50 labels (%)" in table and "test accuracy, 80 labels (%)" in table
    for part, key in (("dcco", "linear"), ("supervised", "supervised"),
                      ("random_init", "linear"), ("raw_pixels", "linear")):
        recorded = json.loads((out / part / "summary.json").read_text())["evaluations"]
        assert {f"{key}@50", f"{key}@80"} <= set(recorded), part
