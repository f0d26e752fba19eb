"""Benchmark the committed history's cost: write time per round and bytes, with and without it.

Writes R rounds x C clients x d float32 updates (plus each round's global model and aggregate;
random tensors) into two stores side by side, round by round so both see the same machine load:
one with the hash chain (``history.store.chain``: a SHA-256 per payload and one link per round
in the round's transaction) and one without (its chain table dropped before the first round, as
a store written before the chain). Reports the median ``write_round`` wall time of each, the
chain's bytes per round (link bodies and hashes), and the time of ``check_chain(full=True)``
(every payload hashed again) against ``check(full=True)`` without the chain part.

    nice -n 10 python benchmarks/bench_history_chain.py --rounds 20 --clients 10 --dim 50000
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry


def _entry(r: int, clients: int, dim: int, g: torch.Generator) -> RoundEntry:
    return RoundEntry(
        r,
        global_model=torch.randn(dim, generator=g),
        aggregate=torch.randn(dim, generator=g),
        clients=[ClientRecord(c, "accepted", 100) for c in range(clients)],
        updates={c: torch.randn(dim, generator=g) for c in range(clients)},
    )


def _unchained(path: Path) -> HistoryStore:
    HistoryStore.create(path, {"seed": 0}).close()
    con = sqlite3.connect(path / "history.sqlite", isolation_level=None)
    con.execute("DROP TABLE chain")
    con.execute("DELETE FROM info WHERE key='chain'")
    con.close()
    return HistoryStore.open(path, writable=True)


def main() -> None:
    """Run the benchmark and print a JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--dim", type=int, default=50_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        chained = HistoryStore.create(base / "chained", {"seed": 0})
        plain = _unchained(base / "plain")
        g = torch.Generator().manual_seed(0)
        times: dict[str, list[float]] = {"chained": [], "plain": []}
        with chained, plain:
            for store in (chained, plain):
                store.write_round(RoundEntry(0, global_model=torch.zeros(args.dim)))
            for r in range(1, args.rounds + 1):
                entry = _entry(r, args.clients, args.dim, g)
                order = [("chained", chained), ("plain", plain)]
                for name, store in order if r % 2 else order[::-1]:
                    start = time.perf_counter()
                    store.write_round(entry)
                    times[name].append(time.perf_counter() - start)
            con = sqlite3.connect(base / "chained" / "history.sqlite")
            chain_bytes = con.execute(
                "SELECT sum(length(body) + length(link) + 16) FROM chain WHERE kind='round'"
            ).fetchone()[0]
            con.close()
            start = time.perf_counter()
            check = chained.check_chain(full=True)
            chain_check = time.perf_counter() - start
            start = time.perf_counter()
            plain.check(full=True)
            plain_check = time.perf_counter() - start
            payload_bytes = chained.stored_bytes()
        round_bytes = (args.clients + 2) * args.dim * 4
        chained_ms = statistics.median(times["chained"]) * 1e3
        plain_ms = statistics.median(times["plain"]) * 1e3
        print(
            json.dumps(
                {
                    "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                    "machine": f"{platform.processor() or platform.machine()}, "
                    f"{platform.python_version()}, torch {torch.__version__}",
                    "rounds": args.rounds,
                    "clients": args.clients,
                    "dim": args.dim,
                    "payload_bytes_per_round": round_bytes,
                    "write_ms_median": {"chained": chained_ms, "plain": plain_ms},
                    "write_overhead_ms": chained_ms - plain_ms,
                    "write_overhead_fraction": (chained_ms - plain_ms) / plain_ms,
                    "chain_bytes_per_round": chain_bytes / args.rounds,
                    "chain_bytes_fraction": chain_bytes / payload_bytes,
                    "check_chain_s": chain_check,
                    "check_chain_ok": check.ok,
                    "check_without_chain_s": plain_check,
                },
                indent=2,
            )
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
