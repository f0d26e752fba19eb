r"""Benchmark the papers' MNIST FL run end to end on a GPU (and the CPU): wall time, samples/s.

Workload (Crab / FedADP / Starfish papers; ``configs/mnist_paper.yaml``): 60,000 MNIST images
split IID over 20 clients, the 582,026-parameter CNN, 40 rounds x 5 local epochs, SGD lr 0.005,
batch 64, FedAvg, the global model evaluated on the 10,000 test images after every round:
60,000 x 5 x 40 = 12,000,000 sample-steps. Target (issue 17): the full run in <= 60 s on one
H200-class GPU.

What is timed, per device (``--device cuda,cpu`` runs them one after the other, same workload):

- ``setup``: loading MNIST, the partition, the federation and its executor (the clients' data
  copied to the device once) and the test set copied to the device;
- ``rounds``: ``fedunlearn.fl.run_rounds``: every round's local training of all clients (the
  ``auto`` executor: on a GPU the vectorised one, all 20 clients in one batched program per
  step), aggregation on the CPU and the evaluation; ``train`` excludes the evaluation;
- samples/s = sample-steps / train seconds (all rounds, and the median round after the first,
  which pays for CUDA/cuDNN start-up).

The history store is not written in this mode (recording every update of the paper run is ~1.9
GB of disk writes, the same on any device; ``benchmarks/bench_history_memory.py`` measures it).
``--train-run`` instead times ``fedunlearn.train_run`` on the paper config with history policy
``all``: the CLI's whole path, store included (it checks that the run really used the device).

``--repeat 2`` runs each device twice and reports whether the final models are bit-identical
(the determinism statement of ``fedunlearn/fl/device.py``). Smaller runs for a CPU box:
``--train-samples``, ``--rounds``, ``--epochs``; the output also projects the full run's time
from the measured samples/s (labelled as a projection).

    python benchmarks/bench_gpu_paper_run.py --device cuda                  # the full paper run
    python benchmarks/bench_gpu_paper_run.py --device cuda,cpu --rounds 2   # side by side
    python benchmarks/bench_gpu_paper_run.py --device cuda --repeat 2       # + determinism
    python benchmarks/bench_gpu_paper_run.py --device cpu --train-samples 6000 --rounds 2 \
        --epochs 1                                                          # a 2-core CPU box
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedunlearn.data import load_dataset, partition
from fedunlearn.fl import ClientData, Federation, LocalTrainingSpec, make_aggregator, run_rounds
from fedunlearn.fl.device import resolve_device
from fedunlearn.fl.metrics import accuracy_and_loss
from fedunlearn.fl.records import RoundRecord
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.models import build_model, get_flat_params

PAPER = {"clients": 20, "rounds": 40, "epochs": 5, "lr": 0.005, "batch_size": 64}
PAPER_SAMPLE_STEPS = 60_000 * 5 * 40
TARGET_SECONDS = 60.0
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Measurement:
    """One timed run on one device."""

    device: str
    executor: str
    clients: int
    rounds: int
    epochs: int
    train_samples: int
    sample_steps: int
    setup_s: float
    rounds_s: float
    train_s: float
    eval_s: float
    first_round_s: float
    round_train_s: list[float] = field(default_factory=list)
    final_accuracy: float = float("nan")
    final_params_sha: str = ""

    @property
    def wall_s(self) -> float:
        """End to end: setup and every round."""
        return self.setup_s + self.rounds_s

    @property
    def samples_per_s(self) -> float:
        """Sample-steps per second of local training, all rounds."""
        return self.sample_steps / self.train_s

    @property
    def steady_samples_per_s(self) -> float:
        """The same from the median round after the first (start-up excluded)."""
        later = self.round_train_s[1:] or self.round_train_s
        return self.sample_steps / self.rounds / statistics.median(later)


def default_data_dir() -> Path | None:
    """Return a directory holding mnist.npz: $FEDUNLEARN_DATA, else a ``shared/data`` nearby."""
    shared = [base / "shared" / "data" for base in (REPO, *REPO.parents[:2])]
    for candidate in (os.environ.get("FEDUNLEARN_DATA"), *shared):
        if candidate and (Path(candidate) / "mnist.npz").exists():
            return Path(candidate)
    return None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (so that timers stop when the work is done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RoundTimer:
    """Round observer: wall time of each round (minus its evaluation, measured separately)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.last = time.perf_counter()
        self.rounds: list[float] = []
        self.evals: list[float] = []

    def on_round_end(self, record: RoundRecord) -> None:
        """Record the round's wall time."""
        synchronize(self.device)
        now = time.perf_counter()
        self.rounds.append(now - self.last)
        self.last = now


