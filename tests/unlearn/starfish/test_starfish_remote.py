"""The sockets and TLS of Starfish's processes: mutual TLS, a rogue CA refused, bounded accept."""

import socket
import threading

import numpy as np
import pytest
from starfish_support import write_tls

from fedunlearn.errors import ConfigError, PeerDisconnectedError
from fedunlearn.unlearn.starfish.deploy.remote import Tls, accept, connect, listen


def serve_once(sock, tls, out):
    try:
        transport = accept(sock, 0, 10.0, tls)
        out["got"] = transport.exchange(np.arange(4, dtype=np.uint64))
        transport.close()
    except Exception as exc:  # reported to the test
        out["error"] = exc


def test_mutual_tls_connects_servers_with_certificates_of_one_ca(tmp_path):
    tls = write_tls(tmp_path / "good", "fedunlearn")
    sock = listen("127.0.0.1", 0)
    out = {}
    thread = threading.Thread(target=serve_once, args=(sock, tls, out))
    thread.start()
    try:
        client = connect(("127.0.0.1", sock.getsockname()[1]), 1, 10.0, tls)
        got = client.exchange(np.full(4, 7, dtype=np.uint64))
        client.close()
    finally:
        thread.join(20)
        sock.close()
    assert "error" not in out, out
    np.testing.assert_array_equal(got, np.arange(4))
    np.testing.assert_array_equal(out["got"], np.full(4, 7))


def test_tls_refuses_a_peer_certified_by_another_ca(tmp_path):
    good = write_tls(tmp_path / "good", "fedunlearn")
    rogue = write_tls(tmp_path / "rogue", "rogue")
    sock = listen("127.0.0.1", 0)
    out = {}
    thread = threading.Thread(target=serve_once, args=(sock, good, out))
    thread.start()
    try:
        with pytest.raises(Exception):  # noqa: B017 - the client sees an SSL or socket error
            client = connect(("127.0.0.1", sock.getsockname()[1]), 1, 10.0, rogue)
            client.exchange(np.zeros(1, dtype=np.uint64))
    finally:
        thread.join(20)
        sock.close()
    assert isinstance(out.get("error"), PeerDisconnectedError)
    assert "TLS handshake" in str(out["error"])


def test_missing_tls_files_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        Tls(tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem").context(False)


def test_accept_gives_up_after_its_timeout():
    sock = listen("127.0.0.1", 0)
    try:
        with pytest.raises(PeerDisconnectedError, match="no peer connected"):
            accept(sock, 0, 0.2)
    finally:
        sock.close()
    assert isinstance(sock, socket.socket)
