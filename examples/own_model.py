"""Your own encoder and augmentation, trained with DCCO over 15,000 phones of 4 photos each.

    python examples/own_model.py [RUN_DIR [ROUNDS]]     # 100 rounds: about a minute, 2 cores
"""
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


def augment(images: torch.Tensor) -> torch.Tensor:  # uint8 (N, 1, 28, 28) → one view each
    return (views(images.float() / 255) - 0.5) / 0.5


train = load_dataset("fashion_mnist", "train")
order = train.labels.argsort(stable=True)  # one class a phone: the non-IID extreme
clients = {f"phone-{i}": train.images[order[i:i + 4]] for i in range(0, len(order), 4)}
result = dcco.fit(SmallCNN(), clients, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 100,
                  augment=augment, clients_per_round=32,
                  run_dir=sys.argv[1] if len(sys.argv) > 1 else None)
print(f"final loss {result.summary['final_loss']:.1f}; run directory {result.run_dir}")
encoder = dcco.load_encoder(result.run_dir, model=SmallCNN())  # your module, trained
print("features:", tuple(encoder(augment(train.images[:8])).shape))
