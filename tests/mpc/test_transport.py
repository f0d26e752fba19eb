"""Transports: in-process pair, TCP between two real processes, framing limits, disconnects."""

from __future__ import annotations

import multiprocessing
import struct
import threading
import time

import mpc_peers
import numpy as np
import pytest

from fedunlearn.errors import MalformedFrameError, PeerDisconnectedError
from fedunlearn.mpc import (
    InProcessTransport,
    Party,
    TcpListener,
    TcpTransport,
    run_two_party,
    sec_mul,
    sec_share,
)

SPAWN = multiprocessing.get_context("spawn")


def test_in_process_exchange_counts_bytes_and_rounds():
    t0, t1 = InProcessTransport.pair(timeout_seconds=5)
    out = {}
    peer_array = np.arange(5, dtype=np.uint64)
    worker = threading.Thread(target=lambda: out.update(b=t1.exchange(peer_array)))
    worker.start()
    got = t0.exchange(np.arange(10, 15, dtype=np.uint64))
    worker.join()
    np.testing.assert_array_equal(got, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(out["b"], [10, 11, 12, 13, 14])
    assert t0.counters.online.bytes_sent == 40 and t0.counters.online.bytes_received == 40
    assert t0.counters.online.rounds == 1 and t1.counters.online.rounds == 1
    with t0.counters.in_phase("offline"):
        t0.send(np.zeros(2, np.uint64))
    assert t0.counters.offline.bytes_sent == 16 and t0.counters.offline.rounds == 1


def test_in_process_peer_that_closes_raises_instead_of_hanging():
    t0, t1 = InProcessTransport.pair(timeout_seconds=30)
    t1.close()
    start = time.monotonic()
    with pytest.raises(PeerDisconnectedError, match="closed"):
        t0.recv()
    assert time.monotonic() - start < 1


def test_in_process_silent_peer_times_out():
    t0, _ = InProcessTransport.pair(timeout_seconds=0.2)
    with pytest.raises(PeerDisconnectedError, match="sent nothing"):
        t0.exchange(np.zeros(1, np.uint64))


def test_a_failing_party_stops_the_other_and_its_error_is_raised():
    def program(p):
        x = sec_share(p, np.ones(3) if p.party_id == 0 else None, owner=0)
        if p.party_id == 1:
            raise RuntimeError("party 1 crashed")
        return sec_mul(x, x).reveal()

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="party 1 crashed"):
        run_two_party(program, timeout_seconds=30)
    assert time.monotonic() - start < 5


def start_peer(target, *args):
    process = SPAWN.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def test_tcp_between_two_processes_matches_the_in_process_run():
    # Prepare: party 0 here, party 1 in a spawned process, loopback, ephemeral port
    listener = TcpListener("127.0.0.1", 0)
    results = SPAWN.Queue()
    peer = start_peer(mpc_peers.tcp_peer, listener.port, results)
    try:
        transport = listener.accept(timeout_seconds=30)
        # Execute
        mine = mpc_peers.demo_program(Party(0, transport, mpc_peers.DEALER_SEED, local_seed=5))
        status, theirs = results.get(timeout=30)
    finally:
        listener.close()
        peer.join(timeout=10)
    expected0, expected1 = mpc_peers.run_in_process()
    # Assert: same values, and the counters of a real network run equal the in-process ones
    assert status == "ok", theirs
    np.testing.assert_array_equal(mine["ge"], (mpc_peers.X >= mpc_peers.Y).astype(float))
    np.testing.assert_allclose(mine["product"], mpc_peers.X * mpc_peers.Y, atol=1e-3)
    np.testing.assert_array_equal(mine["sorted"], np.sort(mpc_peers.X)[::-1])
    for key in ("product", "ge", "sorted"):
        np.testing.assert_array_equal(mine[key], theirs[key])
        np.testing.assert_array_equal(mine[key], expected0[key])
    assert mine["counters"] == expected0["counters"]
    assert theirs["counters"] == expected1["counters"]


def test_tcp_peer_disconnecting_mid_protocol_raises_not_hangs():
    listener = TcpListener("127.0.0.1", 0)
    peer = start_peer(mpc_peers.disconnecting_peer, listener.port)
    try:
        transport = listener.accept(timeout_seconds=30)
        transport.exchange(np.arange(4, dtype=np.uint64))
        peer.join(timeout=20)
        start = time.monotonic()
        with pytest.raises(PeerDisconnectedError):
            for _ in range(3):  # the first send after a close may still be buffered
                transport.exchange(np.arange(4, dtype=np.uint64))
        assert time.monotonic() - start < 5
    finally:
        listener.close()


