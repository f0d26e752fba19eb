"""Benchmark ``HistoryStore.forget`` at paper scale: incremental vacuum against a full VACUUM.

Writes R rounds x C clients x d float32 updates (plus each round's global model and aggregate;
random tensors) with ``HistoryStore.write_round``, closes the store, then forgets one client at a
time, alternating ``forget(vacuum="incremental")`` (the default) and ``forget(vacuum="full")``
(the old path: ``VACUUM`` rebuilds the whole file) so both see the same machine load. For each
call it reports the wall time (the SHA-256 and page fingerprints of the deleted payloads
included), the payload bytes deleted, the bytes the files shrank by, and the peak extra disk the
call used, measured two ways by a thread sampling every 5 ms: the growth of the database file
plus its WAL, and the drop in free space of the file system holding them (this also sees
SQLite's temporary files, which are unlinked as soon as they are opened; other processes
writing to the same disk add noise to it, never remove any). Then it times
``check_deletions()`` (reads refused, page scan) and ``verify()``.

Defaults are the 2 GB case of the paper-scale MNIST CNN run (40 x 20 x 582,026) under
``--dir /work/bench-forget``. Needs about 3x the store size free (the full VACUUM copies it);
the store is deleted at the end.

    flock /tmp/fedunlearn-heavy.lock nice -n 5 python benchmarks/bench_history_forget.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import threading
import time
from pathlib import Path

MB = 1e6


class DiskSampler:
    """Thread sampling the store's file sizes and the file system's free space."""

    def __init__(self, file: Path, interval: float = 0.005) -> None:
        self.file, self.interval = file, interval
        self.wal = file.with_name(file.name + "-wal")
        self.files_peak = self.free_drop_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _files(self) -> int:
        total = 0
        for f in (self.file, self.wal):
            try:
                total += f.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def _free(self) -> int:
        st = os.statvfs(self.file.parent)
        return st.f_bavail * st.f_frsize

    def _run(self) -> None:
        while not self._stop.is_set():
            self.files_peak = max(self.files_peak, self._files() - self.files_before)
            self.free_drop_peak = max(self.free_drop_peak, self.free_before - self._free())
            time.sleep(self.interval)

    def __enter__(self) -> DiskSampler:
        self.files_before, self.free_before = self._files(), self._free()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_store(path: Path, rounds: int, clients: int, dim: int) -> dict[str, float]:
    import torch

    from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry

    gen = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    with HistoryStore.create(path, {"rounds": rounds, "clients": clients, "dim": dim}) as store:
        store.write_round(RoundEntry(0, global_model=torch.randn(dim, generator=gen)))
        for r in range(1, rounds + 1):
            ids = range(clients)
            store.write_round(
                RoundEntry(
                    r,
                    global_model=torch.randn(dim, generator=gen),
                    aggregate=torch.randn(dim, generator=gen),
                    updates={c: torch.randn(dim, generator=gen) for c in ids},
                    clients=[ClientRecord(c, "accepted", num_samples=100) for c in ids],
                    scalars={"round": r},
                )
            )
        payload_bytes = store.stored_bytes()
    seconds = time.perf_counter() - started
    file_bytes = (path / "history.sqlite").stat().st_size
    return {
        "payload_mb": payload_bytes / MB,
        "file_mb": file_bytes / MB,
        "write_seconds": seconds,
        "write_mb_per_s": payload_bytes / MB / seconds,
    }


def forget_one(path: Path, client: int, vacuum: str) -> dict[str, float]:
    from fedunlearn.history import HistoryStore

    with HistoryStore.open(path, writable=True) as store:
        with DiskSampler(store.file) as disk:
            started = time.perf_counter()
            record = store.forget([client], vacuum=vacuum)  # type: ignore[arg-type]
            seconds = time.perf_counter() - started
        file_after = store.file_bytes()
    return {
        "client": client,
        "vacuum": record.vacuum,
        "seconds": seconds,
        "deleted_mb": record.size_bytes / MB,
        "reclaimed_mb": (record.bytes_reclaimed or 0) / MB,
        "peak_extra_files_mb": disk.files_peak / MB,
        "peak_extra_disk_mb": disk.free_drop_peak / MB,
        "file_mb_after": file_after / MB,
    }


def checks(path: Path) -> dict[str, float]:
    from fedunlearn.history import HistoryStore

    with HistoryStore.open(path) as store:
        started = time.perf_counter()
        result = store.check_deletions()
        check_seconds = time.perf_counter() - started
        started = time.perf_counter()
        store.verify()
        verify_seconds = time.perf_counter() - started
        file_bytes = store.file_bytes()
    return {
        "check_deletions_ok": result.ok,
        "check_deletions_seconds": check_seconds,
        "payloads_checked": result.payloads_checked,
        "fingerprints_checked": result.fingerprints_checked,
        "fingerprints_found": result.fingerprints_found,
        "control_found": f"{result.control_found}/{result.control_checked}",
        "pages_scanned": result.pages_scanned,
        "verify_seconds": verify_seconds,
        "verify_mb_per_s": file_bytes / MB / verify_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/work/bench-forget"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--dim", type=int, default=582_026)
    parser.add_argument("--repeats", type=int, default=3, help="forgets per mode")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.repeats * 2 > args.clients:
        parser.error("--repeats must be at most clients / 2 (one client per forget)")

    import torch

    torch.set_num_threads(1)
    path = args.dir / "store"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    out: dict[str, object] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_start": os.getloadavg()[0],
        "history": f"{args.rounds} rounds x {args.clients} clients x {args.dim:,} float32",
    }
    try:
        out["write"] = write_store(path, args.rounds, args.clients, args.dim)
        print(json.dumps(out, indent=2), flush=True)
        runs = []
        for i in range(args.repeats):  # interleaved: inc, full, inc, full, ...
            for j, vacuum in enumerate(("incremental", "full")):
                runs.append(forget_one(path, 2 * i + j, vacuum))
                print(json.dumps(runs[-1]), flush=True)
        out["forget"] = runs
        out["checks"] = checks(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    summary = {}
    for vacuum in ("incremental", "full"):
        mine = [r for r in runs if r["vacuum"] == vacuum]
        summary[vacuum] = {
            key: statistics.median(float(r[key]) for r in mine)
            for key in (
                "seconds",
                "deleted_mb",
                "reclaimed_mb",
                "peak_extra_files_mb",
                "peak_extra_disk_mb",
            )
        }
    summary["full_over_incremental_seconds"] = (
        summary["full"]["seconds"] / summary["incremental"]["seconds"]
    )
    out["median"] = summary
    out["load_average_at_end"] = os.getloadavg()[0]
    print(json.dumps({k: out[k] for k in ("median", "checks", "load_average_at_end")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
