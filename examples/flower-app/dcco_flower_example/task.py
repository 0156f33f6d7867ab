"""The app's own model, data and augmentation: nothing here is dcco's."""

from __future__ import annotations

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


def node_photos(partition_id: int, per_node: int) -> torch.Tensor:
    """This node's photos: ``per_node`` Fashion-MNIST images of one class (the class of the
    partition id), different for every node."""
    train = load_dataset("fashion_mnist", "train")
    cls = partition_id % 10
    ids = (train.labels == cls).nonzero().flatten()
    start = (partition_id // 10) * per_node
    return train.images[ids[start:start + per_node]]
