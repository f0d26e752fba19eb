"""The arithmetic Starfish Stage II runs on: a backend protocol and its plaintext mirror.

Starfish's unlearning (spec §5) is written once, against ``StarfishBackend``: every value the two
servers would hold as additive shares is an opaque *secret* handle, every public value a plain
tensor, and the only way to turn a secret into a public value is ``reveal``. ``PlainBackend``
implements the protocol in the clear (float64 by default): the spec's "plaintext mirror with
identical control flow" (spec §5.6, §12 item 6). A 2PC backend over ``fedunlearn.mpc`` implements
the same methods with ``SharedTensor`` handles, so the loop in
:mod:`fedunlearn.unlearn.starfish.unlearner` does not change.

Semantics every backend must keep (shapes broadcast as in torch):

- ``share``: a client's SecShare of a public-to-it tensor (Stage I storage, or a fresh exact
  update). ``reveal``: SecRec, the one opening; each call is logged with its phase and label.
- Local ops (no communication in 2PC): ``add``, ``sub``, ``add_public``, ``mul_public`` (secret
  times public, elementwise), ``matmul_public`` (public @ secret), ``sum`` (last axis), ``stack``,
  ``concat``, ``index`` (basic indexing), ``transpose`` (2-D), ``weighted_sum`` (public weights,
  FedAvg's SecAdd_A).
- Interactive ops: ``mul`` (elementwise SecMul), ``matmul`` (matrix SecMul), ``dot`` (SecSP along
  the last axis), ``ge`` (SecGE: bit 1 iff a >= b, bits are secret values 0/1 at integer scale),
  ``select`` (SecSel: bit ? a : b), ``max`` (SecMax along the last axis), ``kth_largest`` (SecSrt
  of a flattened tensor, TD^1), ``top_k`` (SecSrt with the round index as payload; only the
  first k indices are opened), ``div`` (SecDiv, fixed-point quotient) and ``sqrt`` (both take
  an optional public range hint, which Newton iterations need), ``inverse``
  (SecMI of a small square matrix; raises ``SingularMatrixError`` when the masked matrix is
  singular or ill-conditioned, so the caller drops its oldest curvature pair).

``top_k`` orders (descending, spec §3.4, §5.3): ``"ratio"`` entries ``u, v`` (v > 0) compared by
cross-multiplication ``u_i v_j >= u_j v_i`` (SecGE2, Method 1); ``"value"`` entry ``tau``
(SecGE, Method 2); ``"signed_ratio"`` entries ``w, a, v`` (SecGE4, SecRS^alt Method 1) and
``"signed_value"`` entries ``w, b`` (SecGE3, SecRS^alt Method 2), where ``w`` is the sign bit of
the cosine and ``a / v`` or ``b`` its square.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Table IV (basic functionalities), Alg. 5 and App. C (SecGE2-4), Alg. 7 (SecMI); Starfish spec
§3, §6.1.

Deviations:
    [REC] Plain ties in ``top_k`` are broken by the lower index first (a bitonic network breaks
        them arbitrarily; spec V3 "ties excepted").
    [REC] ``PlainBackend`` also counts operations per phase (calls, elements, comparisons of a
        bitonic network or tournament), so TD^1 and TD^2 (or RS^1 and RS^2) can be compared in
        plaintext; a 2PC backend reports measured bytes and rounds instead.
    [REC] ``PlainBackend.inverse`` checks ``cond`` of the matrix itself (a 2PC backend checks the
        opened ``N = X R``, spec §3.6) and logs the masked opening ``N`` as SecMI does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np
import torch

from fedunlearn.errors import FedUnlearnError

__all__ = [
    "BackendLog",
    "OpenedValue",
    "Order",
    "PlainBackend",
    "PlainSecret",
    "SingularMatrixError",
    "StarfishBackend",
    "bitonic_comparators",
]

S = TypeVar("S")
Public = torch.Tensor | float
Order = Literal["ratio", "value", "signed_ratio", "signed_value"]
ORDER_FIELDS: dict[str, tuple[str, ...]] = {
    "ratio": ("u", "v"),
    "value": ("tau",),
    "signed_ratio": ("w", "a", "v"),
    "signed_value": ("w", "b"),
}
MAX_CONDITION = 1e12  # SecMI redraws / the caller drops a pair above this (spec §3.6)
SMALL_VALUE_NUMEL = 64  # opened values up to this size are kept in the log


class SingularMatrixError(FedUnlearnError, ArithmeticError):
    """SecMI found the (masked) matrix singular or ill-conditioned; drop a pair and retry."""


@dataclass(frozen=True)
class OpenedValue:
    """One opening: what the servers learned, in which phase (for ``docs/security.md``).

    Attributes:
        phase: Stage II step (``TD``, ``RS``, ``UE``, ``TC``, ``AGG``, ...).
        label: What was opened (``selected_rounds``, ``flag``, ``aggregate``, ``secmi_mask``...).
        shape: Shape of the opened tensor.
        value: The opened values if small (at most 64 numbers), else None.
    """

    phase: str
    label: str
    shape: tuple[int, ...]
    value: tuple[float, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "phase": self.phase,
            "label": self.label,
            "shape": list(self.shape),
            "value": None if self.value is None else list(self.value),
        }


def bitonic_comparators(n: int) -> int:
    """Return the compare-exchange count of a bitonic sort of ``n`` entries padded to 2^l.

    ``(l^2 + l) / 4 * 2^l`` with ``l = ceil(log2 n)`` (spec §3.4, SecSrt); 0 for n <= 1.
    """
    if n <= 1:
        return 0
    level = math.ceil(math.log2(n))
    return (level * level + level) * (2**level) // 4


@runtime_checkable
class StarfishBackend(Protocol[S]):
    """The arithmetic Stage II needs; ``S`` is the backend's secret handle type.

    See the module docstring for the semantics of each method. Every method except ``reveal``,
    ``top_k`` and ``phase`` returns a secret; public arguments are tensors or floats.

    Attributes:
        opened: Every opening so far (``reveal``, ``top_k``'s indices, SecMI's masked matrix and
            any other value a protocol opens), in order.
        op_counts: Phase -> op -> counters (a 2PC backend may add bytes and rounds).
    """

    opened: list[OpenedValue]
    op_counts: dict[str, dict[str, dict[str, int]]]

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Return a context manager under which operations are booked to ``name``."""
        ...

    def share(self, x: torch.Tensor) -> S:
        """Secret-share a tensor held by a client (SecShare)."""
        ...

    def reveal(self, x: S, label: str) -> torch.Tensor:
        """Open a secret (SecRec) and log the opening under ``label``."""
        ...

    def add(self, a: S, b: S) -> S:
        """Return a + b."""
        ...

    def sub(self, a: S, b: S) -> S:
        """Return a - b."""
        ...

    def add_public(self, a: S, p: Public) -> S:
        """Return a + p for public p."""
        ...

    def mul_public(self, a: S, p: Public) -> S:
        """Return a * p elementwise (broadcast) for public p."""
        ...

    def matmul_public(self, p: torch.Tensor, a: S) -> S:
        """Return p @ a for a public matrix or vector p."""
        ...

    def sum(self, a: S) -> S:
        """Return the sum over the last axis."""
        ...

    def stack(self, xs: Sequence[S], dim: int = 0) -> S:
        """Stack secrets along a new axis."""
        ...

    def concat(self, xs: Sequence[S], dim: int = 0) -> S:
        """Concatenate secrets along an existing axis."""
        ...

    def index(self, a: S, key: Any) -> S:
        """Return a[key] (basic indexing: ints, slices, tuples of them)."""
        ...

    def transpose(self, a: S) -> S:
        """Return the transpose of a 2-D secret."""
        ...

    def weighted_sum(self, xs: Sequence[S], weights: torch.Tensor) -> S:
        """Return sum_j weights[j] * xs[j] with public weights (SecAdd_A)."""
        ...

    def mul(self, a: S, b: S) -> S:
        """Return a * b elementwise (broadcast; SecMul)."""
        ...

    def matmul(self, a: S, b: S) -> S:
        """Return a @ b (matrix SecMul)."""
        ...

    def dot(self, a: S, b: S) -> S:
        """Return the inner product along the last axis (SecSP)."""
        ...

    def ge(self, a: S, b: S | Public) -> S:
        """Return bits (1 iff a >= b) elementwise (SecGE); b may be public."""
        ...

    def select(self, bit: S, if_true: S, if_false: S) -> S:
        """Return bit ? if_true : if_false elementwise (SecSel)."""
        ...

    def max(self, a: S) -> S:
        """Return the maximum along the last axis (SecMax)."""
        ...

    def kth_largest(self, a: S, k: int) -> S:
        """Return the k-th largest (1-based) entry of the flattened secret (SecSrt)."""
        ...

    def top_k(self, entries: Mapping[str, S], order: Order, k: int, label: str) -> list[int]:
        """Sort entries descending under ``order`` and open the first ``k`` indices."""
        ...

    def div(self, a: S, b: S, b_range: tuple[float, float] | None = None) -> S:
        """Return a / b elementwise (SecDiv); ``b_range`` is a public range hint for b > 0."""
        ...

    def sqrt(self, a: S, a_range: tuple[float, float] | None = None) -> S:
        """Return the elementwise square root; ``a_range`` is a public range hint."""
        ...

    def inverse(self, a: S) -> S:
        """Return the inverse of a small square matrix (SecMI); raise ``SingularMatrixError``."""
        ...


