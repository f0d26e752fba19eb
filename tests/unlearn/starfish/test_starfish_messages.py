"""The clients service's JSON messages are parsed with bounds (issue 25: a traceback before)."""

import socket

import numpy as np
import pytest

from fedunlearn.errors import MalformedFrameError
from fedunlearn.mpc import TcpTransport
from fedunlearn.unlearn.starfish.deploy.clients import MAX_MESSAGE_BYTES, recv_doc, send_doc


@pytest.mark.parametrize(
    "payload",
    [b'{"op": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", b'{"round": ' + b"7" * 5_000 + b"}"],
    ids=["nested", "huge_integer"],
)
def test_a_server_message_too_deep_or_with_a_huge_integer_is_malformed(payload):
    a, b = socket.socketpair()
    sender = TcpTransport(a, 0, 5.0, MAX_MESSAGE_BYTES, peer_name="clients")
    receiver = TcpTransport(b, 1, 5.0, MAX_MESSAGE_BYTES, peer_name="server0")
    try:
        sender.send(np.frombuffer(payload, dtype=np.uint8).copy())
        with pytest.raises(MalformedFrameError) as caught:
            recv_doc(receiver, "server0")
        assert "\n" not in str(caught.value)
        assert "7777" not in str(caught.value)
        send_doc(sender, {"op": "bye", "round": 3})  # the ordinary message still parses
        assert recv_doc(receiver, "server0") == {"op": "bye", "round": 3}
    finally:
        sender.close()
        receiver.close()
