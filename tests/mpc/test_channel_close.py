"""How a ``Channel`` ends: a goodbye is never cut in two, and a peer's last words are read.

The race behind a rare CI failure of ``test_dealer_stream.py::test_a_plan_may_end_unused``: a
server's ``RemoteDealer.close`` queued its goodbye and closed the channel; when its I/O thread
was held up (a loaded machine) after writing the goodbye's header, the closing thread shut the
socket down after its own timeouts (flush 2 s, join 5 s) and the dealer read "closed the
connection (got 24 bytes of the frame)" and exited 1. The I/O thread now owns the socket until
it has finished the frames queued before the close, and closes it itself.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
from held_socket import hold_the_second_send, wait_until

from fedunlearn.errors import PeerDisconnectedError
from fedunlearn.mpc.channel import Channel
from fedunlearn.mpc.tcp import Expect, TcpListener, TcpTransport

GOODBYE = np.array([3, 1], dtype=np.uint64)


def tcp_pair(timeout_seconds: float = 5.0) -> tuple[TcpTransport, TcpTransport]:
    listener = TcpListener("127.0.0.1", 0)
    try:
        near = TcpTransport.connect(*listener.address, timeout_seconds=timeout_seconds)
        far = listener.accept(timeout_seconds=timeout_seconds)
    finally:
        listener.close()
    return near, far


def test_a_close_never_cuts_the_goodbye_the_io_thread_is_writing():
    near, far = tcp_pair()
    release = threading.Event()
    held = hold_the_second_send(near, release)
    channel = Channel(near, expect=lambda: Expect(1 << 20), name="test-near")
    channel.send(GOODBYE)
    wait_until(lambda: held.sends == 2)  # the goodbye's header is out, its payload held
    start = time.monotonic()
    channel.close(flush_seconds=0.5, background=True)
    returned_after = time.monotonic() - start
    time.sleep(0.2)  # the closing thread has moved on; the I/O thread is still held
    release.set()  # the I/O thread runs again: it must finish the goodbye, then hang up
    try:
        got = far.recv()
        np.testing.assert_array_equal(got, GOODBYE)
        with pytest.raises(PeerDisconnectedError, match="closed the connection"):
            far.recv()
    finally:
        far.close()
    assert returned_after < 1.5  # the flush bound (0.5 s), not the I/O thread's delay


def test_a_close_without_background_waits_until_the_connection_is_closed():
    near, far = tcp_pair()
    channel = Channel(near, expect=lambda: Expect(1 << 20), name="test-near")
    channel.send(GOODBYE)
    closer = threading.Thread(target=channel.close, kwargs={"flush_seconds": 2.0})
    closer.start()
    try:
        np.testing.assert_array_equal(far.recv(), GOODBYE)
        far.close()  # the channel lingers until its peer hangs up
        closer.join(5.0)
        assert not closer.is_alive()
        assert near.closed
    finally:
        far.close()


def test_the_peers_goodbye_is_read_though_a_send_to_it_fails_first():
    # The dealer streams to a server that said goodbye and hung up (its linger over while the
    # dealer was held up): the goodbye is in the dealer's socket, and the next send fails. The
    # dealer must still read the goodbye, then report the lost connection.
    near, far = tcp_pair()
    parked, release = threading.Event(), threading.Event()
    wait = near.wait

    def held_wait(*args, **kwargs):
        parked.set()
        release.wait(10.0)
        return wait(*args, **kwargs)

    near.wait = held_wait  # type: ignore[method-assign]
    channel = Channel(near, expect=lambda: Expect(1 << 20), name="test-near")
    assert parked.wait(5.0)  # the I/O thread found nothing to do and waits
    far.send(GOODBYE)
    far_socket = far._sock  # an abortive close: a reset, as when unread data is dropped
    far_socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    far_socket.close()
    channel.send(np.zeros(1 << 16, dtype=np.uint64))  # a send is due before the next read
    time.sleep(0.05)
    release.set()
    np.testing.assert_array_equal(channel.receive(5.0), GOODBYE)
    with pytest.raises(PeerDisconnectedError):
        channel.receive(5.0)
    channel.close()
