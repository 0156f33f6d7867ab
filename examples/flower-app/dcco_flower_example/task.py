"""The app's own model, data and augmentation: nothing here is dcco's."""

from __future__ import annotations

import functools

import kornia.augmentation as K
import torch
from torch import nn

from dcco.data import load_dataset


class SmallCNN(nn.Module):
    """The encoder: a batch of 1 × 28 × 28 images to 64 features."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 3, stride=2, padding=1), nn.GroupNorm(8, width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.GroupNorm(8, 2 * width),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


_VIEWS = nn.Sequential(K.RandomResizedCrop((28, 28), scale=(0.3, 1.0)),
                       K.RandomHorizontalFlip(), K.ColorJitter(0.4, 0.4, p=0.8))


def augment(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 1, 28, 28) → one random view of each, in [−1, 1]."""
    return (_VIEWS(images.float() / 255) - 0.5) / 0.5


@functools.lru_cache(maxsize=1)  # a simulation's nodes share a process: load once
def _train_split():
    return load_dataset("fashion_mnist", "train")


@functools.lru_cache(maxsize=1)
def _dirichlet(num_partitions: int, alpha: float):
    """flwr-datasets' DirichletPartitioner over Fashion-MNIST as a Hugging Face dataset."""
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    train = _train_split()
    features = datasets.Features({"image": datasets.Array2D((28, 28), "uint8"),
                                  "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": train.images[:, 0].numpy(),
                                     "label": train.labels.numpy()}, features=features)
    partitioner = DirichletPartitioner(num_partitions=num_partitions, partition_by="label",
                                       alpha=alpha, min_partition_size=2, seed=0)
    partitioner.dataset = ds
    return partitioner


def dirichlet_photos(partition_id: int, num_partitions: int, alpha: float) -> torch.Tensor:
    """This node's photos under a Dirichlet split by label (``partitioner = "dirichlet"``)."""
    from dcco.data.hf import column_tensor

    part = _dirichlet(num_partitions, alpha).load_partition(partition_id)
    return column_tensor(part, "image")


def node_photos(partition_id: int, per_node: int) -> torch.Tensor:
    """This node's photos: ``per_node`` Fashion-MNIST images of one class (the class of the
    partition id), different for every node."""
    train = _train_split()
    cls = partition_id % 10
    ids = (train.labels == cls).nonzero().flatten()
    start = (partition_id // 10) * per_node
    return train.images[ids[start:start + per_node]]

def server_photos(n: int = 32) -> torch.Tensor:
    """The server's own photos, for SecAgg+'s calibration step (``secagg = true``): the first
    ``n`` of the test split, which no node holds."""
    return load_dataset("fashion_mnist", "test").images[:n]


def fedavg_reply(msg, model: nn.Module, photos: torch.Tensor):
    """For the speed comparison with Flower's FedAvg (``compare-fedavg``): one local step of
    contrastive FedAvg (NT-Xent within the node) on the same model and photos, replied as
    Flower's FedAvg expects: the new weights and the sample count."""
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    import dcco

    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    update = dcco.local_update(model, augment(photos), augment(photos), None,
                               "contrastive_fedavg", lr=0.05)
    new = {k: v + update.delta[k] if k in update.delta else v
           for k, v in model.state_dict().items()}
    return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord(
        {"num-examples": update.num_samples, "loss": float(update.loss)})}), reply_to=msg)
