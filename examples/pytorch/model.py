"""The example's model and data: a small convolutional network and a
synthetic, seeded image dataset (no download), shared by train.py and
compare.py."""

import torch
from torch import nn


class Net(nn.Module):
    """Two convolution+pool blocks and a linear classifier over 16x16
    one-channel images; width scales the channels (and the parameters)."""

    def __init__(self, width=1, classes=10):
        super().__init__()
        c1, c2 = 8 * width, 16 * width
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(c2 * 4 * 4, classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def dataset(samples, seed, classes=10, dtype=torch.float32):
    """samples images of classes noisy prototypes, and their labels; the
    same on every process for the same seed."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(classes, 1, 16, 16, generator=g)
    y = torch.randint(0, classes, (samples,), generator=g)
    x = protos[y] + 0.8 * torch.randn(samples, 1, 16, 16, generator=g)
    return x.to(dtype), y
