"""Trains an MLP (and, with --cnn, a small CNN) on scikit-learn's 8x8 handwritten digits.

Needs scikit-learn (the data set ships inside it, so this runs offline):
    pip install scikit-learn && python examples/train_digits.py [--cnn] [--device cpu]
"""
from __future__ import annotations

import argparse
import os

import numpy as np
from rich.progress import Progress
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import portkit.tensor as pt
from portkit import nn, optim
from portkit.tensor import Tensor


class MLP(nn.Module):
    """64 -> 128 -> 10 with ReLU."""

    def __init__(self):
        self.l1, self.l2 = nn.Linear(64, 128), nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


class CNN(nn.Module):
    """conv 3x3 (8) -> relu -> maxpool 2 -> linear 10."""

    def __init__(self):
        self.conv, self.fc = nn.Conv2d(1, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x.reshape(-1, 1, 8, 8)).relu().max_pool2d(2)
        return self.fc(x.flatten(1))


def train(cnn: bool = False, epochs: int = 20, batch: int = 64, seed: int = 0) -> float:
    """Trains and returns the test accuracy."""
    pt.seed(seed)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed)
    model = CNN() if cnn else MLP()
    opt = optim.Adam(model.parameters(), lr=3e-3 if cnn else 1e-3)
    rng = np.random.default_rng(seed)
    steps = epochs * (len(x_train) // batch)
    with Progress() as progress:
        task = progress.add_task("training", total=steps)
        for _ in range(epochs):
            order = rng.permutation(len(x_train))
            for start in range(0, len(order) - batch + 1, batch):
                pick = order[start:start + batch]
                opt.zero_grad()
                loss = model(Tensor(x_train[pick])).cross_entropy(Tensor(y_train[pick]))
                loss.backward()
                opt.step()
                progress.update(task, advance=1, description=f"loss {loss.item():.4f}")
    predicted = model(Tensor(x_test)).argmax(1).numpy()
    return float((predicted == y_test).mean())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cnn", action="store_true")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--device", help="a backend from `portkit backends` (default: cpu)")
    args = parser.parse_args()
    if args.device:
        os.environ["PORTKIT_DEVICE"] = args.device   # the stack's default device
    accuracy = train(args.cnn, args.epochs)
    print(f"test accuracy: {accuracy:.3f}")
