"""Peer processes for the link and dealer tests (importable by spawned children)."""

from __future__ import annotations

import socket
import ssl
import time

import numpy as np

from fedunlearn.mpc import (
    Identity,
    LinkLimits,
    RemoteDealer,
    Security,
    SessionBinding,
    connect_peer,
)

TIMEOUT = 20.0


def server1(port: int, pki_dir: str, session: str, digests: dict, results, linger=None) -> None:  # noqa: ANN001
    """Server 1: connect to server 0 with role and binding, exchange once, report."""
    try:
        link = connect_peer(
            ("127.0.0.1", port),
            security=Security(identity=Identity.from_directory(pki_dir, "server1")),
            role="server1",
            peer_roles={"server0"},
            binding=SessionBinding(session, digests),
            limits=LinkLimits(timeout_seconds=TIMEOUT),
        )
        got = link.transport.exchange(np.arange(4, dtype=np.uint64))
        results.put(("ok", got.tolist(), link.role))
        if linger is not None:
            linger.wait(TIMEOUT)  # the parent kills this process while it waits
        link.close()
    except Exception as exc:  # reported to the parent test
        results.put((type(exc).__name__, str(exc), None))


def dealer_party(address, pki_dir: str, party_id: int, session: str, results) -> None:  # noqa: ANN001
    """A server of the dealer tests in its own process: one triple, goodbye, report."""
    try:
        client = RemoteDealer.connect(
            *address,
            security=Security(identity=Identity.from_directory(pki_dir, f"server{party_id}")),
            party_id=party_id,
            binding=SessionBinding(session),
            limits=LinkLimits(timeout_seconds=TIMEOUT),
        )
        a, b, c = client.triple((8,))
        client.close()
        results.put(("ok", [a.tolist(), b.tolist(), c.tolist()]))
    except Exception as exc:  # reported to the parent test
        results.put((type(exc).__name__, str(exc)))


# ---- junk connections (threads of the test process) ------------------------------------


def junk_bytes(address: tuple[str, int]) -> None:
    """Connect, write garbage, hang up."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
        time.sleep(0.1)


def oversized_header(address: tuple[str, int]) -> None:
    """Connect and declare a 1 GiB frame (before any TLS): the listener must not allocate it."""
    size = (1 << 30).to_bytes(8, "big")
    header = b"FUMP" + bytes([1, 1, 0, 0]) + size + (1 << 27).to_bytes(8, "big")
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(header)
        time.sleep(0.2)


def slow_drip(address: tuple[str, int], seconds: float) -> None:
    """Connect and send one byte every 0.1 s for ``seconds`` (a slow-loris)."""
    with socket.create_connection(address, timeout=5) as sock:
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                sock.send(b"\x16")
                time.sleep(0.1)
        except OSError:
            pass  # the listener dropped us, as it should


def silent(address: tuple[str, int], seconds: float) -> None:
    """Connect and say nothing."""
    with socket.create_connection(address, timeout=5):
        time.sleep(seconds)


def tls_without_certificate(address: tuple[str, int]) -> str:
    """A TLS client that presents no certificate (a third party); return what happened."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection(address, timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            tls.sendall(b"hello")
            return f"read {tls.recv(100)!r}"
    except (OSError, ssl.SSLError) as exc:
        return f"{type(exc).__name__}: {exc}"
