"""The dealer: a trusted third party that hands out correlated randomness (offline phase).

Every request (kind and shapes, e.g. an elementwise Beaver triple of shape (n,)) is number k in
a sequence both parties follow. The dealer derives two 16-byte seeds s0, s1 for it from its
master secret. Party 0 expands all its shares from s0 with AES-CTR and receives nothing else.
Party 1 expands its *random* shares from s1 and receives one correction share for each *derived*
value (e.g. c_1 = a*b - c_0 for a Beaver triple), computed by the dealer from both expansions.
Offline bytes charged: 16 per request to party 0; 16 plus the correction's bytes to party 1.
The split is ``deal`` (the dealer's side: seeds to corrections) and ``expand`` (a party's side:
its seed and corrections to its shares); both dealers below use the same two functions.

Two ``DealerClient``s give a party its material:

- ``Dealer`` (this module) is the **test/simulation dealer**: each party holds one built from
  the same master seed, and party 1's object computes the dealer's side of every request in its
  own process. Both parties are then in one trust domain: party 1 could derive party 0's seeds,
  so it is not secure. Use it for tests, ``run_two_party`` and cost sweeps.
- ``fedunlearn.mpc.remote_dealer.RemoteDealer`` asks a ``DealerServer`` running as its own
  process (the dealer is a third party: MPC2 in docs/mpc.md). Each party then sees only its own
  seeds and, for party 1, corrections. The shares equal those of the simulated dealer with the
  same master seed, and the offline counters are identical.

ZeroGen is the one request whose seed both parties receive (party 0 uses r, party 1 uses -r from
the same stream, paper App. B-B item 1); no other seed ever reaches the other party.

Paper: Liu et al., Starfish, Alg. 4 line 12 and Sec. V-B (the offline phase), Table IV and
App. B-B (SecMul, SecSP, ZeroGen, SecRanGen, SecRanGenInv); Beaver (CRYPTO 1991) for the triples;
boolean triples and random bits serve SecGE (MPC3 in docs/mpc.md). A dealer instead of ABY's
offline phase: MPC2 in docs/mpc.md, SF24 in docs/methods/starfish.md.
Deviations: [REC] SecRanGenInv (App. B-B item 3) is replaced by a dealer-made invertible mask
(i.i.d. N(0, 1) entries clipped to |g| <= 4, redrawn until cond <= 100 m and smallest singular
value >= 1 / (2 sqrt(m)), times 2^s with s uniform in [0, 2k] per matrix); the masking is
heuristic over fixed-point reals (MPC8 in docs/mpc.md; leakage in docs/security.md). The mask's
randomness comes from a third, dealer-only seed (party 1 receives only its correction).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedunlearn.mpc.fixed_point import FixedPoint
from fedunlearn.mpc.prg import SEED_BYTES, Prg, derive_seed
from fedunlearn.mpc.transport import Counters

__all__ = [
    "KINDS",
    "MASK_ENTRY_BOUND",
    "MAX_ELEMENTS",
    "Dealer",
    "DealerClient",
    "Request",
    "deal",
    "expand",
    "master_seed",
    "request_seeds",
]

U64 = NDArray[np.uint64]
Shape = tuple[int, ...]
MASK_ENTRY_BOUND = 4.0  # |N(0,1)| entries of an invertible mask are clipped here
MASK_MIN_SINGULAR = 0.5  # a mask's sigma_min before its scale, times 1 / sqrt(m)
_MAX_NDIM = 8
MAX_ELEMENTS = 1 << 40  # per dimension and per shape: numpy must be able to hold the shape


@dataclass(frozen=True)
class _Kind:
    """How one kind of request is laid out: what is random, what is derived, how it is shared."""

    random: Callable[[tuple[Shape, ...]], list[Shape]]  # shapes each party expands from its seed
    derived: Callable[[tuple[Shape, ...]], list[Shape]]  # shapes of party 1's corrections
    derive: Callable[..., list[U64]] | None  # plain derived values from the plain random ones
    order: tuple[int, ...]  # output: indices into random + derived
    xor_random: bool = False  # random values are XOR-shared (else additive)
    xor_derived: bool = False  # derived values are XOR-shared (else additive)
    shapes: int = 1  # number of shapes in the request


def _matmul_shape(shapes: tuple[Shape, ...]) -> list[Shape]:
    """Shape of a @ b for operand shapes (numpy matmul rules), without allocating anything."""
    a, b = shapes
    if not a or not b:
        raise ValueError("matmul operands need at least one axis")
    a2, b2 = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dimensions differ: {a} @ {b}")
    out = (*np.broadcast_shapes(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(b) == 1:
        out = out[:-1]
    if len(a) == 1:
        out = out[:-2] + out[-1:] if len(b) > 1 else out[:-1]
    return [tuple(int(d) for d in out)]


_KINDS: dict[str, _Kind] = {
    "triple": _Kind(lambda s: [s[0], s[0]], lambda s: [s[0]], lambda a, b: [a * b], (0, 1, 2)),
    "matrix": _Kind(lambda s: list(s), _matmul_shape, lambda a, b: [a @ b], (0, 1, 2), shapes=2),
    "inner": _Kind(
        lambda s: [s[0], s[0]],
        lambda s: [s[0][:-1]],
        lambda a, b: [np.sum(a * b, axis=-1)],
        (0, 1, 2),
    ),
    "square": _Kind(lambda s: [s[0]], lambda s: [s[0]], lambda a: [a * a], (0, 1)),
    "and": _Kind(
        lambda s: [s[0], s[0]],
        lambda s: [s[0]],
        lambda a, b: [a & b],
        (0, 1, 2),
        xor_random=True,
        xor_derived=True,
    ),
    "and2": _Kind(
        lambda s: [s[0]] * 3,
        lambda s: [s[0]] * 2,
        lambda a, b1, b2: [a & b1, a & b2],
        (0, 1, 3, 2, 4),
        xor_random=True,
        xor_derived=True,
    ),
    "bits": _Kind(lambda s: [s[0]], lambda s: [s[0]], lambda r: [r], (0, 1), xor_random=True),
    "zero": _Kind(lambda s: [s[0]], lambda s: [], None, (0,)),
    "random": _Kind(lambda s: [s[0]], lambda s: [], None, (0,)),
    "mask": _Kind(lambda s: [], lambda s: [s[0]], None, (0,)),
}
KINDS = tuple(_KINDS)  # request kinds, in wire order


@dataclass(frozen=True)
class Request:
    """One request for correlated randomness: a kind and its shapes (both parties must agree).

    Args:
        kind: One of ``KINDS``: ``triple``, ``matrix``, ``inner``, ``square`` (arithmetic
            Beaver material), ``and``, ``and2`` (boolean triples), ``bits`` (random bits in
            both sharings), ``zero`` (ZeroGen), ``random`` (SecRanGen), ``mask`` (SecMI mask).
        shapes: One shape, or two (left and right operand) for ``matrix``.
        frac_bits: Fixed-point scale of an invertible mask; 0 for every other kind.

    Raises:
        ValueError: If the kind is unknown or the shapes do not fit it.
    """

    kind: str
    shapes: tuple[Shape, ...]
    frac_bits: int = 0

    def __post_init__(self) -> None:
        spec = _KINDS.get(self.kind)
        if spec is None:
            raise ValueError(f"unknown dealer request kind {self.kind!r}; allowed: {KINDS}")
        shapes = tuple(tuple(int(d) for d in s) for s in self.shapes)
        object.__setattr__(self, "shapes", shapes)
        if len(shapes) != spec.shapes:
            raise ValueError(f"a {self.kind!r} request takes {spec.shapes} shape(s); got {shapes}")
        if any(len(s) > _MAX_NDIM or min(s, default=0) < 0 for s in shapes):
            raise ValueError(f"shapes must have <= {_MAX_NDIM} non-negative dims; got {shapes}")
        if any(max(s, default=0) > MAX_ELEMENTS or math.prod(s) > MAX_ELEMENTS for s in shapes):
            raise ValueError(
                f"shapes must have at most 2^40 elements, in all and per dimension; got {shapes}"
            )
        if self.kind == "inner" and not shapes[0]:
            raise ValueError("an 'inner' request needs at least one axis; got shape ()")
        if self.kind == "mask" and (
            len(shapes[0]) < 2 or shapes[0][-1] != shapes[0][-2] or shapes[0][-1] < 1
        ):
            raise ValueError(
                f"a 'mask' request needs square matrices (..., m, m) with m >= 1; got {shapes}"
            )
        if self.kind != "mask" and self.frac_bits != 0:
            raise ValueError(f"only 'mask' requests carry frac_bits; got {self.frac_bits}")
        if self.kind == "matrix":
            try:
                _matmul_shape(shapes)
            except ValueError:
                raise ValueError(f"matrix shapes {shapes} cannot be multiplied") from None

    def __str__(self) -> str:
        scale = f", frac_bits={self.frac_bits}" if self.kind == "mask" else ""
        return f"{self.kind} {', '.join(map(str, self.shapes))}{scale}"

    @property
    def random_shapes(self) -> list[Shape]:
        """Shapes party 1 expands from its own seed."""
        return _KINDS[self.kind].random(self.shapes)

    @property
    def correction_shapes(self) -> list[Shape]:
        """Shapes of the correction shares party 1 receives (in order)."""
        return _KINDS[self.kind].derived(self.shapes)

    @property
    def correction_words(self) -> int:
        """Total number of uint64 words of party 1's corrections."""
        return sum(math.prod(s) for s in self.correction_shapes)

    def split_corrections(self, words: U64) -> list[U64]:
        """Cut party 1's corrections, sent as one flat word array, into their shapes."""
        return _split(words, self.correction_shapes)


