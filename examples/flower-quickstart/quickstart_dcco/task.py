"""Flower's quickstart task: its `Net`, data loaders, `train` and `test`, unchanged but for the
data (Fashion-MNIST from this machine, as 32 × 32 RGB images, instead of CIFAR-10 from the
Hugging Face hub, which this machine cannot reach; no torchvision) and two additions for DCCO
(`views`, `cco_loss_on`)."""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@functools.lru_cache(maxsize=1)
def _fashion_mnist_rgb32(images: int):
    """Fashion-MNIST's training split as a Hugging Face dataset of 32 × 32 RGB uint8 images
    ("img") and labels ("label"), the first ``images`` of it (0: all)."""
    import datasets

    from dcco.data import load_dataset

    train = load_dataset("fashion_mnist", "train")
    x = train.images[: images or None].numpy()[:, 0]
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)))[..., None].repeat(3, axis=-1)  # (N, 32, 32, 3)
    features = datasets.Features({"img": datasets.Array3D((32, 32, 3), "uint8"),
                                  "label": datasets.Value("int64")})
    return datasets.Dataset.from_dict({"img": x, "label": train.labels[: images or None]
                                       .numpy()}, features=features)


fds = None  # Cache FederatedDataset


def load_data(partition_id: int, num_partitions: int, batch_size: int, images: int = 0):
    """Load partition Fashion-MNIST data (IidPartitioner, as the quickstart partitions
    CIFAR-10)."""
    from flwr_datasets.partitioner import IidPartitioner

    global fds
    if fds is None:
        fds = IidPartitioner(num_partitions=num_partitions)
        fds.dataset = _fashion_mnist_rgb32(images)
    partition = fds.load_partition(partition_id)
    # Divide data on each node: 80% train, 20% test
    partition_train_test = partition.train_test_split(test_size=0.2, seed=42)

    def apply_transforms(batch):
        """Apply transforms to the partition from FederatedDataset."""
        # ToTensor() and Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), without torchvision
        batch["img"] = [(torch.as_tensor(np.asarray(img, dtype=np.float32)).permute(2, 0, 1)
                         / 255 - 0.5) / 0.5 for img in batch["img"]]
        return batch

    partition_train_test = partition_train_test.with_transform(apply_transforms)
    trainloader = DataLoader(partition_train_test["train"], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(partition_train_test["test"], batch_size=batch_size)
    return trainloader, testloader


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / len(trainloader)
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy


# ---- added for DCCO


def views():
    """The augmentation DCCO's two views are made with: dcco's ready one (crop, flip,
    colour jitter), for the loaders' images normalised to [−1, 1]."""
    from dcco.flower import ImageViews

    return ImageViews()


def cco_loss_on(net, testloader, seed: int = 0) -> float:
    """The CCO loss (paper eq. 1, at the strategy's default λ, ``dcco.config.USER``) of
    ``net``'s encodings of two seeded views of the test images: DCCO's evaluation, where the
    quickstart scores its classifier."""
    from dcco.config import USER
    from dcco.core.losses import cco_loss
    from dcco.core.stats import encoding_stats
    from dcco.flower.userapp import node_samples

    x = node_samples(testloader)
    augment = views()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        x1, x2 = augment(x), augment(x)
    net.eval()
    with torch.no_grad():
        return float(cco_loss(encoding_stats(net(x1), net(x2)).moments(), USER.lambd))
