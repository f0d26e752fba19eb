"""Benchmark a user's model factory against the identical built-in model, same executor.

Target (issue 23): a model built by a user factory (``model.factory``, here a module written
outside fedunlearn with the same layers) trains at >= 0.95x the samples/s of the built-in model
of the same architecture, through the same executor (the one ``training.executor: auto`` picks
for it, checked to be the same for both).

Both federations are built by ``fedunlearn.runs.build_setup`` from one config (the user one
with ``model=factory``), so they hold the same clients' data; one repeat is one whole round
(every client's local epoch) from the same global model, A and B interleaved, medians reported
(of wall time, and of this process's CPU time, which other processes' load on a shared machine
disturbs less).

    python benchmarks/bench_user_model.py                       # MNIST if present, else digits
    python benchmarks/bench_user_model.py --mnist ../shared/data/mnist.npz --repeats 7
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from fedunlearn.config import parse_config
from fedunlearn.fl.clients import TrainTask
from fedunlearn.runs import build_setup

DEFAULT_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist.npz"


class UserMLP(nn.Module):
    """A user's MLP: the layers of the built-in ``mlp`` (Flatten, Linear-ReLU, Linear)."""

    def __init__(self, features: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.hidden = nn.Linear(features, hidden)
        self.act = nn.ReLU()
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits."""
        return self.out(self.act(self.hidden(self.flatten(x))))


class UserCNN(nn.Module):
    """A user's CNN: the layers of the built-in ``cnn`` (two 5x5 conv blocks, 512 hidden)."""

    def __init__(self, channels: int, size: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        side = ((size - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(64 * side * side, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits."""
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def user_mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> nn.Module:
    """The user factory of the MLP."""
    return UserMLP(int(torch.tensor(input_shape).prod()), hidden, num_classes)


def user_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The user factory of the CNN."""
    channels, size, _ = input_shape
    return UserCNN(channels, size, num_classes)


def time_round(setup, params: torch.Tensor, round_: int) -> tuple[float, float]:
    """Return (wall, this process's CPU) seconds of one whole round from ``params``."""
    fed = setup.federation
    wall, cpu = time.perf_counter(), time.process_time()
    fed.train(TrainTask(params, sorted(fed.client_ids), round_))
    return time.perf_counter() - wall, time.process_time() - cpu


def compare(name: str, data: dict, model: dict, factory, repeats: int, device: str) -> dict:
    """Time the built-in model and the user factory's, interleaved; return the medians."""
    base = {
        "seed": 0,
        "data": data,
        "training": {"rounds": 1, "batch_size": 64, "lr": 0.01, "device": device},
    }
    builtin = build_setup(parse_config({**base, "model": model}))
    user = build_setup(parse_config(base), model=factory)
    try:
        executors = (builtin.federation.executor.name, user.federation.executor.name)
        if executors[0] != executors[1]:
            raise SystemExit(f"{name}: executors differ {executors}; the comparison is void")
        samples = sum(builtin.federation.num_samples(c) for c in builtin.federation.client_ids)
        for setup in (builtin, user):  # warm-up: pool start, kernels, caches
            time_round(setup, setup.initial_params, 1)
        times: dict[str, list[tuple[float, float]]] = {"builtin": [], "user": []}
        for r in range(repeats):
            order = (("builtin", builtin), ("user", user))
            for label, setup in order if r % 2 == 0 else order[::-1]:
                times[label].append(time_round(setup, setup.initial_params, 2 + r))
    finally:
        builtin.close()
        user.close()
    rate = {k: samples / statistics.median(t[0] for t in v) for k, v in times.items()}
    cpu = {k: samples / statistics.median(t[1] for t in v) for k, v in times.items()}
    return {
        "model": name,
        "executor": executors[0],
        "samples": samples,
        "builtin_samples_per_s": rate["builtin"],
        "user_samples_per_s": rate["user"],
        "ratio": rate["user"] / rate["builtin"],
        "cpu_ratio": cpu["user"] / cpu["builtin"],
    }


def main() -> None:
    """Run the comparison and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, default=DEFAULT_MNIST)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--train-samples", type=int, default=6000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--skip-cnn", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mnist.exists():
        data = {
            "dataset": "mnist",
            "data_dir": str(args.mnist.parent),
            "num_clients": args.clients,
            "max_train_samples": args.train_samples,
            "max_test_samples": 1000,
        }
        where = f"MNIST ({args.train_samples} training samples)"
    else:
        data = {"dataset": "digits", "num_clients": args.clients}
        where = "digits"
    rows = [
        compare(
            "mlp 128", data, {"name": "mlp", "hidden": [128]}, user_mlp, args.repeats, args.device
        )
    ]
    if not args.skip_cnn and data["dataset"] == "mnist":
        rows.append(
            compare("cnn (582k)", data, {"name": "cnn"}, user_cnn, args.repeats, args.device)
        )
    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else platform.processor() or platform.machine()
    )
    print(
        f"# user factory vs built-in model, {where}, {args.clients} clients, batch 64, "
        f"median of {args.repeats} interleaved rounds; {device}; torch {torch.__version__}; "
        f"{datetime.date.today()}"
    )
    print(
        "| model | executor | built-in samples/s | user factory samples/s | ratio (wall) | "
        "ratio (CPU s) |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model']} | {row['executor']} | {row['builtin_samples_per_s']:,.0f} | "
            f"{row['user_samples_per_s']:,.0f} | {row['ratio']:.3f} | {row['cpu_ratio']:.3f} |"
        )


if __name__ == "__main__":
    main()
