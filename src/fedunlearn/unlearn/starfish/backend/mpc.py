"""``MpcBackend``: the Starfish backend protocol over ``fedunlearn.mpc`` for one of the two servers.

Each server runs the same Starfish loop (:mod:`fedunlearn.unlearn.starfish.unlearner`) on its own
``MpcBackend``; secrets are ``SharedTensor``s holding this server's uint64 shares, public
values stay plaintext torch tensors. The protocol's methods map onto the mpc API (Table IV):

- local: ``add``/``sub`` (share arithmetic), ``add_public``, ``mul_public`` and
  ``matmul_public`` (public operand encoded with as many fractional bits as its magnitude
  allows, so a unit direction of 582k entries keeps its precision; integer operands are exact),
  ``sum``, ``stack``, ``concat``, ``index``, ``transpose``, ``weighted_sum`` (SecAdd_A, one
  public matrix product);
- interactive: ``reveal`` (SecRec, logged in ``opened``), ``mul`` (SecMul; a square uses the
  cheaper square pair), ``matmul``, ``dot`` (SecSP), ``ge`` (``mpc.sec_ge``, the MSB-only
  carry tree: ~40 bytes per comparison), ``select`` (SecSel), ``max`` (tournament),
  ``kth_largest`` and ``top_k`` (bitonic SecSrt with the round index as payload; only the first
  k positions are opened), ``div``/``sqrt`` (Newton with a public range hint), ``inverse``
  (SecMI; an ill-conditioned opened mask raises ``SingularMatrixError``).

``share`` is a client's SecShare: with a ``client_seed`` both servers draw the client's mask r
from one stream (server 0 keeps r, server 1 keeps v - r), which is how the in-process
simulation lets a simulated client hand each server its share without a third thread. Without
one (two-process deployment) ``share`` only turns *public* constants into shares (server 0 holds
the value, server 1 zero); client values arrive as stored Stage I shares or from the client
gateway.

Costs: ``phase(name)`` books the party's transport counters and the seconds spent to TD, RS,
UE, TC, EXACT or AGG (``costs``): online bytes sent/received, rounds, messages, offline bytes
(dealer material), wall seconds and the part of them spent waiting for or expanding dealer
material (``offline_seconds``).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Tables IV-VI, Alg. 1-7, App. B (fixed point, 2PC building blocks).
Deviations (docs/methods/starfish.md): SF11 (Newton SecDiv and sqrt with public range hints,
``DEFAULT_RANGE`` = (1e-3, 1e3) when the caller gives none; exact squares; SecMI's
conditioning check), SF19 (sort padding: ratio u = -4, v = 1; value tau = -4; signed entries
w = 0 with square 16, below the loop's own sentinel cosine -2; ties come out in the bitonic
network's order), SF24 (the dealer).
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedunlearn.errors import SecureComputationError
from fedunlearn.mpc import (
    Party,
    Prg,
    SharedTensor,
    check_opened,
    concatenate,
    sec_check_range,
    sec_constant,
    sec_div,
    sec_ge,
    sec_ge2,
    sec_ge3,
    sec_ge4,
    sec_inner,
    sec_inverse,
    sec_matmul,
    sec_max,
    sec_mul,
    sec_select,
    sec_sort,
    sec_sqrt,
    sec_square,
    stack,
)
from fedunlearn.mpc.prg import derive_seed
from fedunlearn.unlearn.starfish.backend.protocol import (
    DEFAULT_RANGE,
    MAX_CONDITION,
    ORDER_FIELDS,
    BackendLog,
    Order,
    SingularMatrixError,
    check_order,
)
from fedunlearn.unlearn.starfish.backend.ranges import StepRanges

if TYPE_CHECKING:  # TypeIs narrows both branches (typing has it from Python 3.13)
    from typing_extensions import TypeIs

__all__ = ["DEFAULT_RANGE", "OFFLINE_PHASE", "PHASES", "MpcBackend", "TimedDealer"]

PHASES = ("TD", "RS", "UE", "TC", "EXACT", "AGG")
OFFLINE_PHASE = "OFFLINE"  # streamed rounds: waiting for the planned material before the round
MAX_PUBLIC_BITS = 40
SMALL_PUBLIC_NUMEL = 4096  # larger public operands are encoded as reals without an integer check
SECMI_MAX_CONDITION = min(MAX_CONDITION, 1e8)  # cond(N = X R) limit before a pair is dropped
# padding of the bitonic network per order (fields as in ORDER_FIELDS), in real units
_PADDING: dict[str, tuple[float, ...]] = {
    "ratio": (-4.0, 1.0),
    "value": (-4.0,),
    "signed_ratio": (0.0, 16.0, 1.0),
    "signed_value": (0.0, 16.0),
}


#: the dealer calls a ``TimedDealer`` forwards with their seconds counted (``mpc.dealer``:
#: Beaver, matrix and inner-product triples, square pairs, boolean triples, random bits,
#: ZeroGen, SecRanGen and invertible masks)
TIMED_CALLS = frozenset(
    {
        "triple",
        "matrix_triple",
        "inner_triple",
        "square_pair",
        "and_triple",
        "and_triple_shared",
        "random_bits",
        "zero",
        "random",
        "invertible_mask",
    }
)


class TimedDealer:
    """A party's dealer with the seconds spent in it counted (the offline share of wall time).

    Forwards the dealer methods the mpc protocols call: those of ``TIMED_CALLS`` timed, and
    ``counters``, ``party_id`` and ``mask_bound``; any object with them works (the in-process
    ``Dealer``, or a remote dealer client).

    Args:
        inner: The dealer to forward to.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    @property
    def counters(self) -> Any:
        """The counters offline bytes are charged to."""
        return self.inner.counters

    @property
    def party_id(self) -> int:
        """0 or 1."""
        return int(self.inner.party_id)

    def mask_bound(self) -> float:
        """Public bound on an invertible mask's entries."""
        return float(self.inner.mask_bound())

    def __getattr__(self, name: str) -> Any:
        """The dealer call ``name`` of ``TIMED_CALLS``, forwarded with its seconds counted."""
        if name not in TIMED_CALLS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self._timed():
                return getattr(self.inner, name)(*args, **kwargs)

        return timed


