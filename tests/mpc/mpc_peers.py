"""Programs and peer processes shared by the mpc tests (importable by spawned children)."""

from __future__ import annotations

import numpy as np

from fedunlearn.errors import PeerDisconnectedError
from fedunlearn.mpc import (
    Party,
    TcpTransport,
    run_two_party,
    sec_ge,
    sec_mul,
    sec_share,
    sec_sort,
)

DEALER_SEED = 11
X = np.array([1.5, -2.25, 0.0, 3.0, -0.5, 7.0, 7.0])
Y = np.array([0.5, 4.0, -1.0, 3.0, -0.75, 2.0, 7.0])


def demo_program(party: Party) -> dict:
    """Share X (party 0) and Y (party 1), multiply, compare and sort; reveal and count."""
    x = sec_share(party, X if party.party_id == 0 else None, owner=0)
    y = sec_share(party, Y if party.party_id == 1 else None, owner=1)
    product = sec_mul(x, y).reveal()
    ge = sec_ge(x, y).reveal()
    ranked = sec_sort([x])[0].reveal()
    return {
        "product": product,
        "ge": ge,
        "sorted": ranked,
        "counters": party.counters.snapshot(),
    }


def run_in_process() -> tuple[dict, dict]:
    """The demo program with both parties as threads of this process."""
    return run_two_party(demo_program, dealer_seed=DEALER_SEED, local_seed=5)


def tcp_peer(port: int, results, ssl_args: tuple | None = None) -> None:  # noqa: ANN001
    """Party 1 in a child process: connect, run the demo program, report the result."""
    context = None
    if ssl_args is not None:
        import ssl

        cafile, hostname = ssl_args
        context = ssl.create_default_context(cafile=cafile)
        context.check_hostname = True
    try:
        transport = TcpTransport.connect(
            "127.0.0.1",
            port,
            timeout_seconds=20,
            ssl_context=context,
            server_hostname=None if ssl_args is None else ssl_args[1],
        )
        party = Party(1, transport, DEALER_SEED, local_seed=5)
        results.put(("ok", demo_program(party)))
        transport.close()
    except BaseException as exc:  # reported to the parent test
        results.put(("error", repr(exc)))


def disconnecting_peer(port: int) -> None:
    """Connect, take part in one exchange, then exit in the middle of the protocol."""
    transport = TcpTransport.connect("127.0.0.1", port, timeout_seconds=20)
    transport.exchange(np.arange(4, dtype=np.uint64))
    transport.close()


def _linger(transport: TcpTransport) -> None:
    """Wait (silently) until the parent closes the connection, then exit."""
    try:
        transport.recv()
    except PeerDisconnectedError:
        pass
    transport.close()


def silent_peer(port: int) -> None:
    """Connect and then say nothing until the parent hangs up."""
    _linger(TcpTransport.connect("127.0.0.1", port, timeout_seconds=20))


def raw_bytes_peer(port: int, data: bytes) -> None:
    """Connect and write ``data`` unframed (a malformed or oversized frame), then linger."""
    transport = TcpTransport.connect("127.0.0.1", port, timeout_seconds=20)
    transport.send_raw(data)
    _linger(transport)
