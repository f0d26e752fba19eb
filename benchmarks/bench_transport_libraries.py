"""Move one P2-sized 2PC message both ways: fedunlearn's transport, asyncio streams, gRPC.

What runs: two processes on loopback exchange a uint64 array of ``--mib`` MiB (default 29 MiB:
TC's average message in one P2 round, 0.527 GB in 18 rounds) ``--rounds`` times, each side
sending its array and receiving the other's, as ``Transport.exchange`` does in every 2PC round.
Plain TCP in all three (no TLS: the OpenSSL cost would be the same in each), so the figures
compare only what each library adds around the bytes:

- ``fedunlearn``: ``TcpTransport.exchange`` (the framing of ``mpc/tcp.py``: header, then the
  array's buffer sent from and received into numpy memory);
- ``asyncio``: ``asyncio`` streams, a length prefix, ``write`` + ``readexactly`` (one ``bytes``
  per message), ``np.frombuffer``;
- ``grpc``: one unary call per round carrying the array as ``bytes`` (no protobuf schema; the
  server answers with its own array), receive limits raised to the message size.

Per library: median seconds per exchange, MiB/s per direction, and CPU seconds per process.
It answers "what would a library cost on the hot path" in docs/mpc.md ("Why the networking is
hand-written"); it is not a replacement transport.

    nice -n 5 python benchmarks/bench_transport_libraries.py [--mib 29] [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from typing import Any

import numpy as np

HOST = "127.0.0.1"


def _payload(mib: float, seed: int) -> np.ndarray:
    words = int(mib * (1 << 20)) // 8
    return np.random.default_rng(seed).integers(0, 2**63, size=words, dtype=np.uint64)


# ---- fedunlearn ---------------------------------------------------------------------------------


def fedunlearn_peer(port: int, mib: float, rounds: int, out: Any) -> None:
    from fedunlearn.mpc import TcpTransport

    transport = TcpTransport.connect(HOST, port, timeout_seconds=60)
    mine = _payload(mib, 1)
    cpu = time.process_time()
    for _ in range(rounds):
        transport.exchange(mine)
    out.put(time.process_time() - cpu)
    transport.close()


def fedunlearn_main(mib: float, rounds: int) -> dict[str, Any]:
    from fedunlearn.mpc import TcpListener

    context = multiprocessing.get_context("spawn")
    listener = TcpListener(HOST, 0)
    out = context.Queue()
    peer = context.Process(target=fedunlearn_peer, args=(listener.port, mib, rounds, out))
    peer.start()
    transport = listener.accept(timeout_seconds=60)
    mine = _payload(mib, 0)
    times, cpu = [], time.process_time()
    for _ in range(rounds):
        start = time.perf_counter()
        theirs = transport.exchange(mine)
        times.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu
    assert theirs.nbytes == mine.nbytes
    peer_cpu = out.get(timeout=120)
    peer.join(30)
    transport.close()
    listener.close()
    return {"times": times, "cpu": (cpu, peer_cpu)}


# ---- asyncio streams ----------------------------------------------------------------------------


async def _exchange(reader: Any, writer: Any, mine: np.ndarray) -> np.ndarray:
    writer.write(mine.nbytes.to_bytes(8, "big"))
    writer.write(memoryview(mine).cast("B"))
    size = int.from_bytes(await reader.readexactly(8), "big")
    data = await reader.readexactly(size)
    await writer.drain()
    return np.frombuffer(data, dtype=np.uint64)


def asyncio_peer(port: int, mib: float, rounds: int, out: Any) -> None:
    async def main() -> float:
        reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 20)
        mine = _payload(mib, 1)
        cpu = time.process_time()
        for _ in range(rounds):
            await _exchange(reader, writer, mine)
        used = time.process_time() - cpu
        writer.close()
        return used

    out.put(asyncio.run(main()))


def asyncio_main(mib: float, rounds: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    result: dict[str, Any] = {}

    async def main() -> None:
        done = asyncio.Event()
        mine = _payload(mib, 0)

        async def serve(reader: Any, writer: Any) -> None:
            times, cpu = [], time.process_time()
            for _ in range(rounds):
                start = time.perf_counter()
                theirs = await _exchange(reader, writer, mine)
                times.append(time.perf_counter() - start)
            result["cpu"] = time.process_time() - cpu
            assert theirs.nbytes == mine.nbytes
            result["times"] = times
            writer.close()
            done.set()

        server = await asyncio.start_server(serve, HOST, 0, limit=1 << 20)
        port = server.sockets[0].getsockname()[1]
        peer = context.Process(target=asyncio_peer, args=(port, mib, rounds, out))
        peer.start()
        await done.wait()
        server.close()
        result["peer"] = peer

    asyncio.run(main())
    peer_cpu = out.get(timeout=120)
    result.pop("peer").join(30)
    return {"times": result["times"], "cpu": (result["cpu"], peer_cpu)}


# ---- gRPC ---------------------------------------------------------------------------------------

_METHOD = "/bench.Exchange/Exchange"


def _grpc_options(mib: float) -> list[tuple[str, int]]:
    limit = int(mib * (1 << 20)) + (1 << 20)
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]


def grpc_peer(mib: float, rounds: int, port_queue: Any, out: Any) -> None:
    from concurrent import futures

    import grpc

    mine = _payload(mib, 1).tobytes()
    state = {"calls": 0, "cpu": 0.0}

    def exchange(request: bytes, context: Any) -> bytes:
        np.frombuffer(request, dtype=np.uint64)  # what a party would read
        state["calls"] += 1
        return mine

    handler = grpc.method_handlers_generic_handler(
        "bench.Exchange", {"Exchange": grpc.unary_unary_rpc_method_handler(exchange)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), options=_grpc_options(mib))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{HOST}:0")
    cpu = time.process_time()
    server.start()
    port_queue.put(port)
    while state["calls"] < rounds:
        time.sleep(0.01)
    out.put(time.process_time() - cpu)
    server.stop(1)


def grpc_main(mib: float, rounds: int) -> dict[str, Any]:
    import grpc

    context = multiprocessing.get_context("spawn")
    port_queue, out = context.Queue(), context.Queue()
    peer = context.Process(target=grpc_peer, args=(mib, rounds, port_queue, out))
    peer.start()
    port = port_queue.get(timeout=60)
    channel = grpc.insecure_channel(f"{HOST}:{port}", options=_grpc_options(mib))
    call = channel.unary_unary(_METHOD)
    mine = _payload(mib, 0)
    times, cpu = [], time.process_time()
    for _ in range(rounds):
        start = time.perf_counter()
        theirs = np.frombuffer(call(mine.tobytes(), timeout=60), dtype=np.uint64)
        times.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu
    assert theirs.nbytes == mine.nbytes
    peer_cpu = out.get(timeout=120)
    peer.join(30)
    channel.close()
    return {"times": times, "cpu": (cpu, peer_cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=29.0, help="message size per direction")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--only", default="fedunlearn,asyncio,grpc")
    args = parser.parse_args()
    runs = {"fedunlearn": fedunlearn_main, "asyncio": asyncio_main, "grpc": grpc_main}
    print(f"{args.mib:g} MiB each way, {args.rounds} exchanges, loopback, plain TCP")
    print("| library | median s per exchange | MiB/s per direction | CPU s (this side / peer) |")
    print("|---|---:|---:|---|")
    for name in args.only.split(","):
        report = runs[name](args.mib, args.rounds)
        median = statistics.median(report["times"][1:] or report["times"])  # first: warm-up
        cpu = " / ".join(f"{c:.2f}" for c in report["cpu"])
        print(f"| {name} | {median:.4f} | {args.mib / median:.0f} | {cpu} |")


if __name__ == "__main__":
    main()