def run_engine(args: argparse.Namespace, device_name: str) -> Measurement:
    """Time the paper's FL run on one device with fedunlearn's engine (no history store)."""
    started = time.perf_counter()
    device = resolve_device(device_name)
    dataset = load_dataset("mnist", data_dir=args.data_dir)
    x_train, y_train = dataset.x_train, dataset.y_train
    if args.train_samples < len(y_train):
        keep = np.sort(
            np.random.default_rng(derive_seed(args.seed, "partition", 1)).choice(
                len(y_train), size=args.train_samples, replace=False
            )
        )
        x_train, y_train = x_train[keep], y_train[keep]
    parts = partition(y_train, args.clients, "iid", seed=derive_seed(args.seed, "partition", 0))
    x_all, y_all = torch.from_numpy(np.ascontiguousarray(x_train)), torch.from_numpy(y_train)
    clients = {c: ClientData(x_all[idx], y_all[idx]) for c, idx in enumerate(parts)}
    model = build_model(
        "cnn", dataset.input_shape, dataset.num_classes, seed=derive_seed(args.seed, "model")
    )
    spec = LocalTrainingSpec(epochs=args.epochs, lr=PAPER["lr"], batch_size=PAPER["batch_size"])
    x_test = torch.from_numpy(np.ascontiguousarray(dataset.x_test)).to(device)  # once
    y_test = torch.from_numpy(dataset.y_test)
    federation = Federation(
        model, clients, spec, seed=args.seed, executor=args.executor, device=device
    )
    timer = RoundTimer(device)
    try:
        executor = federation.executor.name  # built here: the clients' data goes to the device
        synchronize(device)
        setup_s = time.perf_counter() - started

        def evaluate(params: torch.Tensor) -> dict[str, float]:
            began = time.perf_counter()
            acc, loss = accuracy_and_loss(model, params, x_test, y_test, device)
            timer.evals.append(time.perf_counter() - began)
            return {"test_accuracy": acc, "test_loss": loss}

        timer.last = began_rounds = time.perf_counter()
        final = run_rounds(
            federation,
            make_aggregator("fedavg"),
            get_flat_params(model),
            num_rounds=args.rounds,
            evaluate=evaluate,
            observers=[timer],
        )
        rounds_s = time.perf_counter() - began_rounds
        accuracy = accuracy_and_loss(model, final, x_test, y_test, device)[0]
    finally:
        federation.close()
    train_rounds = [r - e for r, e in zip(timer.rounds, timer.evals, strict=True)]
    return Measurement(
        device=str(device),
        executor=executor,
        clients=args.clients,
        rounds=args.rounds,
        epochs=args.epochs,
        train_samples=len(y_train),
        sample_steps=len(y_train) * args.epochs * args.rounds,
        setup_s=setup_s,
        rounds_s=rounds_s,
        train_s=sum(train_rounds),
        eval_s=sum(timer.evals),
        first_round_s=timer.rounds[0],
        round_train_s=train_rounds,
        final_accuracy=accuracy,
        final_params_sha=_sha(final),
    )


def run_train_run(args: argparse.Namespace, device_name: str) -> Measurement:
    """Time ``fedunlearn.train_run`` on the paper config (history policy all) on one device."""
    from fedunlearn import load_config, train_run
    from fedunlearn.history import HistoryStore

    overrides = {
        "training.device": device_name,
        "training.rounds": args.rounds,
        "training.local_epochs": args.epochs,
        "training.executor": args.executor,
        "data.num_clients": args.clients,
        "attack.kind": "none",
        "attack.num_malicious": 0,
        "seed": args.seed,
    }
    if args.data_dir is not None:
        overrides["data.data_dir"] = str(args.data_dir)
    if args.train_samples < 60_000:
        overrides["data.max_train_samples"] = args.train_samples
    config = load_config(REPO / "configs" / "mnist_paper.yaml", overrides)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-", dir=args.work_dir) as tmp:
        started = time.perf_counter()
        summary = train_run(config, Path(tmp) / "run")
        wall = time.perf_counter() - started
        with HistoryStore.open(Path(tmp) / "run" / "history") as store:
            final = store.read_model(args.rounds)
    used = summary.get("device")
    if used is None or resolve_device(device_name) != torch.device(used):
        raise SystemExit(
            f"train_run trained on {used or 'the CPU (no device in its summary)'}, not on "
            f"{device_name}: this fedunlearn does not pass training.device to its federation"
        )
    samples = args.train_samples
    steps = samples * args.epochs * args.rounds
    return Measurement(
        device=used,
        executor=summary["executor"],
        clients=args.clients,
        rounds=args.rounds,
        epochs=args.epochs,
        train_samples=samples,
        sample_steps=steps,
        setup_s=0.0,
        rounds_s=wall,
        train_s=wall,
        eval_s=float("nan"),
        first_round_s=float("nan"),
        round_train_s=[wall / args.rounds],
        final_accuracy=summary["final_metrics"]["test_accuracy"],
        final_params_sha=_sha(final),
    )


