"""Benchmark the history store at full size: write throughput, streaming-read memory, forget().

Writes R rounds x C clients x d float32 updates (plus each round's global model and aggregate)
with ``HistoryStore.write_round``, then replays the history in a fresh process, round by round
through ``iter_updates``, keeping a running sum. Reports the reader's peak RSS (its own
``ru_maxrss``, cross-checked with ``VmHWM``), read and write throughput, file size, ``verify()``
throughput and the time ``forget()`` of one client takes (incremental vacuum; the comparison with
a whole-file VACUUM is ``bench_history_forget.py``). Defaults
are the 2 GB case: 40 x 20 x 582,026 float32 (2.33 MB per update, 1.86 GB of updates).

Each phase runs in its own process and this parent never imports torch: on Linux a child's
``ru_maxrss`` starts from its parent's RSS at fork, so a fat parent would inflate the reader's
number. Reads follow the write, so they come from a warm page cache: the numbers measure the
store, not the disk. Torch runs on one thread (``--threads``) so that a loaded machine does not
turn the running sum into the bottleneck.

    python benchmarks/bench_history_memory.py --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1e6


def scale(round: int, client: int) -> float:
    """Update of ``client`` in ``round`` is ``base * scale``, so the expected sum is known."""
    return 1.0 + 0.01 * client - 0.001 * round


def vm_hwm_kb() -> int:
    """Return this process's peak resident set size from /proc (kB), or -1 if unavailable."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return -1
    return next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")), -1
    )


def phase_write(path: Path, rounds: int, clients: int, dim: int) -> dict[str, float]:
    import torch

    from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry

    base = torch.randn(dim, generator=torch.Generator().manual_seed(0))
    seconds = 0.0
    with HistoryStore.create(path, {"rounds": rounds, "clients": clients, "dim": dim}) as store:
        store.write_round(RoundEntry(0, global_model=base.clone()))
        for r in range(1, rounds + 1):
            entry = RoundEntry(
                round=r,
                global_model=base * r,
                aggregate=base / r,
                updates={c: base * scale(r, c) for c in range(clients)},
                clients=[ClientRecord(c, "accepted", num_samples=100) for c in range(clients)],
                scalars={"accuracy": 0.5},
            )
            start = time.perf_counter()
            store.write_round(entry)
            seconds += time.perf_counter() - start
        by_kind = store.stored_bytes_by_kind()
    with HistoryStore.open(path) as store:  # after close: WAL checkpointed and removed
        file_bytes = store.file_bytes()
    return {
        "write_seconds": seconds,
        "stored_bytes": sum(by_kind.values()),
        "update_bytes": by_kind["update"],
        "file_bytes": file_bytes,
    }


def phase_read(path: Path) -> dict[str, float]:
    import torch

    from fedunlearn.history import HistoryStore

    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # torch imported
    nbytes = 0
    start = time.perf_counter()
    with HistoryStore.open(path) as store:
        meta = store.meta
        total = torch.zeros(meta["dim"])
        for r in store.rounds():
            for _, update in store.iter_updates(r):
                total += update
                nbytes += update.numel() * update.element_size()
    seconds = time.perf_counter() - start
    base = torch.randn(meta["dim"], generator=torch.Generator().manual_seed(0))
    weight = sum(scale(r, c) for r in range(1, meta["rounds"] + 1) for c in range(meta["clients"]))
    return {
        "baseline_rss_kb": baseline_kb,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "vm_hwm_kb": vm_hwm_kb(),
        "read_seconds": seconds,
        "read_bytes": nbytes,
        "sum_ok": bool(torch.allclose(total, base * weight, rtol=1e-4, atol=1e-3)),
    }


def phase_maintain(path: Path, forget: bool) -> dict[str, float]:
    from fedunlearn.history import HistoryStore

    with HistoryStore.open(path) as store:
        start = time.perf_counter()
        store.verify()
        out = {"verify_seconds": time.perf_counter() - start, "verify_bytes": store.stored_bytes()}
    if forget:
        with HistoryStore.open(path, writable=True) as store:
            start = time.perf_counter()
            out["forget_bytes"] = store.forget([0]).size_bytes
            out["forget_seconds"] = time.perf_counter() - start
            out["file_after_forget"] = store.file_bytes()
    return out


def run_phase(*args: str, threads: int) -> dict[str, float]:
    """Run this script in a fresh process for one phase and return its JSON result."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env
    )
    if done.returncode:
        raise SystemExit(f"phase {args[:2]} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--dim", type=int, default=582_026)
    parser.add_argument("--dir", type=Path, default=None, help="parent directory (default: temp)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each phase")
    parser.add_argument("--keep", action="store_true", help="keep the history afterwards")
    parser.add_argument("--no-forget", action="store_true", help="skip the forget() timing")
    parser.add_argument("--phase", choices=["write", "read", "maintain"], help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase is not None:
        import torch

        torch.set_num_threads(args.threads)
        if args.phase == "write":
            result = phase_write(args.path, args.rounds, args.clients, args.dim)
        elif args.phase == "read":
            result = phase_read(args.path)
        else:
            result = phase_maintain(args.path, forget=not args.no_forget)
        print(json.dumps(result))
        return

    parent = Path(tempfile.mkdtemp(prefix="bench-history-", dir=args.dir))
    path = parent / "run"
    shape = ("--rounds", str(args.rounds), "--clients", str(args.clients), "--dim", str(args.dim))
    extra = ("--no-forget",) if args.no_forget else ()
    try:
        wrote = run_phase("--phase", "write", "--path", str(path), *shape, threads=args.threads)
        read = run_phase("--phase", "read", "--path", str(path), threads=args.threads)
        kept = run_phase("--phase", "maintain", "--path", str(path), *extra, threads=args.threads)
    finally:
        if not args.keep:
            shutil.rmtree(parent, ignore_errors=True)

    rows = [
        ("history", f"{args.rounds} rounds x {args.clients} clients x {args.dim:,} float32"),
        ("machine", f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"),
        ("update payload bytes", f"{wrote['update_bytes'] / MB:,.1f} MB"),
        ("all payload bytes (+ global, aggregate)", f"{wrote['stored_bytes'] / MB:,.1f} MB"),
        ("file size", f"{wrote['file_bytes'] / MB:,.1f} MB"),
        ("write throughput", f"{wrote['stored_bytes'] / MB / wrote['write_seconds']:,.0f} MB/s"),
        (
            "read throughput (iter_updates + sum)",
            f"{read['read_bytes'] / MB / read['read_seconds']:,.0f} MB/s",
        ),
        ("reader peak RSS (ru_maxrss)", f"{read['peak_rss_kb'] / 1024:,.0f} MiB"),
        ("reader peak RSS (VmHWM)", f"{read['vm_hwm_kb'] / 1024:,.0f} MiB"),
        ("reader RSS after importing torch", f"{read['baseline_rss_kb'] / 1024:,.0f} MiB"),
        ("running sum correct", str(read["sum_ok"])),
        ("verify() throughput", f"{kept['verify_bytes'] / MB / kept['verify_seconds']:,.0f} MB/s"),
    ]
    if "forget_seconds" in kept:
        rows.append(
            (
                "forget(1 client), incremental vacuum",
                f"{kept['forget_seconds']:,.1f} s, {kept['forget_bytes'] / MB:,.1f} MB reclaimed",
            )
        )
        rows.append(("file size after forget", f"{kept['file_after_forget'] / MB:,.1f} MB"))
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