def master_seed(seed: int | bytes) -> bytes:
    """Turn a dealer seed (int, or bytes used as is) into the master secret seeds derive from."""
    return seed if isinstance(seed, bytes) else derive_seed(b"dealer", int(seed))


def request_seeds(
    master: bytes, index: int, request: Request, epoch: int = 0
) -> tuple[bytes, bytes, bytes]:
    """Seeds of request ``index``: party 0's, party 1's, and the dealer's own (never sent).

    For ZeroGen both parties must expand the same stream, so party 1's seed is party 0's.
    ``epoch`` counts abandoned plans (``dealer_wire``): material streamed for a plan that
    was given up is never derived again, even where a later request has the same index.
    """
    label: tuple[Any, ...] = (index, request.kind, request.shapes, request.frac_bits)
    if epoch:
        label = (*label, ("epoch", epoch))
    s0 = derive_seed(master, *label, 0)
    s1 = s0 if request.kind == "zero" else derive_seed(master, *label, 1)
    return s0, s1, derive_seed(master, *label, "dealer")


def _split(words: U64, shapes: Sequence[Shape]) -> list[U64]:
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(words[start : start + n].reshape(shape))
        start += n
    return out


def _draw(seed: bytes, shapes: Sequence[Shape]) -> list[U64]:
    return _split(Prg(seed).words(sum(math.prod(s) for s in shapes)), shapes)


