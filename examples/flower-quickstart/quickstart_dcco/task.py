"""The app's model, data and loops: a FedAvg tutorial's shape (a small CNN with no
normalisation, an IID partition of a labelled image set, loaders of dict batches, one epoch
of SGD and an accuracy), written for this example, and a contrastive node's epoch (NT-Xent on
two views of each batch) to set DCCO beside.

Its data is Fashion-MNIST from this machine (dcco's loader), padded to 32 × 32 and repeated
to 3 channels, stored as a Hugging Face ``datasets.Image`` column (PNG bytes decoded as each
item is read), as a hub data set such as CIFAR-10 stores its images."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    """Two 3 × 3 convolutions (8 and 16 channels), each with a ReLU and 2 × 2 max pooling,
    then three linear layers (128, 64, ``outputs``): no normalisation anywhere. Under FedAvg
    the outputs are class scores; under DCCO, an encoding of ``outputs`` dimensions."""

    def __init__(self, outputs: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 64),
            nn.ReLU(), nn.Linear(64, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@functools.lru_cache(maxsize=2)
def image_dataset(images: int):
    """The first ``images`` of Fashion-MNIST's training split (0: all 60,000) as a Hugging
    Face dataset: ``img`` (``datasets.Image``, 32 × 32 RGB) and ``label``."""
    import datasets

    from dcco.data import load_dataset

    train = load_dataset("fashion_mnist", "train")
    grey = train.images[: images or None].numpy()[:, 0]
    rgb = np.repeat(np.pad(grey, ((0, 0), (2, 2), (2, 2)))[..., None], 3, axis=-1)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    return datasets.Dataset.from_dict(
        {"img": list(rgb), "label": train.labels[: images or None].numpy()},
        features=features)


@functools.lru_cache(maxsize=8)
def _partition(partition_id: int, num_partitions: int, images: int):
    """This node's share (flwr-datasets' ``IidPartitioner``), split 80/20 into its training
    and held-out samples."""
    from flwr_datasets.partitioner import IidPartitioner

    partitioner = IidPartitioner(num_partitions=num_partitions)
    partitioner.dataset = image_dataset(images)
    return partitioner.load_partition(partition_id).train_test_split(test_size=0.2, seed=0)


def _to_tensors(batch: dict) -> dict:
    """A batch of PIL images to float tensors (C, H, W) in [−1, 1]."""
    batch["img"] = [torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1)
                    .div(127.5).sub(1.0) for img in batch["img"]]
    return batch


def load_data(partition_id: int, num_partitions: int, batch_size: int, images: int = 0
              ) -> tuple[DataLoader, DataLoader]:
    """This node's training and held-out loaders of ``{"img", "label"}`` batches."""
    split = _partition(partition_id, num_partitions, images).with_transform(_to_tensors)
    return (DataLoader(split["train"], batch_size=batch_size, shuffle=True),
            DataLoader(split["test"], batch_size=batch_size))


def train_supervised(net: nn.Module, loader: DataLoader, epochs: int, lr: float) -> float:
    """``epochs`` of SGD (momentum 0.9) on cross-entropy; the mean loss of the batches."""
    optimiser = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    losses = []
    for _ in range(epochs):
        for batch in loader:
            loss = nn.functional.cross_entropy(net(batch["img"]), batch["label"])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
    return sum(losses) / max(len(losses), 1)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """SimCLR's loss on a batch of pairs: each of the 2B encodings should pick its partner
    out of the other 2B − 1 by cosine similarity (a softmax at ``temperature``)."""
    z = nn.functional.normalize(torch.cat([z1, z2]), dim=1)
    scores = z @ z.T / temperature
    scores.fill_diagonal_(float("-inf"))  # an encoding is not its own partner
    b = len(z1)
    partners = torch.cat([torch.arange(b, 2 * b), torch.arange(b)])
    return nn.functional.cross_entropy(scores, partners)


def train_contrastive(net: nn.Module, loader: DataLoader, views, epochs: int,
                      lr: float) -> float:
    """``epochs`` of SGD (momentum 0.9) on NT-Xent between two ``views`` of each batch: the
    contrastive FedAvg node, with DCCO's two views and the supervised node's loop; the mean
    loss of the batches."""
    optimiser = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    losses = []
    for _ in range(epochs):
        for batch in loader:
            if len(batch["img"]) < 2:  # a pair needs another sample to be told apart from
                continue
            loss = nt_xent(net(views(batch["img"])), net(views(batch["img"])))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
    return sum(losses) / max(len(losses), 1)


def accuracy(net: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """The mean cross-entropy and the share of samples classified right."""
    net.eval()
    loss, right, seen = 0.0, 0, 0
    with torch.no_grad():
        for batch in loader:
            scores = net(batch["img"])
            loss += float(nn.functional.cross_entropy(scores, batch["label"], reduction="sum"))
            right += int((scores.argmax(1) == batch["label"]).sum())
            seen += len(batch["label"])
    return loss / max(seen, 1), right / max(seen, 1)


def cco_loss_on(net: nn.Module, loader: DataLoader, seed: int = 0) -> float:
    """The CCO loss (paper eq. 1, at the strategy's default λ) of ``net``'s encodings of two
    seeded views of the loader's images (``experiments/quickstart_loss.py`` scores the
    untrained and the trained model with it)."""
    from dcco.config import USER
    from dcco.core.losses import cco_loss
    from dcco.core.stats import encoding_stats
    from dcco.flower import ImageViews
    from dcco.flower.userapp import node_samples

    x, views = node_samples(loader), ImageViews()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        x1, x2 = views(x), views(x)
    net.eval()
    with torch.no_grad():
        return float(cco_loss(encoding_stats(net(x1), net(x2)).moments(), USER.lambd))
