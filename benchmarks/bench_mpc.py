"""Benchmark the 2PC primitives of ``fedunlearn.mpc`` on model-sized vectors.

Runs each primitive once (after a warm-up) on vectors of 582,026 elements (the MNIST CNN of
the Starfish experiments) with both parties as threads of one process (in-process transport)
and as two processes over loopback TCP, with the simulated dealer (each party derives its
material from a shared seed), and SecMul/SecGE once more with the dealer as a third process
(``tcp+dealer``: ``start_dealer_process`` plus a ``RemoteDealer`` per party). Reports wall
seconds as seen by party 0 (dealer material included: it is obtained on demand), the offline
seconds of each party (time spent obtaining and expanding dealer material, ``wall_seconds`` of
its dealer client), online megabytes sent per party, offline bytes received by party 0 (16-byte
seeds only) and megabytes by party 1 (seeds plus correction shares), and rounds.

    nice -n 10 python benchmarks/bench_mpc.py [--size 582026] [--transports inproc,tcp,tcp+dealer]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np

from fedunlearn.mpc import (
    DealerOptions,
    InProcessTransport,
    LinkLimits,
    Party,
    RemoteDealer,
    Security,
    TcpListener,
    TcpTransport,
    sec_div,
    sec_ge,
    sec_inner,
    sec_mul,
    sec_select,
    sec_share,
    sec_square,
    start_dealer_process,
)

DEALER_SEED = 2026
MB = 1e6
REMOTE_DEALER_OPS = ("SecMul", "SecGE real (GMW)")  # rows of the three-process run


def operations(party: Party, size: int) -> dict:
    """Name -> zero-argument callable running one primitive on shared vectors."""
    rng = np.random.default_rng(0)
    x_plain, y_plain = rng.normal(size=size), rng.normal(size=size)
    x = sec_share(party, x_plain if party.party_id == 0 else None, owner=0)
    y = sec_share(party, y_plain if party.party_id == 1 else None, owner=1)
    v = sec_share(party, 1.0 + 0.5 * np.tanh(y_plain) if party.party_id == 1 else None, owner=1)
    bit = sec_ge(x, y)
    ideal = Party.__new__(Party)  # same party state, ideal comparisons
    ideal.__dict__.update(party.__dict__, comparison="ideal")
    x_ideal, y_ideal = ideal.tensor(x.share), ideal.tensor(y.share)
    ops = {
        "SecShare (owner sends)": lambda: sec_share(
            party, x_plain if party.party_id == 0 else None, owner=0
        ),
        "SecRec (reveal)": lambda: x.reveal(),
        "add (local)": lambda: x + y,
        "public mul (local)": lambda: x * 0.37,
        "SecMul": lambda: sec_mul(x, y),
        "square": lambda: sec_square(x),
        "SecSP (inner product)": lambda: sec_inner(x, y),
        "SecSel": lambda: sec_select(bit, x, y),
        "SecGE real (GMW)": lambda: sec_ge(x, y),
        "SecGE ideal": lambda: sec_ge(x_ideal, y_ideal),
        "SecDiv v in [0.5, 1.5]": lambda: sec_div(x, v, (0.5, 1.5)),
    }
    if not party.transport.supports_ideal:  # ideal is refused between processes
        del ops["SecGE ideal"]
    return ops


def run(party: Party, size: int, only: tuple[str, ...] | None = None) -> list[dict]:
    """Time every operation (or those in ``only``) once; both parties call this in step."""
    ops = operations(party, size)
    if only is not None:
        ops = {name: fn for name, fn in ops.items() if name in only}
    for fn in ops.values():  # warm-up (allocations, AES context)
        fn()
        break
    rows = []
    for name, fn in ops.items():
        party.transport.exchange(np.zeros(1, np.uint64))  # start together
        before = party.counters.snapshot()
        offline_before = party.dealer.wall_seconds
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        after = party.counters.snapshot()
        rows.append(
            {
                "op": name,
                "seconds": seconds,
                "offline_seconds": party.dealer.wall_seconds - offline_before,
                "online_sent": after["online"]["bytes_sent"] - before["online"]["bytes_sent"],
                "offline_received": (
                    after["offline"]["bytes_received"] - before["offline"]["bytes_received"]
                ),
                "rounds": after["online"]["rounds"] - before["online"]["rounds"],
            }
        )
    return rows


def inproc(size: int) -> tuple[list[dict], list[dict]]:
    import threading

    transports = InProcessTransport.pair(timeout_seconds=600)
    out: list = [None, None]

    def party_main(k: int) -> None:
        out[k] = run(Party(k, transports[k], DEALER_SEED, local_seed=1), size)

    threads = [threading.Thread(target=party_main, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out[0], out[1]


def tcp_child(port: int, size: int, queue, dealer_address=None) -> None:  # noqa: ANN001
    transport = TcpTransport.connect("127.0.0.1", port, party_id=1, timeout_seconds=600)
    if dealer_address is None:
        party = Party(1, transport, DEALER_SEED, local_seed=1)
        queue.put(run(party, size))
    else:
        dealer = RemoteDealer.connect(
            *dealer_address,
            security=Security.plain(),
            party_id=1,
            limits=LinkLimits(timeout_seconds=600),
        )
        party = Party(1, transport, dealer=dealer, local_seed=1)
        queue.put(run(party, size, REMOTE_DEALER_OPS))
    party.close()


def tcp(size: int, remote_dealer: bool = False) -> tuple[list[dict], list[dict]]:
    context = multiprocessing.get_context("spawn")
    dealer = (
        start_dealer_process(
            Security.plain(), seed=DEALER_SEED, options=DealerOptions(timeout_seconds=600)
        )
        if remote_dealer
        else None
    )
    listener = TcpListener("127.0.0.1", 0)
    queue = context.Queue()
    address = None if dealer is None else dealer.address
    child = context.Process(target=tcp_child, args=(listener.port, size, queue, address))
    child.start()
    try:
        transport = listener.accept(timeout_seconds=120)
        if dealer is None:
            party = Party(0, transport, DEALER_SEED, local_seed=1)
            rows0 = run(party, size)
        else:
            client = RemoteDealer.connect(
                *dealer.address,
                security=Security.plain(),
                party_id=0,
                limits=LinkLimits(timeout_seconds=600),
            )
            party = Party(0, transport, dealer=client, local_seed=1)
            rows0 = run(party, size, REMOTE_DEALER_OPS)
        rows1 = queue.get(timeout=600)
        child.join(60)
        party.close()
    finally:
        listener.close()
        if child.is_alive():
            child.kill()
        if dealer is not None:
            dealer.join(60)
            dealer.stop()
    return rows0, rows1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=582_026)
    parser.add_argument("--transports", default="inproc,tcp,tcp+dealer")
    args = parser.parse_args()
    header = (
        f"{'transport':<10} {'primitive':<24} {'seconds':>8} {'Melem/s':>8} "
        f"{'offline s P0/P1':>15} {'online MB/party':>15} {'offline B (P0)':>14} "
        f"{'offline MB (P1)':>15} {'rounds':>6}"
    )
    print(f"2PC primitives on {args.size:,}-element vectors (f = 13, Z_2^64)")
    print(header)
    print("-" * len(header))
    runners = {"inproc": inproc, "tcp": tcp, "tcp+dealer": lambda n: tcp(n, remote_dealer=True)}
    for name in args.transports.split(","):
        rows0, rows1 = runners[name](args.size)
        for r0, r1 in zip(rows0, rows1, strict=True):
            rate = args.size / r0["seconds"] / 1e6
            offline = f"{r0['offline_seconds']:.3f}/{r1['offline_seconds']:.3f}"
            print(
                f"{name:<10} {r0['op']:<24} {r0['seconds']:>8.3f} {rate:>8.1f} {offline:>15} "
                f"{r0['online_sent'] / MB:>15.2f} {r0['offline_received']:>14,} "
                f"{r1['offline_received'] / MB:>15.2f} {r0['rounds']:>6}"
            )


if __name__ == "__main__":
    main()