def _own_random(
    request: Request, seed: bytes, with_derived: bool = True
) -> tuple[list[U64], list[U64]]:
    """A party's (random shares, derived shares) from its seed; party 1 expands only the first."""
    random_shapes = request.random_shapes
    own = _draw(seed, random_shapes + (request.correction_shapes if with_derived else []))
    random, derived = own[: len(random_shapes)], own[len(random_shapes) :]
    if request.kind == "bits":
        random = [r & np.uint64(1) for r in random]
    return random, derived


def _mask(shape: Shape, seed: bytes, mask_scale_bits: int) -> NDArray[np.float64]:
    """The dealer's random well-conditioned matrices R, from its own seed.

    R never shrinks X: its smallest singular value is at least ``MASK_MIN_SINGULAR / sqrt(m)``
    before the scale 2^s, s in [0, 2k]. The opened N = X R carries an absolute rounding error
    of about 2^-f, so its relative error is 2^-f / sigma_min(X R); a mask near 0 (a scalar
    mask |g| ~ 0.01, or 2^-k) made the 1 x 1 SecMI of the two-loop estimator lose up to 60 %
    of rho = 1 / s^T y (a 1 x 1 matrix always has condition number 1, so no retry caught it).
    """
    m = shape[-1]
    rng = np.random.default_rng(np.frombuffer(seed, dtype=np.uint32))
    mask = np.empty(shape)
    floor = MASK_MIN_SINGULAR / math.sqrt(m)
    for idx in np.ndindex(*shape[:-2]):
        while True:
            r = np.clip(rng.standard_normal((m, m)), -MASK_ENTRY_BOUND, MASK_ENTRY_BOUND)
            singular = np.linalg.svd(r, compute_uv=False)
            if singular[-1] >= floor and singular[0] <= 100 * m * singular[-1]:
                break
        mask[idx] = r * 2.0 ** rng.integers(0, 2 * mask_scale_bits + 1)
    return mask


