"""Two towers on two modalities: paired data, the round equivalence for towers of different
architectures and input shapes, the CLIP baseline, and cross-modal evaluation."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from dcco.cli import main
from dcco.config import AugmentConfig, ConfigError, EvalConfig, ModelConfig, load_config
from dcco.core.losses import clip_loss, clip_loss_per_anchor, nt_xent
from dcco.core.simulator import run_round
from dcco.data import DataError, PairedDataset, load_split
from dcco.data.augment import modality_view, training_views
from dcco.data.paired import halves, load_npz_pairs
from dcco.errors import UserError
from dcco.evaluate import comparable, retrieval, retrieval_ranks
from dcco.methods import Segments, build_method
from dcco.models import MLP, ResNet, build_dual_encoder
from dcco.run.checkpoint import load_checkpoint, save_checkpoint
from dcco.run.encoders import load_encoder
from dcco.run.evaluations import evaluate_model
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import RunDir
from dcco.run.setup import build_model
from dcco.run.splits import load_splits

SIZES = [1, 3, 1, 5, 2, 4]
SIZES_FEDAVG = [2, 3, 5, 2, 4]
X_SHAPE, Y_SHAPE = (1, 12, 8), (10,)


def _two_towers(projector=(24, 16)):
    """A ResNet tower for 1×12×8 images and an MLP tower for 10 float features, float64."""
    cfg = ModelConfig(arch="resnet14", widths=(4, 8, 8), shared=False, y_arch="mlp",
                      y_widths=(16, 12))
    return build_dual_encoder(cfg, X_SHAPE, projector, seed=7, y_shape=Y_SHAPE).double()


def _pairs(sizes, seed=0):
    """Non-IID clients of pairs: each client's images and features share a base pattern."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    base_x = torch.rand(len(sizes), *X_SHAPE, generator=gen)
    base_y = torch.randn(len(sizes), *Y_SHAPE, generator=gen)
    client = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    x = (255 * (0.7 * base_x[client] + 0.3 * torch.rand(n, *X_SHAPE, generator=gen))).to(
        torch.uint8)
    y = base_y[client] + 0.5 * torch.randn(n, *Y_SHAPE, generator=gen, dtype=torch.float32)
    ids = torch.arange(n) + 100
    return training_views(x, y, ids - 100, seed=3, round_index=5, cfg=AugmentConfig.byol(),
                          cfg_y=AugmentConfig(enabled=False), dtype=torch.float64)


def _flat(result):
    return torch.cat([v.flatten() for v in result.pseudo_gradient.values()])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------ the round equivalence


def test_two_tower_dcco_round__equals_the_centralized_step_for_different_towers():
    """Paper appendix A with towers of different architectures (ResNet on 1×12×8 images, MLP
    on 10 features): one DCCO round, batched and client by client, is one centralized CCO
    step on the pooled batch, and gradients reach both towers."""
    model = _two_towers()
    assert isinstance(model.backbone, ResNet) and isinstance(model.backbone2, MLP)
    x, y = _pairs(SIZES)
    assert x.shape[1:] == X_SHAPE and y.shape[1:] == Y_SHAPE
    segments = Segments.from_counts(SIZES)
    dcco = build_method("dcco")
    batched = run_round(model, dcco, x, y, segments, "batched")
    reference = run_round(model, dcco, x, y, segments, "reference")
    central = run_round(model, build_method("centralized_cco"), x, y,
                        Segments.from_counts([sum(SIZES)]), "batched")
    assert _rel(_flat(batched), _flat(central)) <= 1e-9
    assert _rel(_flat(reference), _flat(central)) <= 1e-9
    assert abs(reference.loss - float(central.loss)) <= 1e-9 * abs(float(central.loss))
    for tower in ("backbone.", "backbone2.", "projector.", "projector2."):
        grads = [v for k, v in central.pseudo_gradient.items() if k.startswith(tower)]
        assert grads and torch.cat([g.flatten() for g in grads]).norm() > 0, tower
    # negative control: averaging the clients' own CCO losses is another update
    fedavg = run_round(model, build_method("cco_fedavg"), *_pairs(SIZES_FEDAVG),
                       Segments.from_counts(SIZES_FEDAVG), "reference")
    pooled = run_round(model, build_method("centralized_cco"), *_pairs(SIZES_FEDAVG),
                       Segments.from_counts([sum(SIZES_FEDAVG)]), "batched")
    assert _rel(_flat(fedavg), _flat(pooled)) > 1e-3


