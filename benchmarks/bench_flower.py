"""Benchmark: fedunlearn's in-process engine against Flower's Simulation Engine, one run.

Target (issue 8): the same 20-client workload on digits and on MNIST (MLP), rounds per second of
the in-process engine (``train_run``) and of Flower's simulation (``simulate``: Ray backend, 2
CPUs, one ClientApp per CPU), both recording the full history (policy ``all``) and evaluating
every round on the server; the in-process engine must be >= 5x faster on the small workload,
and both must produce the same models (float tolerance: the in-process ``auto`` executor is the
vectorised one, Flower's clients run the serial ``local_update``).

Reported per workload: end-to-end rounds/s (``rounds / wall``, Ray start and actor start-up
included for Flower), steady-state rounds/s (rounds 2..T from the store's commit times), the
ratio, the largest model difference over all rounds, and where a steady Flower round goes:
client work (the serial ``local_update`` of every client, timed here, divided over the Ray
workers), encoding and decoding on the server, serialising a train message (what Ray pickles
for each ClientApp call), and the rest of the exchange (Ray scheduling, the in-memory link's
polling at 0.1 s, process hops).

Threads: the in-process engine runs with ``--threads`` torch threads (default 1, as the test
suite does on this shared 2-core machine: with other jobs running, 2-thread kernels on these
small models are several times slower than 1-thread ones); each Flower ClientApp actor gets one
CPU and Ray limits it to one thread. The serial client work is timed with the same setting.

    python benchmarks/bench_flower.py --mnist /work/shared/data/mnist.npz
    python benchmarks/bench_flower.py --quick          # digits only, 5 rounds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn import parse_config, train_run
from fedunlearn.config import RunConfig, dump_config
from fedunlearn.fl.client import local_update
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.history import HistoryStore
from fedunlearn.integrations.flower.messages import train_content
from fedunlearn.integrations.flower.server_app import FlowerJob
from fedunlearn.integrations.flower.simulation import simulate
from fedunlearn.runs import build_setup

NUM_CLIENTS = 20
NUM_CPUS = 2


def workload(name: str, rounds: int, mnist: Path | None) -> RunConfig:
    """Return the 20-client run config of a workload (digits MLP-64 or MNIST MLP-128)."""
    if name == "digits":
        data = {"dataset": "digits", "num_clients": NUM_CLIENTS}
        model, training = {"name": "mlp", "hidden": [64]}, {"lr": 0.1, "batch_size": 32}
    else:
        data = {"dataset": "mnist", "num_clients": NUM_CLIENTS, "data_dir": str(mnist.parent)}
        model, training = {"name": "mlp", "hidden": [128]}, {"lr": 0.05, "batch_size": 64}
    return parse_config(
        {
            "seed": 0,
            "data": data,
            "model": model,
            "training": {"rounds": rounds, "local_epochs": 1, **training},
            "history": {"policy": "all"},
        }
    )


def commit_times(run_dir: Path) -> list[float]:
    """Return the commit time (Unix s) of rounds 0..T from the history store's catalog."""
    con = sqlite3.connect(f"file:{run_dir / 'history' / 'history.sqlite'}?mode=ro", uri=True)
    try:
        return [t for (t,) in con.execute("SELECT committed_at FROM rounds ORDER BY round")]
    finally:
        con.close()


def steady_rounds_per_s(times: list[float]) -> float:
    """Rounds per second over rounds 2..T (round 1 carries start-up)."""
    return (len(times) - 2) / (times[-1] - times[1])


def max_model_difference(a: Path, b: Path, rounds: int) -> float:
    """Largest |difference| between the two runs' global models over rounds 0..T."""
    with HistoryStore.open(a / "history") as x, HistoryStore.open(b / "history") as y:
        return max(
            float((x.read_model(r) - y.read_model(r)).abs().max()) for r in range(rounds + 1)
        )


def client_work_seconds(config: RunConfig) -> tuple[float, float]:
    """Return (serial local_update of all clients for round 1, one message's pickle seconds)."""
    setup = build_setup(config)
    try:
        fed, params = setup.federation, setup.initial_params
        started = time.perf_counter()
        for cid in fed.client_ids:
            seed = derive_seed(fed.seed, "client", 1, cid, 0)
            local_update(setup.model, params, fed.client_data[cid], fed.spec, seed, cid)
        serial = time.perf_counter() - started
        content = train_content(
            params, [(0, 1)], round_=1, spec=fed.spec, run_config=dump_config(config)
        )
        started = time.perf_counter()
        for _ in range(20):
            pickle.loads(pickle.dumps(content))
        return serial, (time.perf_counter() - started) / 20
    finally:
        setup.close()