def deal(
    request: Request, seed0: bytes, seed1: bytes, private_seed: bytes, mask_scale_bits: int = 2
) -> list[U64]:
    """The dealer's side of a request: party 1's correction shares (empty if it needs none).

    Args:
        request: What both parties asked for.
        seed0: Party 0's seed (from ``request_seeds``).
        seed1: Party 1's seed.
        private_seed: The dealer's own seed (randomness neither party may see, e.g. a mask).
        mask_scale_bits: k of an invertible mask (entries scaled by 2^s, s ~ U{0..2k}).

    Returns:
        One array per shape of ``request.correction_shapes``.
    """
    spec = _KINDS[request.kind]
    if request.kind == "mask":
        fixed_point = FixedPoint(frac_bits=request.frac_bits)
        mask = _mask(request.shapes[0], private_seed, mask_scale_bits)
        return [fixed_point.encode(mask) - _draw(seed0, request.shapes)[0]]
    if spec.derive is None:
        return []
    random0, derived0 = _own_random(request, seed0)
    random1, _ = _own_random(request, seed1, with_derived=False)
    if spec.xor_random:
        plain = [r0 ^ r1 for r0, r1 in zip(random0, random1, strict=True)]
    else:
        plain = [r0 + r1 for r0, r1 in zip(random0, random1, strict=True)]
    derived = spec.derive(*plain)
    if spec.xor_derived:
        return [d ^ d0 for d, d0 in zip(derived, derived0, strict=True)]
    return [d - d0 for d, d0 in zip(derived, derived0, strict=True)]


def expand(
    request: Request, party_id: int, seed: bytes, corrections: Sequence[U64] = ()
) -> tuple[U64, ...]:
    """A party's side of a request: its shares from its seed (and, for party 1, corrections).

    Args:
        request: What was asked for.
        party_id: 0 or 1.
        seed: This party's 16-byte seed.
        corrections: Party 1's correction shares from ``deal``; empty for party 0.

    Returns:
        The party's shares in the order the ``DealerClient`` method returns them.
    """
    spec = _KINDS[request.kind]
    if request.kind == "zero":
        r = Prg(seed).ring(request.shapes[0])
        return (r if party_id == 0 else np.uint64(0) - r,)
    if party_id == 0:
        random, derived = _own_random(request, seed)
    else:
        random = _own_random(request, seed, with_derived=False)[0]
        derived = list(corrections)
    parts = random + derived
    return tuple(parts[i] for i in spec.order)