@pytest.mark.parametrize("method", ["clip_fedavg", "cco_fedavg"])
def test_two_tower_fedavg_round__batched_equals_reference(method):
    model, (x, y) = _two_towers(), _pairs(SIZES_FEDAVG, seed=1)
    segments = Segments.from_counts(SIZES_FEDAVG)
    batched = run_round(model, build_method(method), x, y, segments, "batched")
    reference = run_round(model, build_method(method), x, y, segments, "reference")
    assert _flat(reference).norm() > 0
    assert _rel(_flat(batched), _flat(reference)) <= 1e-9
    assert abs(float(batched.loss) - reference.loss) <= 1e-9 * abs(reference.loss)


# ----------------------------------------------------------------------------- CLIP loss


def _clip_transcription(f, g, tau):
    """The symmetric CLIP loss written out in Python floats."""
    def unit(v):
        norm = math.sqrt(sum(a * a for a in v))
        return [a / norm for a in v]

    fs, gs = [unit(r) for r in f.tolist()], [unit(r) for r in g.tolist()]
    n = len(fs)
    sim = [[sum(a * b for a, b in zip(fs[i], gs[j])) / tau for j in range(n)] for i in range(n)]
    rows = [math.log(sum(math.exp(s) for s in sim[i])) - sim[i][i] for i in range(n)]
    cols = [math.log(sum(math.exp(sim[i][j]) for i in range(n))) - sim[j][j] for j in range(n)]
    return (sum(rows) + sum(cols)) / (2 * n)


def test_clip_loss__equals_its_transcription_and_uses_no_same_modality_negatives():
    gen = torch.Generator().manual_seed(0)
    f, g = torch.randn(5, 3, generator=gen, dtype=torch.float64), torch.randn(
        5, 3, generator=gen, dtype=torch.float64)
    assert float(clip_loss(f, g, 0.5)) == pytest.approx(_clip_transcription(f, g, 0.5),
                                                        rel=1e-12)
    assert float(clip_loss(f, g, 0.5)) != pytest.approx(float(nt_xent(f, g, 0.5)), rel=1e-3)
    # within groups: each group's anchors equal the loss of the group alone
    groups = torch.tensor([0, 0, 1, 1, 1])
    per = clip_loss_per_anchor(f, g, 0.5, groups)
    alone = clip_loss_per_anchor(f[2:], g[2:], 0.5)
    assert torch.allclose(per[[2, 3, 4, 7, 8, 9]], alone, rtol=1e-12)


# ----------------------------------------------------------------------------- paired data


def test_paired_dataset__checks_its_fields():
    x, y = torch.zeros(4, 1, 6, 3, dtype=torch.uint8), torch.zeros(4, 7)
    labels = torch.tensor([0, 1, 0, 1])
    ok = PairedDataset("p", x, y, labels, 2, ("a", "b"))
    assert ok.input_shapes == ((1, 6, 3), (7,)) and len(ok.subset([3, 1])) == 2
    with pytest.raises(ValueError, match="y holds 3 samples but labels holds 4"):
        PairedDataset("p", x, y[:3], labels, 2, ("a", "b"))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        PairedDataset("p", x, y, labels + 1, 2, ("a", "b"))
    with pytest.raises(ValueError, match="NaN"):
        PairedDataset("p", x, torch.full((4, 7), math.nan), labels, 2, ("a", "b"))


def test_fashion_mnist_halves__are_the_left_and_right_halves(tiny_fmnist):
    images = load_split("fashion_mnist", "train", tiny_fmnist)
    pairs = load_split("fashion_mnist_halves", "train", tiny_fmnist)
    assert pairs.paired and pairs.input_shapes == ((1, 12, 6), (1, 12, 6))
    assert torch.equal(torch.cat([pairs.x, pairs.y], dim=-1), images.images)
    assert torch.equal(pairs.labels, images.labels)
    odd = type(images)("odd", images.images[..., :5].contiguous(), images.labels,
                       images.num_classes, images.class_names)
    with pytest.raises(ValueError, match="even width"):
        halves(odd)


def _write_npz(folder: Path, n=24, seed=0, **changes):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    arrays = {"x": rng.integers(0, 255, (n, 1, 8, 8), dtype=np.uint8),
              "y": (rng.standard_normal((n, 6)) + labels[:, None]).astype(np.float32),
              "labels": labels, "class_names": np.array(["a", "b", "c"])}
    arrays.update(changes)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", **arrays)
    return folder


