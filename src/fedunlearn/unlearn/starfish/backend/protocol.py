"""The arithmetic Starfish Stage II runs on: the backend protocol and its shared bookkeeping.

Starfish's unlearning is written once, against ``StarfishBackend``: every value the two servers
would hold as additive shares is an opaque *secret* handle, every public value a plain tensor,
and the only way to turn a secret into a public value is ``reveal``. Two backends implement
it: ``PlainBackend`` (``backend/plain.py``), the float64 plaintext mirror with the same control
flow, and ``MpcBackend`` (``backend/mpc.py``), one server's side of the 2PC protocols of
``fedunlearn.mpc``; the loop in :mod:`fedunlearn.unlearn.starfish.unlearner` does not change.
``BackendLog`` is the bookkeeping both share (current phase, op counts, opening log).

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

``round_scope(kind)`` wraps one replayed round; ``kind`` is public and equal for rounds whose
2PC request sequence is expected to be equal (a streaming dealer plans one from the other).

``top_k`` orders (descending, Sec. IV-A2 and App. C): ``"ratio"`` entries ``u, v`` (v > 0)
compared by cross-multiplication ``u_i v_j >= u_j v_i`` (SecGE2, Method 1); ``"value"`` entry
``tau`` (SecGE, Method 2); ``"signed_ratio"`` entries ``w, a, v`` (SecGE4, SecRS^alt Method 1)
and ``"signed_value"`` entries ``w, b`` (SecGE3, SecRS^alt Method 2), where ``w`` is the sign
bit of the cosine and ``a / v`` or ``b`` its square.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Table IV (basic functionalities), Table VI (composite ones), Alg. 5 and App. C (SecGE2-4),
Alg. 7 (SecMI). Deviations: docs/methods/starfish.md, SF11 (2PC substrate), SF19 (sorting).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np
import torch

from fedunlearn.errors import FedUnlearnError
from fedunlearn.unlearn.starfish.backend.ranges import StepRanges

__all__ = [
    "DEFAULT_RANGE",
    "BackendLog",
    "OpenedValue",
    "Order",
    "SingularMatrixError",
    "StarfishBackend",
    "bitonic_comparators",
    "check_order",
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
DEFAULT_RANGE = (1e-3, 1e3)  # public range of SecDiv/sqrt inputs when the caller gives none
MAX_CONDITION = 1e12  # SecMI redraws / the caller drops a pair above this (SF11)
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

    ``(l^2 + l) / 4 * 2^l`` with ``l = ceil(log2 n)`` (Sec. V-A, SecSrt); 0 for n <= 1.
    """
    if n <= 1:
        return 0
    level = math.ceil(math.log2(n))
    return (level * level + level) * (2**level) // 4


def check_order(entries: Mapping[str, Any], order: str) -> None:
    """Raise ``ValueError`` unless ``order`` is known and ``entries`` hold exactly its fields."""
    if order not in ORDER_FIELDS:
        raise ValueError(f"unknown order {order!r}; allowed: {', '.join(ORDER_FIELDS)}")
    if set(entries) != set(ORDER_FIELDS[order]):
        raise ValueError(
            f"order {order!r} needs entries {ORDER_FIELDS[order]}; got {tuple(entries)}"
        )


@runtime_checkable
class StarfishBackend(Protocol[S]):
    """The arithmetic Stage II needs; ``S`` is the backend's secret handle type.

    See the module docstring for the semantics of each method. Every method except ``reveal``,
    ``top_k`` and ``phase`` returns a secret; public arguments are tensors or floats.

    Attributes:
        opened: Every opening so far (``reveal``, ``top_k``'s indices, SecMI's masked matrix and
            any other value a protocol opens), in order.
        op_counts: Phase -> op -> counters (a 2PC backend may add bytes and rounds).
        ranges: The declared ring range of every step (``backend/ranges.py``) that client
            values are checked against before sharing; None: nothing is checked (the mirror).
    """

    opened: list[OpenedValue]
    op_counts: dict[str, dict[str, dict[str, int]]]
    ranges: StepRanges | None

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Return a context manager under which operations are booked to ``name``."""
        ...

    def round_scope(self, kind: Hashable) -> AbstractContextManager[None]:
        """Return a context manager around one replayed round of public ``kind``.

        A 2PC backend whose dealer streams material plans the round from the last round of the
        same kind (its offline phase); the mirror does nothing.
        """
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

    def check_range(
        self, a: S, value_range: tuple[float, float] | None = None, step: str = "range check"
    ) -> None:
        """Check that every entry of ``a`` lies in the public range, opening only that bit.

        ``step`` names the caller in the error.

        A 2PC backend stops with ``SecureComputationError`` on 0; the mirror logs the bit.
        """
        ...

    def inverse(self, a: S) -> S:
        """Return the inverse of a small square matrix (SecMI); raise ``SingularMatrixError``."""
        ...


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

    def round_scope(self, kind: Hashable) -> AbstractContextManager[None]:
        """One replayed round of public ``kind``; nothing to do without a streaming dealer."""
        return nullcontext()

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
