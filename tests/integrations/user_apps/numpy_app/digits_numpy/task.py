"""A linear softmax classifier in NumPy and each node's share of the digits."""

from functools import cache

import numpy as np
from sklearn.datasets import load_digits

FEATURES, CLASSES = 64, 10


def initial_weights() -> list[np.ndarray]:
    return [np.zeros((FEATURES, CLASSES), np.float32), np.zeros(CLASSES, np.float32)]


@cache
def node_data(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The node's IID share of the digits, pixels scaled to [0, 1] (loaded once per process)."""
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(7).permutation(len(labels))
    part = np.array_split(order, num_partitions)[partition_id]
    return (images[part] / 16.0).astype(np.float32), labels[part]


def _probabilities(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    logits = x @ weights[0] + weights[1]
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def fit(weights: list[np.ndarray], x, y, epochs: int, lr: float, batch_size: int = 32):
    """Mini-batch gradient descent on the cross-entropy; return the new weights and their loss."""
    w, b = (a.copy() for a in weights)
    for _ in range(epochs):
        for start in range(0, len(y), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            grad = _probabilities([w, b], xb)
            grad[np.arange(len(yb)), yb] -= 1.0
            w -= lr * xb.T @ grad / len(yb)
            b -= lr * grad.mean(axis=0)
    return [w, b], score([w, b], x, y)[0]


def score(weights: list[np.ndarray], x, y) -> tuple[float, float]:
    """Return the cross-entropy and the accuracy of ``weights`` on ``(x, y)``."""
    p = _probabilities(weights, x)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float((p.argmax(axis=1) == y).mean())