def test_paired_npz__loads_the_users_pairs_and_names_every_problem(tmp_path):
    folder = _write_npz(tmp_path / "ok")
    pairs = load_npz_pairs("train", folder)
    assert pairs.input_shapes == ((1, 8, 8), (6,)) and pairs.class_names == ("a", "b", "c")
    assert pairs.x.dtype == torch.uint8 and pairs.y.dtype == torch.float32
    with pytest.raises(DataError, match="lacks the array"):
        load_npz_pairs("train", _write_npz(tmp_path / "a", y=None))
    with pytest.raises(DataError, match="x holds 5 rows but labels holds 24"):
        load_npz_pairs("train", _write_npz(tmp_path / "b", x=np.zeros((5, 3))))
    with pytest.raises(DataError, match="NaN"):
        load_npz_pairs("train", _write_npz(tmp_path / "c", y=np.full((24, 6), np.nan)))
    with pytest.raises(DataError, match="names only 2 classes"):
        load_npz_pairs("train", _write_npz(tmp_path / "d", class_names=np.array(["a", "b"])))
    with pytest.raises(DataError, match="does not exist"):
        load_npz_pairs("test", tmp_path / "nowhere")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "train.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz_pairs("train", tmp_path / "e")


def test_modality_view__augments_images_and_refuses_to_augment_features():
    images = torch.randint(0, 255, (3, 1, 8, 4), dtype=torch.uint8)
    ids = torch.arange(3)
    view = modality_view(images, ids, 0, 0, 0, AugmentConfig(), torch.float64)
    assert view.shape == images.shape and view.dtype == torch.float64
    plain = modality_view(images, ids, 0, 0, 0, AugmentConfig(enabled=False), torch.float64)
    assert torch.equal(plain, (images.double() / 255 - 0.5) / 0.5)
    tokens = torch.randint(0, 50, (3, 7))
    assert torch.equal(modality_view(tokens, ids, 0, 0, 1, AugmentConfig(enabled=False)), tokens)
    with pytest.raises(ValueError, match="augment_y.enabled = false"):
        modality_view(torch.zeros(3, 5), ids, 0, 0, 1, AugmentConfig(), section="augment_y")


def test_config__names_the_two_tower_mistakes(tiny_fmnist):
    with pytest.raises(ConfigError, match=r"\[augment_y\] configures the second modality"):
        load_config(None, ["augment_y.enabled=false"])
    with pytest.raises(ConfigError, match="set model.shared = false"):
        load_config(None, ['model.y_arch="mlp"'])
    with pytest.raises(ConfigError, match="data.data_dir"):
        load_config(None, ['data.dataset="paired_npz"'])
    with pytest.raises(ConfigError, match="model.y_widths must be one or more"):
        load_config(None, ["model.shared=false", 'model.y_arch="mlp"', "model.y_widths=[]"])
    with pytest.raises(ValueError, match="one shared network cannot read"):
        build_dual_encoder(ModelConfig(), (1, 12, 8), (8,), 0, y_shape=(10,))
    with pytest.raises(ValueError, match="use model.y_arch = 'mlp'"):
        build_dual_encoder(ModelConfig(shared=False), (1, 12, 8), (8,), 0, y_shape=(10,))


# ------------------------------------------------------------------------------ evaluation