class DealerClient(ABC):
    """A party's source of correlated randomness; protocols call only these methods.

    Subclasses say how a party obtains its seed and corrections for a ``Request``
    (``_fetch``); expansion, byte counting and timing are shared.

    Args:
        party_id: 0 or 1.
        counters: Where offline bytes are charged (``Party`` points this at its transport's).
        mask_scale_bits: k for invertible masks: each mask is scaled by 2^s, s ~ U{0..2k}.

    Attributes:
        requests: Requests made so far (the sequence number of the next one).
        wall_seconds: Time spent obtaining and expanding material (the offline part of a run).

    A run's requests can be recorded (``recording``) and declared ahead as a plan (``plan``):
    a dealer that supports it (``RemoteDealer``) then streams the material before it is
    needed, which moves the dealer's work and the transfer into a true offline phase.
    """

    def __init__(
        self, party_id: int, counters: Counters | None = None, mask_scale_bits: int = 2
    ) -> None:
        if party_id not in (0, 1):
            raise ValueError(f"party_id must be 0 or 1; got {party_id!r}")
        self.party_id = party_id
        self.counters = counters if counters is not None else Counters()
        self.mask_scale_bits = int(mask_scale_bits)
        self.requests = 0
        self.wall_seconds = 0.0
        self._logs: list[list[Request]] = []

    @abstractmethod
    def _fetch(self, index: int, request: Request) -> tuple[bytes, list[U64]]:
        """Return this party's seed and corrections (party 1 only) for request ``index``."""

    def _obtain(self, index: int, request: Request) -> tuple[tuple[U64, ...], int]:
        """This party's shares for request ``index`` and the bytes received for them."""
        seed, corrections = self._fetch(index, request)
        received = SEED_BYTES + sum(c.nbytes for c in corrections)
        return expand(request, self.party_id, seed, corrections), received

    def _material(self, request: Request, charged: bool = True) -> tuple[U64, ...]:
        start = time.perf_counter()
        index, self.requests = self.requests, self.requests + 1
        for log in self._logs:
            log.append(request)
        out, received = self._obtain(index, request)
        if charged:
            self.counters.charge(received=received, messages=1, phase="offline")
        self.wall_seconds += time.perf_counter() - start
        return out

    @contextmanager
    def recording(self) -> Iterator[list[Request]]:
        """Collect the requests made inside the block (e.g. one round's, to plan the next)."""
        log: list[Request] = []
        self._logs.append(log)
        try:
            yield log
        finally:
            self._logs.remove(log)

    def plan(self, requests: Sequence[Request]) -> None:  # noqa: B027 (optional hook)
        """Declare the next requests, in order, so the dealer can stream them ahead of use.

        Both parties must declare the same plan at the same point (a ``RemoteDealer`` checks
        this at the dealer). Requests that follow the plan are then served from material that
        already arrived; the first request that deviates gives the rest of the plan up and
        continues on demand. The simulated ``Dealer`` computes on demand anyway, so this is a
        no-op there.
        """

    def close(self) -> None:  # noqa: B027 (optional hook: only a remote dealer holds a resource)
        """Release the connection to the dealer, if any (the simulated dealer holds none)."""

    def triple(self, shape: tuple[int, ...]) -> tuple[U64, U64, U64]:
        """Elementwise Beaver triple: shares of a, b and c = a * b."""
        a, b, c = self._material(Request("triple", (shape,)))
        return a, b, c

    def matrix_triple(
        self, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
    ) -> tuple[U64, U64, U64]:
        """Matrix triple for X @ Y: shares of A, B and C = A @ B (broadcast over leading axes)."""
        a, b, c = self._material(Request("matrix", (a_shape, b_shape)))
        return a, b, c

    def inner_triple(self, shape: tuple[int, ...]) -> tuple[U64, U64, U64]:
        """Vector triple for inner products over the last axis: a, b and c = sum(a * b, -1)."""
        a, b, c = self._material(Request("inner", (shape,)))
        return a, b, c

    def square_pair(self, shape: tuple[int, ...]) -> tuple[U64, U64]:
        """Square pair: shares of a and c = a * a."""
        a, c = self._material(Request("square", (shape,)))
        return a, c

    def and_triple(self, shape: tuple[int, ...]) -> tuple[U64, U64, U64]:
        """Boolean triple on 64-bit words, XOR-shared: a, b and c = a AND b."""
        a, b, c = self._material(Request("and", (shape,)))
        return a, b, c

    def and_triple_shared(self, shape: tuple[int, ...]) -> tuple[U64, U64, U64, U64, U64]:
        """Two boolean triples with a common left mask: a, b1, c1 = a AND b1, b2, c2 = a AND b2.

        Used for x AND y1 together with x AND y2: x XOR a is opened once for both products.
        """
        a, b1, c1, b2, c2 = self._material(Request("and2", (shape,)))
        return a, b1, c1, b2, c2

    def random_bits(self, shape: tuple[int, ...]) -> tuple[U64, U64]:
        """A random bit r shared twice: XOR shares (words 0/1) and additive shares (integer r)."""
        bits, arith = self._material(Request("bits", (shape,)))
        return bits, arith

    def zero(self, shape: tuple[int, ...], charged: bool = True) -> U64:
        """ZeroGen: party 0 gets r, party 1 gets -r, from one seed both parties receive."""
        return self._material(Request("zero", (shape,)), charged)[0]

    def random(self, shape: tuple[int, ...]) -> U64:
        """SecRanGen: a share of a uniform ring element (each party expands its own seed)."""
        return self._material(Request("random", (shape,)))[0]

    def mask_bound(self) -> float:
        """Public bound on the magnitude of an invertible mask's entries."""
        return MASK_ENTRY_BOUND * 2.0 ** (2 * self.mask_scale_bits)

    def invertible_mask(self, shape: tuple[int, ...], fixed_point: FixedPoint) -> U64:
        """Shares of a random well-conditioned matrix R, shape (..., m, m), fixed-point encoded."""
        return self._material(Request("mask", (shape,), fixed_point.frac_bits))[0]


class Dealer(DealerClient):
    """The test/simulation dealer: a party computes the dealer's side itself from a shared seed.

    Both parties build one from the same master seed and make the same requests in the same
    order; party 1's object runs ``deal`` in its own process. Not secure (party 1 could derive
    party 0's seeds): for a deployment run a ``DealerServer`` and give each party a
    ``RemoteDealer`` (``fedunlearn.mpc.remote_dealer``).

    Args:
        seed: Master seed (int or bytes); both parties must use the same.
        party_id: 0 or 1.
        counters: Where offline bytes are charged (usually the party's transport counters).
        mask_scale_bits: k for invertible masks: each mask is scaled by 2^s, s ~ U{0..2k}.
    """

    def __init__(
        self,
        seed: int | bytes,
        party_id: int,
        counters: Counters | None = None,
        mask_scale_bits: int = 2,
    ) -> None:
        super().__init__(party_id, counters, mask_scale_bits)
        self._master = master_seed(seed)

    def _fetch(self, index: int, request: Request) -> tuple[bytes, list[U64]]:
        s0, s1, private = request_seeds(self._master, index, request)
        if self.party_id == 0:
            return s0, []
        return s1, deal(request, s0, s1, private, self.mask_scale_bits)
