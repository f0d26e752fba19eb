"""The model: two conv blocks with BatchNorm, then a linear head."""

from __future__ import annotations

from torch import nn


class SmallBNNet(nn.Module):
    """Conv -> BatchNorm -> ReLU -> MaxPool, twice, then Linear; for (C, H, W) images."""

    def __init__(self, channels: int, size: int, num_classes: int, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * (size // 4) ** 2, num_classes)

    def forward(self, x):
        """Return the logits of a batch of images (N, C, H, W)."""
        return self.head(self.features(x).flatten(1))


def make(input_shape: tuple[int, ...], num_classes: int, width: int = 8) -> nn.Module:
    """The factory fedunlearn calls: ``(input_shape, num_classes, **options) -> nn.Module``."""
    channels, size, _ = input_shape
    return SmallBNNet(channels, size, num_classes, width)