def _is_secret(x: Any) -> TypeIs[SharedTensor]:
    return isinstance(x, SharedTensor)


def _public_array(p: torch.Tensor | float | np.ndarray) -> np.ndarray:
    if isinstance(p, torch.Tensor):
        return p.detach().cpu().to(torch.float64).numpy()
    return np.asarray(p, dtype=np.float64)


class MpcBackend(BackendLog):
    """``StarfishBackend`` over ``fedunlearn.mpc`` for one party (server S1 = 0 or S2 = 1).

    Args:
        party: This server's ``Party`` (transport to the other server, dealer, fixed point).
        client_seed: Seed of the simulated clients' SecShare masks, the same on both servers
            (in-process simulation); None: ``share`` accepts public constants only.
        default_range: Range hint for ``div``/``sqrt`` when the caller gives none.
        max_aggregate_norm: Public bound on an opened aggregate's norm (``reveal``).
        norm_range: The run's declared bounds on update norms (``ranges``); None: the ring
            range only.
        stream_rounds: Plan each round from the last of its kind (``round_scope``).

    Attributes:
        opened: Every opening, in order (``OpenedValue``).
        op_counts: Phase -> op -> ``{"calls", "elements", "comparisons"}``.
        costs: Phase -> ``{"bytes_sent", "bytes_received", "rounds", "messages",
            "offline_bytes", "seconds", "offline_seconds", "cpu_seconds"}`` of this party
            (``cpu_seconds``: the process's CPU time, a load-independent measure when the
            server is its own process).
        client_bytes: Bytes of client shares this server received through ``share``.
        ranges: The declared ring range of every step (``backend/ranges.py``); ``share``
            checks client values against it before encoding.
    """

    def __init__(
        self,
        party: Party,
        client_seed: int | bytes | None = None,
        default_range: tuple[float, float] = DEFAULT_RANGE,
        *,
        max_aggregate_norm: float | None = None,
        norm_range: tuple[float, float] | None = None,
        stream_rounds: bool = False,
    ) -> None:
        self.party = party
        self.ranges: StepRanges | None = StepRanges(party.fixed_point.frac_bits, norm_range)
        if not isinstance(party.dealer, TimedDealer):
            party.dealer = TimedDealer(party.dealer)  # type: ignore[assignment]
        self._dealer: TimedDealer = party.dealer  # type: ignore[assignment]
        self.fixed_point = party.fixed_point
        self.default_range = default_range
        self.max_aggregate_norm = max_aggregate_norm
        self._client_prg = (
            None if client_seed is None else Prg(derive_seed(b"starfish-client", client_seed))
        )
        super().__init__()
        self.costs: dict[str, dict[str, float]] = {}
        self.client_bytes = 0
        self.round_costs: list[dict[str, Any]] = []
        inner = self._dealer.inner
        self._streaming = stream_rounds and hasattr(inner, "wait_prefetched")
        self._plans: dict[Hashable, list[Any]] = {}
        self._mark = self._now()

    # ---- bookkeeping -----------------------------------------------------------------------

    def _now(self) -> tuple[dict[str, dict[str, int]], float, float, float]:
        counters = self.party.counters.snapshot()
        return counters, time.perf_counter(), self._dealer.seconds, time.process_time()

    def _flush(self) -> None:
        """Book traffic and time since the last mark to the current phase."""
        (before, t0, d0, c0), (after, t1, d1, c1) = self._mark, self._now()
        self._mark = (after, t1, d1, c1)
        book = self.costs.setdefault(
            self._phase,
            dict.fromkeys(
                (
                    "bytes_sent",
                    "bytes_received",
                    "rounds",
                    "messages",
                    "offline_bytes",
                    "seconds",
                    "offline_seconds",
                    "cpu_seconds",
                ),
                0,
            ),
        )
        for key in ("bytes_sent", "bytes_received", "rounds", "messages"):
            book[key] += after["online"][key] - before["online"][key]
        book["offline_bytes"] += sum(
            after["offline"][k] - before["offline"][k] for k in ("bytes_sent", "bytes_received")
        )
        book["seconds"] += t1 - t0
        book["offline_seconds"] += d1 - d0
        book["cpu_seconds"] += c1 - c0  # this process's CPU (both threads in-process)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Book the work run inside the block (traffic, seconds) to phase ``name``."""
        self._flush()
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._flush()
            self._phase = before

    def cost_summary(self) -> dict[str, dict[str, float]]:
        """Return the per-phase costs so far (JSON-ready), setup included."""
        self._flush()
        return {phase: dict(book) for phase, book in self.costs.items()}

    @contextmanager
    def round_scope(self, kind: Hashable) -> Iterator[None]:
        """One replayed round: its costs per phase, and with a streaming dealer its plan.

        With ``stream_rounds`` and a dealer that streams (``mpc.RemoteDealer``), the requests
        of the last round of the same public ``kind`` are declared as this round's plan and
        their material is awaited before the round starts (phase ``OFFLINE``: the dealer
        derives and streams it, this server expands it); the round then runs on material at
        hand. A request that deviates from the plan falls back to on-demand material (fresh,
        never reused). Both servers run the same loop, so they plan at the same point.
        Appends ``{"kind", "streamed", "complete", "requests", "phases"}`` to
        ``round_costs``.
        """
        before = self.cost_summary()
        dealer = self._dealer.inner
        plan = self._plans.get(kind) if self._streaming else None
        complete = None
        if plan:
            with self.phase(OFFLINE_PHASE):
                dealer.plan(plan)
                complete = bool(dealer.wait_prefetched())
        with dealer.recording() as requests:
            yield
        if self._streaming:
            self._plans[kind] = list(requests)
        after = self.cost_summary()
        phases = {
            name: {key: book[key] - before.get(name, {}).get(key, 0) for key in book}
            for name, book in after.items()
            if any(book[key] != before.get(name, {}).get(key, 0) for key in book)
        }
        self.round_costs.append(
            {
                "kind": repr(kind),
                "streamed": plan is not None and bool(plan),
                "complete": complete,
                "requests": len(requests),
                "phases": phases,
            }
        )

    def _public_bits(self, values: np.ndarray) -> int:
        """Fractional bits for a public operand: enough that its largest entry keeps f bits."""
        f = self.fixed_point.frac_bits
        peak = float(np.max(np.abs(values))) if values.size else 0.0
        if peak == 0.0 or not math.isfinite(peak):
            return f
        return int(np.clip(f - math.floor(math.log2(peak)), f, MAX_PUBLIC_BITS))

    @staticmethod
    def _integral(values: np.ndarray) -> bool:
        """Small integer-valued operands (masks, identity, -1) multiply exactly.

        Model-sized vectors are always treated as reals (the check would cost two passes).
        """
        if values.size > SMALL_PUBLIC_NUMEL:
            return False
        return bool(np.all(values == np.round(values)) and np.all(np.abs(values) < 2**31))

    def _constant(self, values: np.ndarray) -> SharedTensor:
        """A public constant as shares, re-randomised with a ZeroGen pair (``sec_constant``).

        The split (c, 0) would be valid but breaks local truncation for c < 0 (a wild value).
        """
        return sec_constant(self.party, values)

    # ---- sharing and opening -----------------------------------------------------------------

    def share(self, x: torch.Tensor) -> SharedTensor:
        """A client's SecShare of ``x`` (or a public constant's shares without a client seed).

        The simulated client checks its values against the steps' ring range first
        (``StepRanges.check_client_values``): out of range stops the run, nothing is shared.
        """
        values = _public_array(x)
        self._count("share", values.size)
        if self._client_prg is None:
            return self._constant(values)
        if self.ranges is not None:
            self.ranges.check_client_values(values)
        encoded = self.fixed_point.encode(values)
        mask = self._client_prg.ring(encoded.shape)  # the client's r, one stream for both servers
        self.client_bytes += encoded.nbytes
        return self.party.tensor(mask if self.party.party_id == 0 else encoded - mask)

    def reveal(self, x: SharedTensor, label: str) -> torch.Tensor:
        """SecRec: open ``x`` to both servers, check it, and log it.

        Every opened value is checked for the signature of a failed local truncation
        (``mpc.check_opened``); an ``aggregate`` also against ``max_aggregate_norm`` (a
        convex combination of updates cannot exceed the public bound on their norms), so a
        wild value stops the run with ``SecureComputationError`` instead of entering M_hat.
        """
        values = np.asarray(x.reveal(), dtype=np.float64)
        self._count("reveal", values.size)
        self._log_opening(label, tuple(values.shape), values)
        bound = self.max_aggregate_norm if label == "aggregate" else None
        what = f"the opened {label}" + (
            "" if bound is None else f" (bound: the largest update norm, norm_range[1] = {bound:g})"
        )
        check_opened(values, self.fixed_point, max_norm=bound, label=what)
        return torch.from_numpy(values.copy())

    # ---- local ops ---------------------------------------------------------------------------

    def add(self, a: SharedTensor, b: SharedTensor) -> SharedTensor:
        """Return a + b."""
        return a + b

    def sub(self, a: SharedTensor, b: SharedTensor) -> SharedTensor:
        """Return a - b."""
        return a - b

    def add_public(self, a: SharedTensor, p: torch.Tensor | float) -> SharedTensor:
        """Return a + p."""
        return a + _public_array(p)

    def mul_public(self, a: SharedTensor, p: torch.Tensor | float) -> SharedTensor:
        """Return a * p elementwise (integer p exact; real p with adaptive precision)."""
        values = _public_array(p)
        if self._integral(values):
            return a.mul_public(values.astype(np.int64))
        return a.mul_public(values, public_frac_bits=self._public_bits(values))

    def matmul_public(self, p: torch.Tensor, a: SharedTensor) -> SharedTensor:
        """Return p @ a for a public matrix or vector p (local)."""
        values = _public_array(p)
        if self._integral(values):
            return a.matmul_public(values.astype(np.int64), left=True)
        return a.matmul_public(values, left=True, public_frac_bits=self._public_bits(values))

    def sum(self, a: SharedTensor) -> SharedTensor:
        """Return the sum over the last axis."""
        return a.sum(axis=-1)

    def stack(self, xs: Sequence[SharedTensor], dim: int = 0) -> SharedTensor:
        """Stack along a new axis."""
        return stack(list(xs), axis=dim)

    def concat(self, xs: Sequence[SharedTensor], dim: int = 0) -> SharedTensor:
        """Concatenate along an existing axis."""
        return concatenate(list(xs), axis=dim)

    def index(self, a: SharedTensor, key: Any) -> SharedTensor:
        """Return a[key] (a copy)."""
        return a.party.tensor(np.array(a.share[key], dtype=np.uint64), a.frac_bits)

    def transpose(self, a: SharedTensor) -> SharedTensor:
        """Return a.T (2-D)."""
        return a.party.tensor(np.ascontiguousarray(a.share.T), a.frac_bits)

    def weighted_sum(self, xs: Sequence[SharedTensor], weights: torch.Tensor) -> SharedTensor:
        """Return sum_j w_j x_j with public weights (SecAdd_A, local)."""
        self._count("weighted_sum", sum(x.size for x in xs))
        return self.matmul_public(weights, stack(list(xs)))

    # ---- interactive ops -----------------------------------------------------------------------

    def mul(self, a: SharedTensor, b: SharedTensor) -> SharedTensor:
        """Return a * b elementwise (SecMul); a square (a is b) is exact, at scale 2f.

        Squares feed comparisons (SecTC's G^2 >= delta^2, TD's delta^2, SecRS^alt's u^2):
        keeping all 2f bits makes those comparisons exact for the f-bit inputs, where a
        truncated square of a small value (delta ~ 0.05 at f = 13) keeps only a few bits.
        """
        self._count("mul", a.size)
        if a is b:
            return self._exact_square(a)
        return sec_mul(a, b)

    @staticmethod
    def _exact_square(a: SharedTensor) -> SharedTensor:
        """x^2 with a dealer square pair (a, a^2), one round, not truncated (scale 2 f_x)."""
        party = a.party
        mask, mask_sq = party.dealer.square_pair((a.size,))
        mine = a.share.reshape(-1) - mask
        e = mine + party.transport.exchange(mine)
        z = mask_sq + ((e * mask) << np.uint64(1))  # (e + a)^2 = a^2 + 2 e a + e^2
        if party.party_id == 0:
            z += e * e
        return party.tensor(z.reshape(a.shape), 2 * a.frac_bits)

    def matmul(self, a: SharedTensor, b: SharedTensor) -> SharedTensor:
        """Return a @ b (matrix SecMul)."""
        self._count("matmul", a.size + b.size)
        return sec_matmul(a, b)

    def dot(self, a: SharedTensor, b: SharedTensor) -> SharedTensor:
        """Return the inner product along the last axis (SecSP; squares when a is b)."""
        self._count("dot", a.size)
        if a is b:
            return sec_square(a).sum(axis=-1)
        return sec_inner(a, b)

    def ge(self, a: SharedTensor, b: SharedTensor | torch.Tensor | float) -> SharedTensor:
        """Return bits [a >= b] (SecGE); b may be public."""
        other = b if _is_secret(b) else _public_array(b)
        out = sec_ge(a, other)
        self._count("ge", out.size, comparisons=out.size)
        return out

    def select(
        self, bit: SharedTensor, if_true: SharedTensor, if_false: SharedTensor
    ) -> SharedTensor:
        """Return bit ? if_true : if_false (SecSel)."""
        self._count("select", if_true.size)
        return sec_select(bit, if_true, if_false)

    def _ge_first(self, a: tuple[SharedTensor, ...], b: tuple[SharedTensor, ...]) -> SharedTensor:
        return sec_ge(a[0], b[0])

    def max(self, a: SharedTensor) -> SharedTensor:
        """Return the maximum along the last axis (tournament SecMax)."""
        rows = a.size // max(a.shape[-1], 1)
        self._count("max", a.size, comparisons=a.size - rows)
        moved = a.party.tensor(np.ascontiguousarray(np.moveaxis(a.share, -1, 0)), a.frac_bits)
        return sec_max([moved], self._ge_first)[0]

    def kth_largest(self, a: SharedTensor, k: int) -> SharedTensor:
        """Return the k-th largest entry of the flattened secret (bitonic SecSrt)."""
        flat = a.flatten()
        if not 1 <= k <= flat.size:
            raise ValueError(f"k must be in [1, {flat.size}]; got {k}")
        self._count("kth_largest", flat.size)
        return sec_sort([flat], self._ge_first)[0][k - 1]

    def _comparator(self, order: str) -> Any:
        def ratio(a: tuple[SharedTensor, ...], b: tuple[SharedTensor, ...]) -> SharedTensor:
            return sec_ge2(a[0], a[1], b[0], b[1])  # u_i v_j >= u_j v_i

        def signed_ratio(a: tuple[SharedTensor, ...], b: tuple[SharedTensor, ...]) -> SharedTensor:
            return sec_ge4(a[0], a[1], a[2], b[0], b[1], b[2])

        def signed_value(a: tuple[SharedTensor, ...], b: tuple[SharedTensor, ...]) -> SharedTensor:
            return sec_ge3(a[0], a[1], b[0], b[1])

        return {
            "ratio": ratio,
            "value": self._ge_first,
            "signed_ratio": signed_ratio,
            "signed_value": signed_value,
        }[order]

    def top_k(
        self, entries: Mapping[str, SharedTensor], order: Order, k: int, label: str
    ) -> list[int]:
        """SecSrt descending under ``order`` with the position as payload; open the first k."""
        check_order(entries, order)
        f = self.fixed_point.frac_bits
        fields = [  # exact squares come at scale 2f; SecGE2/4 multiply fields once more
            entries[name].flatten().rescale(min(entries[name].frac_bits, f))
            for name in ORDER_FIELDS[order]
        ]
        n = fields[0].size
        if not 0 <= k <= n:
            raise ValueError(f"k must be in [0, {n}]; got {k}")
        positions = np.arange(n, dtype=np.int64)
        index = self.party.tensor(
            positions.view(np.uint64) if self.party.party_id == 0 else np.zeros(n, np.uint64), 0
        )
        padding = [
            int(self.fixed_point.encode(value, field.frac_bits).view(np.int64))
            for value, field in zip(_PADDING[order], fields, strict=True)
        ] + [-1]
        self._count("top_k", n * len(fields))
        ranked = sec_sort([*fields, index], self._comparator(order), padding=padding)
        opened = np.rint(ranked[-1][:k].reveal()).astype(np.int64) if k else np.zeros(0, np.int64)
        chosen = [int(i) for i in opened]
        if sorted(chosen) != sorted(set(chosen)) or any(not 0 <= i < n for i in chosen):
            raise SecureComputationError(f"SecSrt opened invalid positions {chosen} (n = {n})")
        self._log_opening(label, (k,), chosen)
        return chosen

    def div(
        self, a: SharedTensor, b: SharedTensor, b_range: tuple[float, float] | None = None
    ) -> SharedTensor:
        """Return a / b: Newton reciprocal over the public range of b, range checked.

        ``mpc.sec_div`` first checks securely that every b lies in the range and opens that
        one bit (logged as ``range_check``); a 0 raises ``SecureComputationError`` at both
        servers instead of returning garbage.
        """
        self._count("div", a.size)
        out = sec_div(a, b, b_range or self.default_range)
        self._log_opening("range_check", (), 1.0)
        return out

    def sqrt(self, a: SharedTensor, a_range: tuple[float, float] | None = None) -> SharedTensor:
        """Return the elementwise square root (Newton over the public range of a, checked)."""
        self._count("sqrt", a.size)
        out = sec_sqrt(a, a_range or self.default_range)
        self._log_opening("range_check", (), 1.0)
        return out

    def check_range(
        self,
        a: SharedTensor,
        value_range: tuple[float, float] | None = None,
        step: str = "range check",
    ) -> None:
        """Check securely that every entry lies in the range; open only that bit (logged).

        Raises:
            SecureComputationError: Some entry is out of range (which one stays secret).
        """
        self._count("check_range", a.size)
        sec_check_range(a, value_range or self.default_range, step)
        self._log_opening("range_check", (), 1.0)

    def inverse(self, a: SharedTensor) -> SharedTensor:
        """SecMI of a small square matrix; ``SingularMatrixError`` if N = X R is unusable."""
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"inverse needs a square matrix; got shape {a.shape}")
        self._count("inverse", a.size)
        self._log_opening("secmi_mask", tuple(a.shape), None)
        try:
            return sec_inverse(a, max_condition=SECMI_MAX_CONDITION)
        except SecureComputationError as err:
            raise SingularMatrixError(str(err)) from err
