"""A server's client of the dealer process: ``RemoteDealer``, on demand or streamed ahead.

Each request is one round trip to the dealer (which pairs it with the other server's) unless
the server declared it in a plan (``DealerClient.plan``): then the dealer streams the material
ahead of use, and an I/O thread (``channel.Channel``) receives it and expands the shares before
they are needed, so a planned round runs without a message to the dealer. A request that
deviates from the plan gives the rest up (both servers deviate at the same request, since they
run the same program) and continues on demand. The messages are in ``dealer_wire``.

How to plan a round: docs/mpc.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import (
    ConfigError,
    FedUnlearnError,
    MalformedFrameError,
    PeerDisconnectedError,
    SecureComputationError,
)
from fedunlearn.mpc.channel import Channel
from fedunlearn.mpc.dealer import DealerClient, Request, expand
from fedunlearn.mpc.dealer_wire import (
    ABANDON,
    BYE,
    END,
    ERRORS,
    MATERIAL,
    MAX_ERROR_TEXT,
    MAX_HEADER_BYTES,
    MAX_PLAN_REQUESTS,
    REPLY,
    U64,
    encode_plan,
    encode_request,
)
from fedunlearn.mpc.identity import party_role
from fedunlearn.mpc.link import Link, check_ready, connect_peer
from fedunlearn.mpc.prg import SEED_BYTES
from fedunlearn.mpc.security import DEFAULT_LIMITS, LinkLimits, Security
from fedunlearn.mpc.session import MAX_HELLO_BYTES, SessionBinding, decode_message
from fedunlearn.mpc.tcp import Expect, TcpTransport
from fedunlearn.mpc.transport import Counters
from fedunlearn.mpc.wire import peer_text

__all__ = ["DEFAULT_PREFETCH_BYTES", "RemoteDealer"]

DEFAULT_PREFETCH_BYTES = 2 << 30


@dataclass
class _Plan:
    plan_id: int
    first: int
    requests: tuple[Request, ...]
    abandoned: bool = False
    ended: bool = False
    received: int = 0  # material items that arrived (I/O thread)

    @property
    def end(self) -> int:
        return self.first + len(self.requests)


@dataclass
class _Item:
    kind: str  # "reply", "material", "end"
    index: int
    plan_id: int = 0
    shares: tuple[np.ndarray, ...] = ()
    received: int = 0


class RemoteDealer(DealerClient):
    """A party's client of a ``DealerServer``: same methods as the simulated ``Dealer``.

    Requests are served on demand (one round trip each) unless declared ahead with ``plan``:
    then the dealer streams the material, an I/O thread receives and expands it ahead of use
    (at most ``prefetch_bytes`` of expanded shares wait), and each planned request is served
    locally. ``wait_prefetched`` blocks until a plan's material has arrived (the end of the
    offline phase). Pass the client to ``Party(party_id, transport, dealer=...)``; the party
    charges the material to its counters and ``Party.close()`` says goodbye to the dealer.

    Build one with ``RemoteDealer.connect``.

    Args:
        link: The joined link to the dealer (``link.connect_peer(..., wait_ready=False)``).
        party_id: 0 or 1.
        counters: Where offline bytes are charged (``Party`` points this at its own).
        mask_scale_bits: k of invertible masks; must equal the dealer's.
        prefetch_bytes: Expanded material that may wait for use.
        timeout_seconds: How long a reply or planned material may take.
    """

    def __init__(
        self,
        link: Link,
        party_id: int,
        counters: Counters | None = None,
        mask_scale_bits: int = 2,
        *,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        timeout_seconds: float = 60.0,
    ) -> None:
        super().__init__(party_id, counters, mask_scale_bits)
        self.link = link
        self.transport: TcpTransport = link.transport
        self.timeout_seconds = float(timeout_seconds)
        self._closed = False
        self._plans: dict[int, _Plan] = {}
        self._active: _Plan | None = None
        self._next_plan_id = 1
        self._outstanding: dict[int, Request] = {}
        # I/O-thread state: what the next frame is, and the item being assembled
        self._state = "ready"
        self._pending: tuple[str, int, int, Request | None] | None = None
        self._seed = b""
        self._error_code = 0
        self._channel = Channel(
            self.transport,
            expect=self._expect_next,
            on_frame=lambda frame: self._on_frame(frame),  # late-bound: tests may wrap it
            max_buffered_bytes=prefetch_bytes,
            write_timeout_seconds=self.timeout_seconds,
            name=f"dealer-client{party_id}",
        )

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        party_id: int,
        *,
        security: Security,
        binding: SessionBinding | None = None,
        counters: Counters | None = None,
        mask_scale_bits: int = 2,
        limits: LinkLimits = DEFAULT_LIMITS,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
    ) -> RemoteDealer:
        """Connect to a dealer (retrying until ``limits.timeout_seconds``), authenticate, say hello.

        Args:
            host: Dealer address.
            port: Dealer port.
            party_id: 0 or 1 (role ``server0``/``server1``).
            security: This server's TLS identity (role ``server0``/``server1``; the dealer
                must present a ``dealer`` certificate of the same CA), or explicitly plain TCP
                (``Security.plain()``).
            binding: The session binding; the dealer sees only ``binding.for_dealer()``.
            counters: Where offline bytes are charged (``Party`` points this at its own).
            mask_scale_bits: k of invertible masks; must equal the dealer's.
            limits: ``timeout_seconds`` bounds connecting, the other server's joining and each
                reply (the dealer replies once the other party has made the same request);
                ``max_frame_bytes`` is the largest correction frame accepted; the handshake
                bound.
            prefetch_bytes: Expanded planned material that may wait for use.

        Returns:
            The connected client (the dealer's "ready" is awaited with the first request).

        Raises:
            PeerAuthenticationError: TLS failed or the peer is not the dealer.
            SessionMismatchError: The dealer's session, job digest or mask_scale_bits differ.
            PeerDisconnectedError: No dealer listens at host:port.
        """
        link = connect_peer(
            (host, port),
            role=party_role(party_id),
            peer_roles={"dealer"},
            security=security,
            binding=None if binding is None else binding.for_dealer(),
            options={"mask_scale_bits": int(mask_scale_bits)},
            party_id=party_id,
            limits=limits,
            wait_ready=False,
        )
        return cls(
            link,
            party_id,
            counters,
            mask_scale_bits,
            prefetch_bytes=prefetch_bytes,
            timeout_seconds=limits.timeout_seconds,
        )

    def __repr__(self) -> str:
        return f"RemoteDealer(party_id={self.party_id}, requests={self.requests})"

    # ---- I/O thread: frames into items ---------------------------------------------------

    def _expect_next(self) -> Expect:
        if self._state == "ready":
            return Expect(MAX_HELLO_BYTES, np.dtype(np.uint8))
        if self._state == "seed":
            return Expect(SEED_BYTES, np.dtype(np.uint8), (SEED_BYTES,))
        if self._state == "corrections":
            request = self._pending[3] if self._pending else None
            words = request.correction_words if request is not None else 0
            return Expect(8 * words, U64, (words,))
        if self._state == "error":
            return Expect(MAX_ERROR_TEXT, np.dtype(np.uint8))
        return Expect(MAX_HEADER_BYTES)

    def _on_frame(self, frame: np.ndarray) -> tuple[_Item, int] | None:
        where = self.link.where
        if self._state == "ready":
            check_ready(decode_message(frame, where), where)
            self._state = "header"
            return None
        if self._state == "error":
            text = peer_text(frame.tobytes().decode(errors="replace"), 1000)
            raise ERRORS.get(self._error_code, SecureComputationError)(
                f"the dealer stopped the session: {text}"
            )
        if self._state == "seed":
            self._seed = frame.tobytes()
            request = self._pending[3] if self._pending else None
            if self.party_id == 1 and request is not None and request.correction_shapes:
                self._state = "corrections"
                return None
            return self._finish([])
        if self._state == "corrections":
            request = self._pending[3] if self._pending else None
            return self._finish(request.split_corrections(frame) if request else [])
        # a header
        if frame.dtype == np.int64 and frame.shape == (1,):
            self._error_code, self._state = int(frame[0]), "error"
            return None
        words = [int(w) for w in frame.reshape(-1)] if frame.dtype == U64 else []
        if len(words) == 2 and words[0] == REPLY and words[1] in self._outstanding:
            self._pending = ("reply", words[1], 0, self._outstanding[words[1]])
            self._state = "seed"
            return None
        if len(words) == 3 and words[0] == MATERIAL and words[1] in self._plans:
            plan = self._plans[words[1]]
            if plan.first <= words[2] < plan.end:
                request = plan.requests[words[2] - plan.first]
                self._pending = ("material", words[2], words[1], request)
                self._state = "seed"
                return None
        if len(words) == 3 and words[0] == END and words[1] in self._plans:
            plan = self._plans[words[1]]
            plan.ended = True
            return _Item("end", words[2], words[1]), 0
        raise MalformedFrameError(
            f"the dealer sent an unexpected frame {frame.dtype} {frame.shape} "
            f"{words[:4] if words else ''}; is this address a fedunlearn dealer?"
        )

    def _finish(self, corrections: list[np.ndarray]) -> tuple[_Item, int] | None:
        kind, index, plan_id, request = self._pending  # type: ignore[misc]
        self._pending, self._state = None, "header"
        received = SEED_BYTES + sum(c.nbytes for c in corrections)
        if kind == "material":
            plan = self._plans[plan_id]
            plan.received += 1
            if plan.abandoned:  # given up: nothing will use it
                return None
        shares = expand(request, self.party_id, self._seed, corrections)  # type: ignore[arg-type]
        size = sum(s.nbytes for s in shares)
        return _Item(kind, index, plan_id, shares, received), size

    # ---- consumer side -------------------------------------------------------------------

    def _send(self, array: np.ndarray, what: str) -> None:
        if self._closed:
            raise PeerDisconnectedError("this dealer client is closed; cannot make requests")
        try:
            self._channel.send(array)
        except PeerDisconnectedError as exc:
            raise PeerDisconnectedError(f"lost the dealer during {what}: {exc}") from exc

    def _take(self, what: str) -> _Item:
        try:
            return self._channel.receive(self.timeout_seconds)
        except PeerDisconnectedError as exc:
            self.close()
            raise PeerDisconnectedError(f"lost the dealer during {what}: {exc}") from exc
        except FedUnlearnError:
            self.close()
            raise

    def plan(self, requests: Sequence[Request]) -> None:
        """Declare the next requests so the dealer streams their material ahead of use.

        Both parties must call this with the same list at the same point. A plan that is still
        running is given up first.

        Raises:
            ConfigError: More than ``MAX_PLAN_REQUESTS`` requests.
        """
        requests = tuple(requests)
        if len(requests) > MAX_PLAN_REQUESTS:
            raise ConfigError(
                f"a plan holds at most {MAX_PLAN_REQUESTS} requests; got {len(requests)}. "
                "Split it and declare the next part when this one is used up."
            )
        if not requests:
            return
        self._give_up(self.requests)
        plan = _Plan(self._next_plan_id, self.requests, requests)
        self._next_plan_id += 1
        self._plans[plan.plan_id] = plan  # before the dealer can answer
        self._send(encode_plan(plan.plan_id, plan.first, requests), f"plan {plan.plan_id}")
        self._active = plan

    def wait_prefetched(self, timeout_seconds: float | None = None) -> bool:
        """Wait until the active plan's material has arrived (or the prefetch buffer is full).

        Returns:
            True if all of it arrived, False if the buffer filled first or there is no plan.

        Raises:
            PeerDisconnectedError: Nothing arrived for ``timeout_seconds`` (default: the
                client's timeout), or the dealer is gone.
        """
        plan = self._active
        if plan is None:
            return False
        limit = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        last, progress_at = -1, time.monotonic()
        while plan.received < len(plan.requests) and not plan.ended:
            if self._channel.failed is not None:
                raise PeerDisconnectedError(
                    f"lost the dealer while prefetching: {self._channel.failed}"
                )
            if self._channel.buffered_bytes() >= self._channel.max_buffered_bytes:
                return False
            if plan.received != last:
                last, progress_at = plan.received, time.monotonic()
            elif time.monotonic() - progress_at > limit:
                raise PeerDisconnectedError(
                    f"the dealer streamed nothing for {limit:g} s ({plan.received} of "
                    f"{len(plan.requests)} planned requests arrived)"
                )
            time.sleep(0.002)
        return plan.received == len(plan.requests)

    def _give_up(self, index: int) -> None:
        """Leave the active plan at ``index`` (tell the dealer if part of it is still unused)."""
        plan, self._active = self._active, None
        if plan is None or plan.abandoned:
            return
        plan.abandoned = True  # its leftover material is dropped on arrival
        if index < plan.end:  # the dealer counts the plan as used: tell it where we left it
            self._send(np.array([ABANDON, plan.plan_id, index], dtype=np.uint64), "abandon")

    def _obtain(self, index: int, request: Request) -> tuple[tuple[np.ndarray, ...], int]:
        what = f"request #{index} ({request})"
        plan = self._active
        if plan is not None:
            planned = (
                plan.first <= index < plan.end and plan.requests[index - plan.first] == request
            )
            if planned:  # its material, or the plan's end, is in the queue or on its way
                while True:
                    item = self._take(what)
                    if item.kind == "material" and item.plan_id == plan.plan_id:
                        if item.index != index:
                            raise MalformedFrameError(
                                f"the dealer streamed #{item.index} where #{index} was due"
                            )
                        return item.shares, item.received
                    if item.kind == "end" and item.plan_id == plan.plan_id:
                        break  # the dealer stopped the plan early: on demand from here
                    # anything else belongs to an earlier plan: drop it
            self._give_up(index)
        self._outstanding[index] = request
        self._send(encode_request(index, request), what)
        while True:
            item = self._take(what)
            if item.kind == "reply" and item.index == index:
                del self._outstanding[index]
                return item.shares, item.received
            # streamed material or the end of a plan given up: drop it

    def _fetch(self, index: int, request: Request) -> tuple[bytes, list[np.ndarray]]:
        raise NotImplementedError("RemoteDealer serves material through _obtain")

    def close(self, goodbye: bool = True) -> None:
        """Say goodbye to the dealer and close the connection (idempotent).

        Args:
            goodbye: False after a failure: hang up without the goodbye, so the dealer ends
                its session with an error (a lost party) instead of as a finished one.
        """
        if self._closed:
            return
        self._closed = True
        if not goodbye:
            self._channel.close()
            return
        try:
            self._channel.send(np.array([BYE, self.requests], dtype=np.uint64))
        except FedUnlearnError:
            pass  # the link already failed; its error was (or will be) reported by a request
        # the goodbye is written first; then read until the dealer hangs up (in the background)
        # so that unread streamed material cannot reset the link before the goodbye is read
        self._channel.close(flush_seconds=2.0, background=True)