@dataclass(frozen=True, eq=False)
class PlainSecret:
    """A value the servers would hold as shares; in plaintext, the tensor itself.

    Its repr never prints the value (as ``SharedTensor``); use ``PlainBackend.reveal``.
    """

    value: torch.Tensor = field(repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the hidden tensor (public, as in 2PC)."""
        return tuple(self.value.shape)

    def __repr__(self) -> str:
        return f"PlainSecret(shape={self.shape})"


def _cmp(order: str, cols: Mapping[str, list[float]], i: int, j: int) -> int:
    """Return -1 if entry i sorts before j (descending), 1 if after; ties: lower index first."""
    if order == "ratio":  # SecGE2: u_i / v_i vs u_j / v_j by cross-multiplication
        left, right = cols["u"][i] * cols["v"][j], cols["u"][j] * cols["v"][i]
    elif order == "value":  # SecGE
        left, right = cols["tau"][i], cols["tau"][j]
    else:  # SecGE3 / SecGE4: sign bit first, then the squared cosine
        wi, wj = cols["w"][i] >= 0.5, cols["w"][j] >= 0.5
        if wi != wj:
            return -1 if wi else 1
        if order == "signed_ratio":
            left, right = cols["a"][i] * cols["v"][j], cols["a"][j] * cols["v"][i]
        else:
            left, right = cols["b"][i], cols["b"][j]
        if not wi:  # both negative: the smaller square is the larger cosine
            left, right = right, left
    if left != right:
        return -1 if left > right else 1
    return -1 if i < j else (1 if i > j else 0)


class BackendLog:
    """Bookkeeping every backend shares: the current phase, op counts and the opening log.

    Attributes:
        opened: Every opening, in order (``OpenedValue``).
        op_counts: Phase -> op -> ``{"calls", "elements", "comparisons"}``.
    """

    def __init__(self) -> None:
        self.opened: list[OpenedValue] = []
        self.op_counts: dict[str, dict[str, dict[str, int]]] = {}
        self._phase = "setup"

    def _count(self, op: str, elements: int, comparisons: int = 0) -> None:
        book = self.op_counts.setdefault(self._phase, {}).setdefault(
            op, {"calls": 0, "elements": 0, "comparisons": 0}
        )
        book["calls"] += 1
        book["elements"] += int(elements)
        book["comparisons"] += int(comparisons)

    def _log_opening(self, label: str, shape: tuple[int, ...], values: Any) -> None:
        """Log an opening of ``shape``; its ``values`` (array-like) are kept only if few."""
        kept = None
        if values is not None and math.prod(shape) <= SMALL_VALUE_NUMEL:
            kept = tuple(float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1))
        self.opened.append(OpenedValue(self._phase, label, shape, kept))


class PlainBackend(BackendLog):
    """``StarfishBackend`` in the clear: float64 torch (or the run's dtype), with a log.

    Args:
        dtype: Working dtype of secret values (float64: the spec's mirror; float32 reproduces
            the run's FedAvg bit for bit).
        max_condition: ``inverse`` raises ``SingularMatrixError`` above this condition number.

    Attributes:
        opened: Every opening, in order (``OpenedValue``).
        op_counts: Phase -> op -> ``{"calls", "elements", "comparisons"}``.
    """

    def __init__(
        self, dtype: torch.dtype = torch.float64, max_condition: float = MAX_CONDITION
    ) -> None:
        super().__init__()
        self.dtype = dtype
        self.max_condition = max_condition

    # ---- bookkeeping -----------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Book the operations run inside the block to phase ``name``."""
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def _wrap(self, value: torch.Tensor) -> PlainSecret:
        return PlainSecret(value)

    def _public(self, p: Public) -> torch.Tensor | float:
        return p.to(self.dtype) if isinstance(p, torch.Tensor) else float(p)

    @staticmethod
    def _val(x: PlainSecret | Public) -> Any:
        return x.value if isinstance(x, PlainSecret) else x

    # ---- sharing and opening -----------------------------------------------------------------

    def share(self, x: torch.Tensor) -> PlainSecret:
        """Secret-share ``x`` (a copy in the working dtype)."""
        self._count("share", x.numel())
        return self._wrap(x.detach().to(self.dtype).clone())

    def reveal(self, x: PlainSecret, label: str) -> torch.Tensor:
        """Open ``x`` and log it."""
        value = x.value
        self._count("reveal", value.numel())
        self._log_opening(label, tuple(value.shape), value)
        return value.clone()

    # ---- local ops ---------------------------------------------------------------------------

    def add(self, a: PlainSecret, b: PlainSecret) -> PlainSecret:
        """Return a + b."""
        return self._wrap(a.value + b.value)

    def sub(self, a: PlainSecret, b: PlainSecret) -> PlainSecret:
        """Return a - b."""
        return self._wrap(a.value - b.value)

    def add_public(self, a: PlainSecret, p: Public) -> PlainSecret:
        """Return a + p."""
        return self._wrap(a.value + self._public(p))

    def mul_public(self, a: PlainSecret, p: Public) -> PlainSecret:
        """Return a * p elementwise."""
        return self._wrap(a.value * self._public(p))

    def matmul_public(self, p: torch.Tensor, a: PlainSecret) -> PlainSecret:
        """Return p @ a."""
        return self._wrap(p.to(self.dtype) @ a.value)

    def sum(self, a: PlainSecret) -> PlainSecret:
        """Return the sum over the last axis."""
        return self._wrap(a.value.sum(dim=-1))

    def stack(self, xs: Sequence[PlainSecret], dim: int = 0) -> PlainSecret:
        """Stack along a new axis."""
        return self._wrap(torch.stack([x.value for x in xs], dim=dim))

    def concat(self, xs: Sequence[PlainSecret], dim: int = 0) -> PlainSecret:
        """Concatenate along an existing axis."""
        return self._wrap(torch.cat([x.value for x in xs], dim=dim))

    def index(self, a: PlainSecret, key: Any) -> PlainSecret:
        """Return a[key]."""
        return self._wrap(a.value[key].clone())

    def transpose(self, a: PlainSecret) -> PlainSecret:
        """Return a.T (2-D)."""
        return self._wrap(a.value.T.clone())

    def weighted_sum(self, xs: Sequence[PlainSecret], weights: torch.Tensor) -> PlainSecret:
        """Return sum_j w_j x_j, computed exactly as ``fl.aggregators.fedavg`` computes it."""
        stacked = torch.stack([x.value for x in xs])
        self._count("weighted_sum", stacked.numel())
        return self._wrap((weights.to(self.dtype) @ stacked).to(self.dtype))

    # ---- interactive ops -----------------------------------------------------------------------

    def mul(self, a: PlainSecret, b: PlainSecret) -> PlainSecret:
        """Return a * b elementwise."""
        out = a.value * b.value
        self._count("mul", out.numel())
        return self._wrap(out)

    def matmul(self, a: PlainSecret, b: PlainSecret) -> PlainSecret:
        """Return a @ b."""
        self._count("matmul", a.value.numel() + b.value.numel())
        return self._wrap(a.value @ b.value)

    def dot(self, a: PlainSecret, b: PlainSecret) -> PlainSecret:
        """Return the inner product along the last axis."""
        self._count("dot", a.value.numel())
        return self._wrap((a.value * b.value).sum(dim=-1))

    def ge(self, a: PlainSecret, b: PlainSecret | Public) -> PlainSecret:
        """Return bits a >= b (0/1 in the working dtype)."""
        left = a.value
        right = b.value if isinstance(b, PlainSecret) else self._public(b)
        out = (left >= right).to(self.dtype)
        self._count("ge", out.numel(), comparisons=out.numel())
        return self._wrap(out)

    def select(self, bit: PlainSecret, if_true: PlainSecret, if_false: PlainSecret) -> PlainSecret:
        """Return bit ? if_true : if_false (as [v0] + SecMul([b], [v1] - [v0]))."""
        out = if_false.value + bit.value * (if_true.value - if_false.value)
        self._count("select", out.numel())
        return self._wrap(out)

    def max(self, a: PlainSecret) -> PlainSecret:
        """Return the maximum along the last axis (tournament: n - 1 comparisons per row)."""
        value = a.value
        rows = value.numel() // max(value.shape[-1], 1)
        self._count("max", value.numel(), comparisons=value.numel() - rows)
        return self._wrap(value.max(dim=-1).values)

    def kth_largest(self, a: PlainSecret, k: int) -> PlainSecret:
        """Return the k-th largest entry of the flattened secret (SecSrt-priced)."""
        flat = a.value.reshape(-1)
        if not 1 <= k <= flat.numel():
            raise ValueError(f"k must be in [1, {flat.numel()}]; got {k}")
        self._count("kth_largest", flat.numel(), comparisons=bitonic_comparators(flat.numel()))
        return self._wrap(flat.topk(k).values[-1])

    def top_k(
        self, entries: Mapping[str, PlainSecret], order: Order, k: int, label: str
    ) -> list[int]:
        """Sort descending under ``order`` and open the first ``k`` indices (logged)."""
        if order not in ORDER_FIELDS:
            raise ValueError(f"unknown order {order!r}; allowed: {', '.join(ORDER_FIELDS)}")
        if set(entries) != set(ORDER_FIELDS[order]):
            raise ValueError(
                f"order {order!r} needs entries {ORDER_FIELDS[order]}; got {tuple(entries)}"
            )
        cols = {
            name: [float(x) for x in e.value.reshape(-1).tolist()] for name, e in entries.items()
        }
        n = len(next(iter(cols.values())))
        if not 0 <= k <= n:
            raise ValueError(f"k must be in [0, {n}]; got {k}")
        ranked = sorted(range(n), key=functools.cmp_to_key(functools.partial(_cmp, order, cols)))
        self._count("top_k", n * len(cols), comparisons=bitonic_comparators(n))
        chosen = ranked[:k]
        self._log_opening(label, (k,), chosen)
        return chosen

    def div(
        self, a: PlainSecret, b: PlainSecret, b_range: tuple[float, float] | None = None
    ) -> PlainSecret:
        """Return a / b elementwise (the range hint is not needed in the clear)."""
        self._count("div", a.value.numel())
        return self._wrap(a.value / b.value)

    def sqrt(self, a: PlainSecret, a_range: tuple[float, float] | None = None) -> PlainSecret:
        """Return the elementwise square root of max(a, 0) (range hint not needed)."""
        self._count("sqrt", a.value.numel())
        return self._wrap(a.value.clamp_min(0).sqrt())

    def inverse(self, a: PlainSecret) -> PlainSecret:
        """Return the inverse of a small square matrix, or raise ``SingularMatrixError``."""
        value = a.value
        if value.ndim != 2 or value.shape[0] != value.shape[1]:
            raise ValueError(f"inverse needs a square matrix; got shape {tuple(value.shape)}")
        self._count("inverse", value.numel())
        self._log_opening("secmi_mask", tuple(value.shape), None)
        if not bool(torch.isfinite(value).all()):
            raise SingularMatrixError("SecMI input has non-finite entries")
        cond = float(torch.linalg.cond(value.to(torch.float64)))
        if not math.isfinite(cond) or cond > self.max_condition:
            raise SingularMatrixError(f"SecMI input is ill-conditioned (cond {cond:.3g})")
        inv, info = torch.linalg.inv_ex(value)
        if int(info) != 0:
            raise SingularMatrixError("SecMI input is singular")
        return self._wrap(inv)
