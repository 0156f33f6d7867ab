"""Your own encoder and augmentation, trained with DCCO over 15,000 phones of 4 photos each,
then probed against the same encoder untrained.

    python examples/own_model.py [RUN_DIR [ROUNDS]]     # 100 rounds: about 2 minutes, 2 cores
"""
import copy
import sys

import kornia.augmentation as K
import torch
from torch import nn

import dcco
from dcco.data import load_dataset


class SmallCNN(nn.Module):  # any module from a batch of inputs to (N, d) features
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 3, stride=2, padding=1), nn.GroupNorm(8, width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.GroupNorm(8, 2 * width),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


views = nn.Sequential(K.RandomResizedCrop((28, 28), scale=(0.3, 1.0)),
                      K.RandomHorizontalFlip(), K.ColorJitter(0.4, 0.4, p=0.8))


def plain(images: torch.Tensor) -> torch.Tensor:  # uint8 (N, 1, 28, 28) → floats in [-1, 1]
    return (images.float() / 255 - 0.5) / 0.5


def augment(images: torch.Tensor) -> torch.Tensor:  # one augmented view of each image
    return (views(images.float() / 255) - 0.5) / 0.5


train, test = load_dataset("fashion_mnist", "train"), load_dataset("fashion_mnist", "test")
order = train.labels.argsort(stable=True)  # one class a phone: the non-IID extreme
clients = {f"phone-{i}": train.images[order[i:i + 4]] for i in range(0, len(order), 4)}

torch.manual_seed(0)
encoder = SmallCNN()
untrained = copy.deepcopy(encoder)  # the same weights, left as they are
result = dcco.fit(encoder, clients, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 100,
                  augment=augment, clients_per_round=32,
                  run_dir=sys.argv[1] if len(sys.argv) > 1 else None)
print(f"final loss {result.summary['final_loss']:.1f}; run directory {result.run_dir}")
print("collapse figures:", result.collapse)

# a linear probe on 5,000 labelled photos (every 12th), scored on the 10,000 test photos
labelled = (train.images[::12][:5000], train.labels[::12][:5000])
scored = (test.images, test.labels)
for name, module in (("trained", encoder), ("untrained", untrained)):
    accuracy = dcco.linear_probe(module, labelled, scored, transform=plain)
    print(f"{name}: linear probe {100 * accuracy:.1f} %")
