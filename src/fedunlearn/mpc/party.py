"""One server's 2PC context, and a runner for both servers in one process.

A ``Party`` is what every protocol function reaches through its ``SharedTensor`` arguments:
party id, transport, dealer, fixed-point parameters, comparison mode and counters. The same
protocol code runs with both parties as threads of one process (``run_two_party``, in-process
transport) or as two OS processes (each builds its ``Party`` on a ``TcpTransport``).

Parties 0 and 1 are the paper's servers S1 and S2 (Liu et al., Sec. III-A), each holding one
additive share of every secret.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from fedunlearn.errors import ConfigError, PeerDisconnectedError
from fedunlearn.mpc.dealer import Dealer, DealerClient
from fedunlearn.mpc.fixed_point import FixedPoint
from fedunlearn.mpc.prg import Prg, derive_seed, fresh_seed
from fedunlearn.mpc.transport import Counters, InProcessTransport, Transport

if TYPE_CHECKING:
    from fedunlearn.mpc.shares import SharedTensor

__all__ = ["Comparison", "Party", "run_two_party"]

Comparison = Literal["real", "ideal"]
R = TypeVar("R")


class Party:
    """One of the two computing servers.

    Args:
        party_id: 0 (S1) or 1 (S2).
        transport: Connection to the other party; its counters also receive the dealer's bytes.
        dealer_seed: Master seed of the simulated (test) ``Dealer``; both parties must pass the
            same one. Give either this or ``dealer``.
        fixed_point: Fixed-point parameters; both parties must agree.
        comparison: ``"real"`` runs the GMW comparison circuit; ``"ideal"`` computes comparisons
            through a trusted functionality and charges the real protocol's cost (fast sweeps,
            not secure; see ``protocols.compare``). Ideal is refused on any transport but the
            in-process test transport (``Transport.supports_ideal``): over a real link each
            server would see d = x - y.
        local_seed: Seed of this party's own randomness (masks in ``sec_share``); None draws
            a fresh one from the operating system.
        dealer: This party's dealer client, e.g. a ``RemoteDealer`` connected to a dealer
            process (the secure setting); its offline bytes are charged to the transport's
            counters, and ``close()`` closes it too.

    Raises:
        ConfigError: If neither or both of ``dealer_seed`` and ``dealer`` are given, the
            dealer serves another party id, or ``comparison="ideal"`` is asked for on a
            transport between processes.
    """

    def __init__(
        self,
        party_id: int,
        transport: Transport,
        dealer_seed: int | bytes | None = None,
        fixed_point: FixedPoint | None = None,
        *,
        comparison: Comparison = "real",
        local_seed: int | None = None,
        dealer: DealerClient | None = None,
    ) -> None:
        if party_id not in (0, 1):
            raise ConfigError(f"party_id must be 0 or 1; got {party_id!r}")
        if comparison not in ("real", "ideal"):
            raise ConfigError(f"comparison must be 'real' or 'ideal'; got {comparison!r}")
        if comparison == "ideal" and not transport.supports_ideal:
            raise ConfigError(
                "comparison='ideal' sends each server's share of d = x - y to the other (both "
                f"then see d); it is refused on {type(transport).__name__} and allowed only on "
                "the in-process test transport. Use comparison='real' in a deployment."
            )
        self.party_id = party_id
        self.transport = transport
        self.fixed_point = fixed_point or FixedPoint()
        self.comparison: Comparison = comparison
        if (dealer_seed is None) == (dealer is None):
            raise ConfigError(
                "Party needs exactly one of dealer_seed (simulated dealer, tests) and dealer "
                f"(e.g. a RemoteDealer); got dealer_seed={dealer_seed!r}, dealer={dealer!r}"
            )
        if dealer is None:
            dealer = Dealer(dealer_seed, party_id, transport.counters)  # type: ignore[arg-type]
        elif dealer.party_id != party_id:
            raise ConfigError(
                f"the dealer client serves party {dealer.party_id} but this is party {party_id}; "
                "connect one dealer client per party with its own party_id"
            )
        else:
            dealer.counters = transport.counters  # dealer bytes count as this party's offline
        self.dealer: DealerClient = dealer
        self._dealer = dealer  # closed by close() even if protocols wrap self.dealer
        seed = fresh_seed() if local_seed is None else derive_seed(b"local", local_seed, party_id)
        self.prg = Prg(seed)

    def __repr__(self) -> str:
        return f"Party(party_id={self.party_id}, frac_bits={self.fixed_point.frac_bits})"

    @property
    def counters(self) -> Counters:
        """Bytes, rounds and messages of this party, offline and online."""
        return self.transport.counters

    @contextmanager
    def offline(self) -> Iterator[None]:
        """Charge party-to-party traffic in the block to the offline phase (e.g. mask setup)."""
        with self.counters.in_phase("offline"):
            yield

    def tensor(self, share: NDArray[np.uint64], frac_bits: int | None = None) -> SharedTensor:
        """Wrap this party's share array (e.g. a stored client upload) as a ``SharedTensor``."""
        from fedunlearn.mpc.shares import SharedTensor  # shares imports party: import late

        bits = self.fixed_point.frac_bits if frac_bits is None else frac_bits
        return SharedTensor(np.asarray(share, dtype=np.uint64), self, bits)

    def close(self) -> None:
        """Close the transport and the dealer client."""
        try:
            self.transport.close()
        finally:
            self._dealer.close()


def run_two_party(
    program: Callable[[Party], R],
    *,
    dealer_seed: int | bytes | None = None,
    fixed_point: FixedPoint | None = None,
    comparison: Comparison = "real",
    local_seed: int | None = None,
    timeout_seconds: float = 60.0,
) -> tuple[R, R]:
    """Run ``program(party)`` for both parties in two threads over an in-process transport.

    Args:
        program: The protocol code of one party; it receives that party's ``Party``.
        dealer_seed: Master seed of the (simulated) dealer; None draws a fresh one.
        fixed_point: Fixed-point parameters for both parties.
        comparison: ``"real"`` or ``"ideal"`` comparisons.
        local_seed: Seed for the parties' own randomness (None: fresh).
        timeout_seconds: Receive timeout; a party that fails stops the other at once.

    Returns:
        (result of party 0, result of party 1).

    Raises:
        Exception: The first error a party raised (a ``PeerDisconnectedError`` only if that is
            all that happened).
    """
    transports = InProcessTransport.pair(timeout_seconds)
    if dealer_seed is None:
        dealer_seed = fresh_seed()
    parties = [
        Party(
            k, transports[k], dealer_seed, fixed_point, comparison=comparison, local_seed=local_seed
        )
        for k in (0, 1)
    ]
    results: list[object] = [None, None]
    errors: list[BaseException | None] = [None, None]

    def run(k: int) -> None:
        try:
            results[k] = program(parties[k])
        except BaseException as exc:  # re-raised in the caller below
            errors[k] = exc
            parties[k].close()  # the peer's next receive fails fast instead of timing out

    threads = [threading.Thread(target=run, args=(k,), name=f"party-{k}") for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    raised = [e for e in errors if e is not None]
    if raised:
        root = [e for e in raised if not isinstance(e, PeerDisconnectedError)]
        raise (root or raised)[0]
    return results[0], results[1]  # type: ignore[return-value]