def bench(name: str, rounds: int, mnist: Path | None, root: Path) -> dict:
    """Run one workload in-process and on Flower's simulation; return the measurements."""
    config = workload(name, rounds, mnist)
    work = root / name
    work.mkdir(parents=True)
    config_path = work / "config.yaml"
    config_path.write_text(dump_config(config))

    started = time.perf_counter()
    summary_in = train_run(config, work / "inproc")
    wall_in = time.perf_counter() - started

    started = time.perf_counter()
    simulate(
        FlowerJob(mode="train", run_dir=work / "flower", config_path=config_path),
        NUM_CLIENTS,
        num_cpus=NUM_CPUS,
    )
    wall_fl = time.perf_counter() - started
    summary_fl = json.loads((work / "flower" / "summary.json").read_text())

    times_in, times_fl = commit_times(work / "inproc"), commit_times(work / "flower")
    serial_s, pickle_s = client_work_seconds(config)
    wire = summary_fl["wire"]
    steady_fl = (times_fl[-1] - times_fl[1]) / (rounds - 1)
    exchange_steady = statistics.mean(wire["exchange_seconds_by_round"][1:])
    return {
        "workload": name,
        "rounds": rounds,
        "num_params": summary_in["num_params"],
        "executor_in_process": summary_in["executor"],
        "wall_in_process_s": wall_in,
        "wall_flower_s": wall_fl,
        "rounds_per_s_in_process": rounds / wall_in,
        "rounds_per_s_flower": rounds / wall_fl,
        "steady_rounds_per_s_in_process": steady_rounds_per_s(times_in),
        "steady_rounds_per_s_flower": steady_rounds_per_s(times_fl),
        "max_model_difference": max_model_difference(work / "inproc", work / "flower", rounds),
        "flower_startup_s": wall_fl - summary_fl["wall_seconds"] + (times_fl[1] - times_fl[0]),
        "flower_steady_round_s": steady_fl,
        "client_work_serial_round_s": serial_s,
        "client_work_per_worker_round_s": serial_s / NUM_CPUS,
        "server_encode_round_s": wire["encode_seconds"] / rounds,
        "server_decode_round_s": wire["decode_seconds"] / rounds,
        "exchange_round_s": exchange_steady,
        "other_round_s": steady_fl
        - exchange_steady
        - (wire["encode_seconds"] + wire["decode_seconds"]) / rounds,
        "pickle_per_message_s": pickle_s,
        "bytes_per_round": (wire["bytes_sent"] + wire["bytes_received"]) / rounds,
    }


def table(rows: list[dict]) -> str:
    """Return the results as a markdown table."""
    lines = [
        "| measure | " + " | ".join(r["workload"] for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]

    def line(label: str, fmt: str, key: str) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt.format(r[key]) for r in rows) + " |")

    line("rounds", "{}", "rounds")
    line("parameters", "{:,}", "num_params")
    line("in-process executor", "{}", "executor_in_process")
    line("in-process rounds/s (end to end)", "{:.2f}", "rounds_per_s_in_process")
    line("Flower simulation rounds/s (end to end)", "{:.3f}", "rounds_per_s_flower")
    line("**ratio, end to end**", "**{:.1f}x**", "ratio_end_to_end")
    line("in-process rounds/s (steady, rounds 2..T)", "{:.2f}", "steady_rounds_per_s_in_process")
    line("Flower rounds/s (steady, rounds 2..T)", "{:.3f}", "steady_rounds_per_s_flower")
    line("**ratio, steady**", "**{:.1f}x**", "ratio_steady")
    line("max model difference (all rounds)", "{:.1e}", "max_model_difference")
    line("Flower start-up: Ray, actors, data (s)", "{:.1f}", "flower_startup_s")
    line("Flower steady round (s)", "{:.3f}", "flower_steady_round_s")
    line("  exchange: send_and_receive (s/round, steady)", "{:.3f}", "exchange_round_s")
    line("    client work: serial / 2 workers (s)", "{:.3f}", "client_work_per_worker_round_s")
    line("    pickling 20 train messages (s)", "{:.4f}", "pickle_round_s")
    line("  server encode (s/round)", "{:.4f}", "server_encode_round_s")
    line("  server decode (s/round)", "{:.4f}", "server_decode_round_s")
    line("  aggregation, evaluation, store commit (s/round)", "{:.3f}", "other_round_s")
    line("bytes on the wire per round", "{:,.0f}", "bytes_per_round")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run the workloads, print the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, default=None, help="path of mnist.npz")
    parser.add_argument("--digits-rounds", type=int, default=10)
    parser.add_argument("--mnist-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="digits only, 5 rounds")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in-process")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench_flower_"))
    load_before = os.getloadavg()[0]
    try:
        rows = [bench("digits", 5 if args.quick else args.digits_rounds, None, root)]
        if args.mnist is not None and not args.quick:
            rows.append(bench("mnist", args.mnist_rounds, args.mnist, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        r["ratio_end_to_end"] = r["rounds_per_s_in_process"] / r["rounds_per_s_flower"]
        r["ratio_steady"] = r["steady_rounds_per_s_in_process"] / r["steady_rounds_per_s_flower"]
        r["pickle_round_s"] = NUM_CLIENTS * r["pickle_per_message_s"]
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"\n{now}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after; in-process {args.threads} torch thread(s); Flower "
        f"{NUM_CPUS} CPUs, 1 CPU per ClientApp\n"
    )
    print(table(rows))
    ok = rows[0]["ratio_end_to_end"] >= 5 and all(r["max_model_difference"] < 1e-4 for r in rows)
    print(f"\ntarget (in-process >= 5x on digits, same models): {'met' if ok else 'NOT met'}")
    print(f"median steady ratio: {statistics.median(r['ratio_steady'] for r in rows):.1f}x")


if __name__ == "__main__":
    main()