def _sha(params: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(params.detach().cpu().numpy().tobytes()).hexdigest()[:16]


def machine() -> str:
    """Describe the machine: CPU, cores, GPU(s), torch/CUDA/cuDNN versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} CPUs; torch {torch.__version__}"
    if torch.cuda.is_available():
        gpus = ", ".join(
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        )
        text += f"; GPU {gpus}; CUDA {torch.version.cuda}; cuDNN {torch.backends.cudnn.version()}"
    else:
        text += "; no CUDA GPU"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="comma-separated: cuda,cpu,cuda:1,mps")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="directory holding mnist.npz (default: $FEDUNLEARN_DATA or shared)")
    parser.add_argument("--train-samples", type=int, default=60_000)
    parser.add_argument("--clients", type=int, default=PAPER["clients"])
    parser.add_argument("--rounds", type=int, default=PAPER["rounds"])
    parser.add_argument("--epochs", type=int, default=PAPER["epochs"])
    parser.add_argument("--executor", default="auto", help="auto, serial, vectorized or pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per device (2: determinism)")
    parser.add_argument("--train-run", action="store_true",
                        help="time fedunlearn.train_run with history policy all instead")
    parser.add_argument("--work-dir", type=Path, default=None, help="for --train-run's store")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# bench_gpu_paper_run  {stamp}")
    print(f"# machine: {machine()}")
    print(f"# command: python {' '.join(sys.argv)}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"# load average before: {load[0]:.1f}")
    runner = run_train_run if args.train_run else run_engine
    results: list[Measurement] = []
    for name in [d.strip() for d in args.device.split(",") if d.strip()]:
        for repeat in range(args.repeat):
            m = runner(args, name)
            results.append(m)
            print(
                f"{m.device:>8} {m.executor:>10} run {repeat + 1}: wall {m.wall_s:8.1f} s "
                f"(setup {m.setup_s:.1f}, train {m.train_s:.1f}, eval {m.eval_s:.1f}), "
                f"{m.samples_per_s:,.0f} samples/s (steady {m.steady_samples_per_s:,.0f}), "
                f"accuracy {m.final_accuracy:.4f}, model {m.final_params_sha}",
                flush=True,
            )

    print()
    print("| device | executor | sample-steps | wall s | train s | samples/s | steady samples/s"
          " | projected full run (12M) s | accuracy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for m in results:
        projected = PAPER_SAMPLE_STEPS / m.steady_samples_per_s
        print(f"| {m.device} | {m.executor} | {m.sample_steps:,} | {m.wall_s:.1f} | "
              f"{m.train_s:.1f} | {m.samples_per_s:,.0f} | {m.steady_samples_per_s:,.0f} | "
              f"{projected:,.0f} | {m.final_accuracy:.4f} |")
    by_device: dict[str, list[Measurement]] = {}
    for m in results:
        by_device.setdefault(m.device, []).append(m)
    devices = list(by_device)
    if len(devices) > 1:
        base = statistics.median(m.samples_per_s for m in by_device[devices[-1]])
        for name in devices[:-1]:
            rate = statistics.median(m.samples_per_s for m in by_device[name])
            print(f"{name} vs {devices[-1]}: {rate / base:.1f}x samples/s")
    for name, runs in by_device.items():
        if len(runs) > 1:
            same = len({m.final_params_sha for m in runs}) == 1
            verdict = "yes" if same else "NO"
            print(f"{name}: {len(runs)} runs, final models bit-identical: {verdict}")
        full = [m for m in runs if m.sample_steps >= PAPER_SAMPLE_STEPS]
        if full:
            best = min(m.wall_s for m in full)
            verdict = "MET" if best <= TARGET_SECONDS else "NOT MET"
            print(f"{name}: full paper run {best:.1f} s end to end; target <= 60 s {verdict}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(m) for m in results], indent=2) + "\n")


if __name__ == "__main__":
    main()
