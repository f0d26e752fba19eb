"""Party programs and peer processes for the remote-dealer tests (importable by children)."""

from __future__ import annotations

import numpy as np

from fedunlearn.mpc import (
    LinkLimits,
    Party,
    RemoteDealer,
    Security,
    TcpTransport,
    sec_ge,
    sec_inverse,
    sec_mul,
    sec_share,
)

DEALER_SEED = 23
X = np.array([1.5, -2.25, 0.0, 3.0, -0.5, 7.0])
Y = np.array([0.5, 4.0, -1.0, 3.0, -0.75, 2.0])
M = np.array([[2.0, 1.0, 0.0], [0.5, 3.0, -1.0], [0.0, 1.0, 4.0]])
TIMEOUT = 20.0


def program(party: Party) -> dict:
    """SecMul, SecGE and SecMI on small inputs (X, M from party 0; Y from party 1)."""
    x = sec_share(party, X if party.party_id == 0 else None, owner=0)
    y = sec_share(party, Y if party.party_id == 1 else None, owner=1)
    m = sec_share(party, M if party.party_id == 0 else None, owner=0)
    return {
        "product": sec_mul(x, y).reveal(),
        "ge": sec_ge(x, y).reveal(),
        "inverse": sec_inverse(m).reveal(),
        "counters": party.counters.snapshot(),
        "requests": party.dealer.requests,
    }


def record_frames(dealer: RemoteDealer) -> list[tuple[str, tuple, bytes]]:
    """Log (dtype, shape, payload) of every seed and correction frame the dealer sends."""
    frames: list[tuple[str, tuple, bytes]] = []
    on_frame = dealer._on_frame

    def recording(frame: np.ndarray):  # noqa: ANN202
        if dealer._state in ("seed", "corrections"):
            frames.append((frame.dtype.str, frame.shape, frame.tobytes()))
        return on_frame(frame)

    dealer._on_frame = recording  # type: ignore[method-assign]
    return frames


def connect_party(party_id: int, peer: TcpTransport, dealer_address: tuple[str, int]) -> Party:
    """A party with a remote dealer client."""
    dealer = RemoteDealer.connect(
        *dealer_address,
        security=Security.plain(),
        party_id=party_id,
        limits=LinkLimits(timeout_seconds=TIMEOUT),
    )
    return Party(party_id, peer, dealer=dealer, local_seed=3)


def party_1(port: int, dealer_address: tuple[str, int], results) -> None:  # noqa: ANN001
    """Party 1 in a child process: run the program with the remote dealer; report the result."""
    try:
        peer = TcpTransport.connect("127.0.0.1", port, party_id=1, timeout_seconds=TIMEOUT)
        party = connect_party(1, peer, dealer_address)
        frames = record_frames(party.dealer)  # type: ignore[arg-type]
        out = program(party)
        party.close()
        results.put(("ok", out, frames))
    except BaseException as exc:  # reported to the parent test
        results.put(("error", repr(exc), []))


def party_1_until_dealer_dies(port: int, dealer_address, results, go) -> None:  # noqa: ANN001
    """Party 1: one SecMul, report, wait for the parent to kill the dealer, then multiply again."""
    peer = TcpTransport.connect("127.0.0.1", port, party_id=1, timeout_seconds=TIMEOUT)
    party = connect_party(1, peer, dealer_address)
    x = sec_share(party, None, owner=0)
    sec_mul(x, x).reveal()
    results.put("first product done")
    go.wait(TIMEOUT)
    try:
        sec_mul(x, x).reveal()
        results.put("no error")
    except BaseException as exc:  # reported to the parent test
        results.put(type(exc).__name__)
    finally:
        party.close()