def test_tcp_silent_peer_times_out():
    listener = TcpListener("127.0.0.1", 0)
    peer = start_peer(mpc_peers.silent_peer, listener.port)
    try:
        transport = listener.accept(timeout_seconds=30)
        transport.set_timeout(0.3)
        start = time.monotonic()
        with pytest.raises(PeerDisconnectedError, match="sent nothing"):
            transport.recv()
        assert time.monotonic() - start < 2
        transport.close()
    finally:
        listener.close()
        peer.join(timeout=10)


def header(magic=b"FUMP", code=1, ndim=1, nbytes=8):
    return struct.pack("!4sBBxxQ", magic, code, ndim, nbytes)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (header(nbytes=1 << 40) + struct.pack("!Q", 1 << 37), "exceeds the cap"),
        (header(magic=b"HTTP") + b"\0" * 16, "bad magic"),
        (header(code=9) + b"\0" * 16, "unknown dtype"),
        (header(ndim=1, nbytes=16) + struct.pack("!Q", 1) + b"\0" * 16, "needs 8 bytes"),
    ],
    ids=["oversized", "bad-magic", "bad-dtype", "length-mismatch"],
)
def test_tcp_rejects_malformed_and_oversized_frames(data, message):
    listener = TcpListener("127.0.0.1", 0)
    peer = start_peer(mpc_peers.raw_bytes_peer, listener.port, data)
    try:
        transport = listener.accept(timeout_seconds=30, max_frame_bytes=1 << 20)
        with pytest.raises(MalformedFrameError, match=message):
            transport.recv()
        with pytest.raises(PeerDisconnectedError):  # the connection was closed, not reused
            transport.recv()
    finally:
        listener.close()
        peer.join(timeout=10)


def test_connect_to_nobody_raises_after_the_timeout():
    listener = TcpListener("127.0.0.1", 0)
    port = listener.port
    listener.close()
    with pytest.raises(PeerDisconnectedError, match="could not connect"):
        TcpTransport.connect("127.0.0.1", port, timeout_seconds=0.3)


def self_signed_certificate(directory):
    """Write a throwaway key and self-signed certificate for 'localhost'; return their paths."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_transport_between_two_processes(tmp_path):
    # Prepare: server-side TLS context for party 0; party 1 verifies the certificate
    import ssl

    cert_path, key_path = self_signed_certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    listener = TcpListener("127.0.0.1", 0, ssl_context=context)
    results = SPAWN.Queue()
    peer = start_peer(mpc_peers.tcp_peer, listener.port, results, (str(cert_path), "localhost"))
    try:
        # Execute
        transport = listener.accept(timeout_seconds=30)
        mine = mpc_peers.demo_program(Party(0, transport, mpc_peers.DEALER_SEED, local_seed=5))
        status, theirs = results.get(timeout=30)
    finally:
        listener.close()
        peer.join(timeout=10)
    # Assert: encrypted channel, same results and counters as in process
    expected0, _ = mpc_peers.run_in_process()
    assert status == "ok", theirs
    assert isinstance(transport._sock, ssl.SSLSocket)
    np.testing.assert_array_equal(mine["sorted"], theirs["sorted"])
    np.testing.assert_array_equal(mine["ge"], expected0["ge"])
    assert mine["counters"] == expected0["counters"]


# ---- bounded frames (issue 15: a 1 KiB header made the receiver allocate 1 GiB, a shape
# (0, 2^64 - 1) crashed the dealer, a byte now and then held a connection open forever) ------


def feed(reader, data):
    """Push bytes through a FrameReader as a socket would, stage by stage."""
    data, now = memoryview(data), time.monotonic()
    while data and not reader.done:
        view = reader.view()
        n = min(len(view), len(data))
        view[:n] = data[:n]
        data = data[n:]
        reader.advance(n, now)


def test_a_small_header_declaring_a_huge_frame_allocates_little():
    from fedunlearn.mpc.tcp import Expect, FrameReader

    reader = FrameReader(Expect(2 << 30))
    feed(reader, header(nbytes=1 << 30) + struct.pack("!Q", 1 << 27))
    assert reader.stage == "payload"
    assert len(reader.view()) <= 1 << 20  # the first payload buffer, not 1 GiB
    feed(reader, bytes(3 << 20))  # as bytes arrive, buffers grow with them
    assert reader.received < (4 << 20) + 64 and not reader.done


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (header(ndim=2, nbytes=0) + struct.pack("!QQ", 0, 2**64 - 1), "has a dimension above"),
        (header(code=2, ndim=2, nbytes=0) + struct.pack("!QQ", 2**40, 0), "has a dimension above"),
    ],
    ids=["zero-by-huge", "huge-by-zero"],
)
def test_impossible_shapes_are_rejected_cleanly(data, message):
    from fedunlearn.mpc.tcp import Expect, FrameReader

    with pytest.raises(MalformedFrameError, match=message):
        feed(FrameReader(Expect(1 << 20)), data)


def test_a_slow_drip_is_dropped_at_the_frame_deadline():
    import socket

    a, b = socket.socketpair()
    transport = TcpTransport(a, 0, timeout_seconds=0.5, min_bytes_per_second=1e6)
    stop = threading.Event()

    def drip():
        for byte in header(nbytes=64) + struct.pack("!Q", 8) + bytes(64):
            if stop.wait(0.1):
                return
            try:
                b.send(bytes([byte]))
            except OSError:
                return

    thread = threading.Thread(target=drip)
    thread.start()
    start = time.monotonic()
    try:
        with pytest.raises(PeerDisconnectedError, match="too slowly"):
            transport.recv()
        assert time.monotonic() - start < 1.5  # the deadline, not a per-byte timeout
    finally:
        stop.set()
        thread.join(5)
        transport.close()
        b.close()


def quietly(call, *args):
    """Run the other party's side; its own error is not what the test checks."""
    try:
        call(*args)
    except (MalformedFrameError, PeerDisconnectedError):
        pass


