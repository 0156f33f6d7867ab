"""Clients from flwr-datasets partitioners over a Hugging Face dataset built here (no hub):
their samples as tensors, fed to ``dcco.fit`` and to a Flower node's ``dcco.flower.answer``."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from flwr_datasets.partitioner import DirichletPartitioner, NaturalIdPartitioner
from PIL import Image
from torch import nn

import dcco
from dcco.data.datasets import DataError
from dcco.data.hf import clients_of_partitioner, column_tensor


def _dataset(n: int = 60, channels: int = 1) -> datasets.Dataset:
    rng = np.random.default_rng(0)
    shape = (12, 12) if channels == 1 else (12, 12, 3)
    images = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for _ in range(n)]
    return datasets.Dataset.from_dict(
        {"image": images, "label": [i % 3 for i in range(n)],
         "writer": [f"w{i % 7}" for i in range(n)]}).cast_column("image", datasets.Image())


def test_column_tensor__images_as_uint8_nchw_and_bad_columns_named():
    grey, colour = column_tensor(_dataset()), column_tensor(_dataset(8, 3))
    assert grey.shape == (60, 1, 12, 12) and grey.dtype == torch.uint8
    assert colour.shape == (8, 3, 12, 12)
    ds = _dataset(4)
    assert torch.equal(grey[:4, 0], torch.from_numpy(np.stack(
        [np.asarray(im) for im in ds["image"]])))
    with pytest.raises(DataError, match="no column 'pixels'; its columns are image, label"):
        column_tensor(ds, "pixels")
    with pytest.raises(DataError, match="holds no samples"):
        column_tensor(ds.select([]))


def test_partitioners__give_fits_clients_and_train(tmp_path):
    ds = _dataset()
    natural = clients_of_partitioner(NaturalIdPartitioner(partition_by="writer"), dataset=ds)
    assert len(natural) == 7 and sum(len(v) for v in natural.values()) == 60
    drawn = clients_of_partitioner(DirichletPartitioner(
        num_partitions=5, partition_by="label", alpha=0.5, min_partition_size=2, seed=0),
        dataset=ds)
    assert sum(len(v) for v in drawn.values()) == 60

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.head = nn.Linear(4, 8)

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)).mean((2, 3)))

    def augment(images):
        return images.float() / 255 + 0.05 * torch.randn(images.shape)

    result = dcco.fit(Tiny(), natural, rounds=2, clients_per_round=4, augment=augment,
                      projector=(8, 8), progress=False, settings=["train.log_every=1"],
                      run_dir=tmp_path / "run")
    assert result.summary["rounds"] == 2


def test_column_tensor__array_features_keep_their_dtype():
    features = datasets.Features({"image": datasets.Array2D((4, 4), "uint8"),
                                  "x": datasets.Array2D((2, 3), "float32")})
    ds = datasets.Dataset.from_dict({"image": np.full((3, 4, 4), 7, np.uint8),
                                     "x": np.ones((3, 2, 3), np.float32)}, features=features)
    images = column_tensor(ds, "image")
    assert images.dtype == torch.uint8 and images.shape == (3, 1, 4, 4)
    x = column_tensor(ds, "x")
    assert x.dtype == torch.float32 and x.shape == (3, 2, 3)


def test_column_tensor__deep_images_refused_palette_converted_lists_keep_their_dtype():
    deep = [Image.fromarray(np.full((4, 4), 60000, np.uint16)) for _ in range(2)]
    ds = datasets.Dataset.from_dict({"image": deep}).cast_column("image", datasets.Image())
    with pytest.raises(DataError, match="more than 8 bits"):
        column_tensor(ds)
    palette = [Image.fromarray(np.full((4, 4, 3), 200, np.uint8)).convert("P")
               for _ in range(2)]
    ds = datasets.Dataset.from_dict({"image": palette}).cast_column("image", datasets.Image())
    out = column_tensor(ds)
    assert out.shape == (2, 3, 4, 4) and abs(int(out.max()) - 200) <= 5  # colours, not indices
    ds = datasets.Dataset.from_dict({"x": [[1.5, 2.5], [3.5, 4.5]], "t": ["a", "b"]}).cast(
        datasets.Features({"x": datasets.Sequence(datasets.Value("float64")),
                           "t": datasets.Value("string")}))
    assert column_tensor(ds, "x").dtype == torch.float64
    with pytest.raises(DataError, match="holds <U1 values, not numbers|not numbers"):
        column_tensor(ds, "t")
