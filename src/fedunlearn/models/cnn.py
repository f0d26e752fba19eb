"""The convolutional networks of the Crab, FedADP and Starfish papers.

Paper: FedADP (Jiang et al.), Sec. VI-A4 (two conv layers, FC 1024 -> 512 -> 10; 1600 on
CIFAR-10); Starfish (Liu et al.), Sec. VI-A (one more FC layer for Fashion-MNIST). Read as
``Conv(c,32,5)-ReLU-MaxPool2-Conv(32,64,5)-ReLU-MaxPool2-Flatten-Linear(->512)-ReLU-Linear(512,10)``
(582,026 parameters on 28x28x1 MNIST, 878,538 on 32x32x3 CIFAR-10 with its 1600-wide flatten):
unpadded 5x5 convolutions, as the 1024-wide flatten implies. The Fashion-MNIST variant adds
``Linear(512,128)`` before the classifier. Both readings: EN1 in docs/methods/README.md.
"""

from __future__ import annotations

import torch
from torch import nn


class PaperCNN(nn.Module):
    """Two unpadded 5x5 conv blocks and a 512-wide hidden layer (optionally a 128-wide one too)."""

    def __init__(
        self, input_shape: tuple[int, int, int], num_classes: int, extra_hidden: int | None = None
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = 64 * (((height - 4) // 2 - 4) // 2) * (((width - 4) // 2 - 4) // 2)
        head: list[nn.Module] = [nn.Linear(flat, 512), nn.ReLU()]
        if extra_hidden is None:
            head.append(nn.Linear(512, num_classes))
        else:
            head += [nn.Linear(512, extra_hidden), nn.ReLU(), nn.Linear(extra_hidden, num_classes)]
        self.classifier = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape (batch, num_classes)."""
        return self.classifier(self.features(x))