def test_retrieval_ranks__count_the_gallery_rows_closer_than_the_partner():
    gallery = F.normalize(torch.tensor([[1.0, 0], [0, 1], [1, 1], [-1, 0]]), dim=1)
    queries = F.normalize(torch.tensor([[1.0, 0.1], [1, 0], [1, 1], [-1, 0.2]]), dim=1)
    # query 1 ([1, 0]) is closer to rows 0 and 2 than to its partner row 1
    assert retrieval_ranks(queries, gallery, chunk=3).tolist() == [0, 2, 0, 0]
    z = torch.tensor([[1.0, 100.0], [2.0, 300.0], [3.0, 200.0]])
    standardized = comparable(z, "standardized")
    assert torch.allclose(standardized.norm(dim=1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(comparable(z, "cosine"), F.normalize(z.double(), dim=1))


def test_retrieval__is_perfect_for_identical_towers_and_chance_for_unrelated_pairs():
    """With a shared encoder and Y = X every query finds its partner; with Y shuffled
    (unrelated pairs) recall@1 is near chance."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 255, (200, 1, 8, 8), dtype=torch.uint8, generator=gen)
    labels = torch.zeros(200, dtype=torch.int64)
    model = build_dual_encoder(ModelConfig(widths=(4, 8, 8)), 1, (16,), 0)
    same = retrieval(model, PairedDataset("p", x, x.clone(), labels, 1, ("a",)), 150, 0,
                     torch.device("cpu"))
    assert same.details["x_to_y"] == {"recall@1": 1.0, "recall@5": 1.0}
    assert same.accuracy == 1.0 and same.num_test == 150
    shuffled = PairedDataset("p", x, x[torch.randperm(200, generator=gen)], labels, 1, ("a",))
    other = retrieval(model, shuffled, 200, 0, torch.device("cpu"), "cosine")
    assert other.details["y_to_x"]["recall@1"] < 0.05
    assert other.details["similarity"] == "cosine"


def test_paired_protocols__are_refused_for_image_data(tiny_fmnist):
    cfg = load_config(None, [f'data.data_dir="{tiny_fmnist}"'])
    train, test = load_splits(cfg)
    model = build_dual_encoder(ModelConfig(widths=(4, 8, 8)), 1, (16,), 0)
    for protocol in ("retrieval", "linear_y"):
        with pytest.raises(UserError, match="needs paired data"):
            evaluate_model(model, protocol, EvalConfig(labels=20), 0, train, test,
                           torch.device("cpu"))


# ------------------------------------------------------------------------- end to end


def test_two_view_run__pretrains_resumes_and_evaluates_both_towers(tiny_config, tiny_fmnist,
                                                                    tmp_path, capsys):
    """The CLI on two-view Fashion-MNIST (the tiny files' halves): a two-tower DCCO run whose
    towers differ in width, interrupted and resumed bit-identically, then its retrieval and
    both towers' probes recorded."""
    config = tiny_config(method="dcco", rounds=4, checkpoint_every=2)
    sets = ["--set", 'data.dataset="fashion_mnist_halves"', "--set", "model.shared=false",
            "--set", "model.y_widths=[4, 4, 8]", "--set", "augment_y.flip_p=0.0",
            "--no-progress"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["pretrain", str(config), "--run-dir", str(full), *sets]) == 0
    summary = json.loads((full / "summary.json").read_text())
    assert summary["input_shape"] == [1, 12, 6] and summary["input_shape_y"] == [1, 12, 6]
    cfg = RunDir.open(full).config()
    assert cfg.augment_y.flip_p == 0.0 and cfg.model.y_widths == (4, 4, 8)
    train, _ = load_splits(cfg)
    pt = Pretraining.of(cfg, train)  # interrupted after round 2, then resumed by the CLI
    assert pt.model.backbone2.feature_dim == 8 and pt.second is not None
    pt.step(), pt.step()
    save_checkpoint(RunDir.create(part, cfg).checkpoint_path, pt.model, pt.optimizer, 2,
                    meta={"method": "dcco"}, state=pt.round_state())
    assert main(["pretrain", "--resume", str(part), "--no-progress"]) == 0
    a, b = (load_file(p / "checkpoint.safetensors") for p in (full, part))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for protocol in ("retrieval", "linear", "linear_y"):
        assert main(["evaluate", str(full), "--protocol", protocol, "--labels", "30",
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "retrieval in a gallery of 30 test pairs (standardized)" in out
    evaluations = json.loads((full / "summary.json").read_text())["evaluations"]
    assert {"retrieval@30", "linear@30", "linear_y@30"} <= set(evaluations)
    assert set(evaluations["retrieval@30"]["details"]["x_to_y"]) == {"recall@1", "recall@5"}
    assert evaluations["linear@30"]["protocol"] == "linear"
    assert evaluations["linear_y@30"]["protocol"] == "linear_y"


def test_user_pairs__images_and_features_through_the_cli_export_and_load(tiny_config,
                                                                        tmp_path, capsys):
    """paired_npz with a ResNet on images and an MLP on float features: pretrain with the
    CLI, export, and load each tower; the loaded feature tower gives the run's features."""

    folder = _write_npz(tmp_path / "pairs", n=48)
    config = tiny_config(method="dcco", rounds=2)
    run = tmp_path / "run"
    assert main(["pretrain", str(config), "--run-dir", str(run), "--no-progress",
                 "--set", 'data.dataset="paired_npz"', "--set", f'data.data_dir="{folder}"',
                 "--set", "model.shared=false", "--set", 'model.y_arch="mlp"',
                 "--set", "model.y_widths=[12]", "--set", "augment_y.enabled=false",
                 "--set", "eval.labels=12"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["input_shape"] == [1, 8, 8] and summary["input_shape_y"] == [6]
    out = tmp_path / "enc.safetensors"
    assert main(["export", str(run), "--out", str(out)]) == 0
    test = load_npz_pairs("test", folder)
    cfg = RunDir.open(run).config()
    model = build_model(cfg, *test.input_shapes)

    load_checkpoint(run / "checkpoint.safetensors", model)
    model.eval()
    for source in (run, out):
        text = load_encoder(source, tower=1)
        assert text.input_shape == (6,) and text.output_dim == 12
        with torch.no_grad():
            assert torch.equal(text(text.preprocess(test.y)), model.features(test.y, 1))
        image = load_encoder(source, tower=0)
        assert image.input_shape == (1, 8, 8)
    capsys.readouterr()
    assert main(["pretrain", str(config), "--run-dir", str(tmp_path / "bad"), "--no-progress",
                 "--set", 'data.dataset="paired_npz"', "--set", f'data.data_dir="{folder}"',
                 "--set", "model.shared=false", "--set", 'model.y_arch="mlp"']) != 0
    assert "Y of 'paired_npz' holds torch.float32 samples of shape (6,); set " \
           "augment_y.enabled = false" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before a run directory was made


def test_multimodal_guide__example_runs_and_beats_chance(tmp_path):
    """docs/multimodal.md's script (image-caption pairs, the user's own text tower), run as
    the user would, learns cross-modal retrieval well above chance (5/256 at recall@5)."""

    root = Path(__file__).parents[1]
    guide = (root / "docs" / "multimodal.md").read_text()
    code = guide.split("## Your own tower")[1].split("```python\n")[1].split("```")[0]
    script = tmp_path / "my_pairs.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["x_to_y", "y_to_x"]
    for line in lines:
        _, at5 = map(float, re.fullmatch(r"\w+: recall@1 ([\d.]+)%, recall@5 ([\d.]+)%",
                                            line).groups())
        assert at5 > 4 * 100 * 5 / 256, line


def _pairs_of(x, y, classes=3):
    labels = torch.arange(x.shape[0]) % classes
    return PairedDataset("p", x, y, labels, classes, tuple("abc"[:classes]))


def test_feature_modalities__integer_and_four_channel_features_train_through_an_mlp():
    """Only uint8 (N, 1|3, H, W) is an image; integer features and uint8 of 4 channels go to
    the mlp tower as features (cast to floats there)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 255, (24, 1, 8, 8), dtype=torch.uint8, generator=gen)
    for y in (torch.randint(0, 9, (24, 10), generator=gen),
              torch.randint(0, 255, (24, 4, 3, 3), dtype=torch.uint8, generator=gen)):
        cfg = load_config(None, ['data.dataset="pairs"', "data.samples_per_client=2",
                                 "model.shared=false", "model.widths=[4, 4, 8]",
                                 'model.y_arch="mlp"', "model.y_widths=[8]",
                                 "model.projector=[8]", "augment_y.enabled=false",
                                 "train.clients_per_round=4", "train.rounds=2",
                                 'train.device="cpu"'])
        pt = Pretraining.of(cfg, _pairs_of(x, y))
        assert math.isfinite(float(pt.step().loss))
        with pytest.raises(ConfigError, match="augment_y.enabled = false"):
            Pretraining.of(load_config(None, ['data.dataset="pairs"', "model.shared=false",
                                           'model.y_arch="mlp"', "train.clients_per_round=2"]),
                        _pairs_of(x, y))


def test_check_data__refuses_towers_that_cannot_read_their_inputs(tmp_path, tiny_config,
                                                                  capsys):
    folder = _write_npz(tmp_path / "pairs", n=48)
    config = tiny_config(method="dcco", rounds=2)
    base = ["pretrain", str(config), "--no-progress", "--set", 'data.dataset="paired_npz"',
            "--set", f'data.data_dir="{folder}"', "--set", "augment_y.enabled=false"]
    for extra, said in ((["--set", "model.shared=true"], "one shared network cannot read"),
                        (["--set", "model.shared=false"], "use model.y_arch = 'mlp'")):
        run = tmp_path / f"run-{len(said)}"
        assert main([*base, "--run-dir", str(run), *extra]) != 0
        assert said in capsys.readouterr().err
        assert not run.exists()  # refused before a run directory was made
    mismatched = _write_npz(tmp_path / "mismatch", n=48)
    np.savez(mismatched / "test.npz", x=np.zeros((6, 1, 8, 8), np.uint8),
             y=np.zeros((6, 7), np.float32), labels=np.zeros(6, np.int64))
    cfg = load_config(None, ['data.dataset="paired_npz"', f'data.data_dir="{mismatched}"',
                             "model.shared=false", 'model.y_arch="mlp"',
                             "augment_y.enabled=false"])
    with pytest.raises(DataError, match="the test split's Y are torch.float32 \\(7,\\)"):
        load_splits(cfg)


def test_evaluations__refuse_what_they_cannot_measure(tmp_path):
    x = torch.randint(0, 255, (12, 1, 8, 8), dtype=torch.uint8)
    model = _two_towers().float()
    one_class = PairedDataset("p", x[:, :, :, :8], x.flatten(1)[:, :10].float(),
                              torch.zeros(12, dtype=torch.int64), 1, ("a",))
    small = load_npz_pairs("test", _write_npz(tmp_path / "p", n=24))
    with pytest.raises(UserError, match="has 1 class"):
        evaluate_model(model, "linear_y", EvalConfig(labels=4), 0, one_class, one_class,
                       torch.device("cpu"))
    with pytest.raises(UserError, match="retrieval@100 asks for a gallery of 100"):
        evaluate_model(model, "retrieval", EvalConfig(labels=100), 0, small, small,
                       torch.device("cpu"))


def test_reproduce__supervised_cells_of_paired_data_are_na(tmp_path):
    from dcco.reproduce import load_grid, plan_cells

    grid_file = tmp_path / "grid.toml"
    grid_file.write_text((Path(__file__).parents[1] / "experiments" / "two_view_fmnist.toml")
                         .read_text().replace('"centralized_cco"]',
                                              '"centralized_cco", "supervised"]'))
    cells = plan_cells(load_grid(grid_file, "tiny"), tmp_path / "out")
    (supervised,) = [c for c in cells if c.method == "supervised"]
    assert "paired data has none" in supervised.na


def test_load_encoder__rebuilds_a_paired_run_mid_run_from_its_checkpoint(tmp_path):
    """Before a run's summary exists, its checkpoint's meta holds the towers' inputs."""
    folder = _write_npz(tmp_path / "pairs", n=48)
    cfg = load_config(None, ['data.dataset="paired_npz"', f'data.data_dir="{folder}"',
                             "data.samples_per_client=2", "model.shared=false",
                             "model.widths=[4, 4, 8]", 'model.y_arch="mlp"',
                             "model.y_widths=[8]", "model.projector=[8]",
                             "augment_y.enabled=false", "train.clients_per_round=4",
                             "train.rounds=4", "train.checkpoint_every=1", 'train.device="cpu"'])
    train, _ = load_splits(cfg)
    run = RunDir.create(tmp_path / "run", cfg)
    pt = Pretraining.of(cfg, train)
    pt.step()
    save_checkpoint(run.checkpoint_path, pt.model, pt.optimizer, 1,
                    meta={"method": "dcco"} | pt.inputs_record)
    text = load_encoder(run.path, tower=1)
    assert text.input_shape == (6,) and text.normalisation.startswith("the stored values")
    assert load_encoder(run.path, tower=0).input_shape == (1, 8, 8)


@pytest.mark.parametrize("method", ["dvicreg", "vicreg_fedavg", "contrastive_fedavg"])
def test_other_methods__train_two_towers_on_pairs(method):
    """docs/multimodal.md: the VICReg methods and NT-Xent run on pairs too."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 255, (24, 1, 8, 8), dtype=torch.uint8, generator=gen)
    y = torch.randn(24, 10, generator=gen)
    cfg = load_config(None, ['data.dataset="pairs"', "data.samples_per_client=2",
                             "model.shared=false", "model.widths=[4, 4, 8]",
                             'model.y_arch="mlp"', "model.y_widths=[8]", "model.projector=[8]",
                             "augment_y.enabled=false", "train.clients_per_round=4",
                             'train.device="cpu"', f'train.method="{method}"'])
    pt = Pretraining.of(cfg, _pairs_of(x, y))
    before = [p.detach().clone() for _, p in pt.params]
    assert math.isfinite(float(pt.step().loss))
    assert any(not torch.equal(a, p) for a, (name, p) in zip(before, pt.params)
               if name.startswith("backbone2."))