def test_an_exchange_refuses_a_frame_of_another_shape_before_reading_it():
    import socket

    a, b = socket.socketpair()
    t0, t1 = TcpTransport(a, 0, 5.0), TcpTransport(b, 1, 5.0)
    worker = threading.Thread(target=quietly, args=(t1.exchange, np.zeros(1 << 20)))
    worker.start()
    with pytest.raises(MalformedFrameError, match="exceeds the cap of 32 bytes"):
        t0.exchange(np.zeros(4, np.uint64))
    worker.join(10)
    t0.close()
    t1.close()


def test_in_process_exchange_of_different_shapes_is_out_of_step():
    t0, t1 = InProcessTransport.pair(timeout_seconds=5)
    worker = threading.Thread(target=quietly, args=(t1.exchange, np.zeros(3)))
    worker.start()
    with pytest.raises(MalformedFrameError, match="out of step|exceed"):
        t0.exchange(np.zeros(5))
    worker.join(5)


def test_tls_exchanges_are_full_duplex_for_large_frames(tmp_path):
    # both parties send 16 MB at once over TLS: one thread per end drives read and write
    import socket

    from fedunlearn.mpc import create_trial_pki

    ids = create_trial_pki(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    out = {}

    def serve():
        conn, _ = listener.accept()
        tls, _ = ids["server0"].wrap_server(conn, {"server1"}, timeout_seconds=5, where="s1")
        transport = TcpTransport(tls, 0, 10.0)
        out["0"] = transport.exchange(np.full(2 << 20, 3, np.uint64))
        transport.close()

    thread = threading.Thread(target=serve)
    thread.start()
    raw = socket.create_connection(listener.getsockname())
    tls, _ = ids["server1"].wrap_client(raw, {"server0"}, timeout_seconds=5, where="s0")
    transport = TcpTransport(tls, 1, 10.0)
    start = time.monotonic()
    got = transport.exchange(np.full(2 << 20, 5, np.uint64))
    thread.join(20)
    transport.close()
    listener.close()
    assert np.all(got == 3) and np.all(out["0"] == 5)
    assert transport.wire_bytes_sent > 16 << 20 and transport.wire_bytes_received > 16 << 20
    assert time.monotonic() - start < 10


def test_tcp_keeps_the_shape_of_scalars_and_empty_arrays():
    import socket

    a, b = socket.socketpair()
    t0, t1 = TcpTransport(a, 0, 5.0), TcpTransport(b, 1, 5.0)
    try:
        for array in (np.array(7, np.uint64), np.zeros((0, 3), np.uint64), np.ones((2, 1))):
            out: dict = {}
            worker = threading.Thread(target=lambda a=array, o=out: o.update(got=t1.exchange(a)))
            worker.start()
            mine = t0.exchange(array)
            worker.join(5)
            assert mine.shape == array.shape and out["got"].shape == array.shape
            np.testing.assert_array_equal(mine, array)
    finally:
        t0.close()
        t1.close()
