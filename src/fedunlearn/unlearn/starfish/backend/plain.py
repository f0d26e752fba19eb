"""``PlainBackend``: the Starfish backend protocol in the clear, the plaintext mirror.

Every secret is a ``PlainSecret`` wrapping the tensor itself, every op its float64 (or the run's
dtype) torch counterpart, with the same control flow as the 2PC backend, so plaintext and 2PC
runs of one request can be compared step by step, and 2PC error told from algorithmic error.
The mirror also counts operations per phase (calls, elements, and the comparisons a bitonic
network or a tournament would make), so TD^1 and TD^2, or RS^1 and RS^2, can be compared
without running 2PC; a 2PC backend reports measured bytes and rounds instead.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Table IV (the functionalities mirrored), Sec. V-A (comparison counts of SecSrt and SecMax).
Deviations: docs/methods/starfish.md, SF19 (ties in ``top_k`` are broken by the lower index
first; a bitonic network breaks them arbitrarily). ``inverse`` checks the condition number of
the matrix itself (a 2PC backend checks the opened N = X R, SF11) and logs the masked opening N
as SecMI does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from fedunlearn.unlearn.starfish.backend.protocol import (
    DEFAULT_RANGE,
    MAX_CONDITION,
    BackendLog,
    Order,
    Public,
    SingularMatrixError,
    bitonic_comparators,
    check_order,
)
from fedunlearn.unlearn.starfish.backend.ranges import StepRanges

__all__ = ["PlainBackend", "PlainSecret"]


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


class PlainBackend(BackendLog):
    """``StarfishBackend`` in the clear: float64 torch (or the run's dtype), with a log.

    Args:
        dtype: Working dtype of secret values (float64: the default mirror; float32 reproduces
            the run's FedAvg bit for bit).
        max_condition: ``inverse`` raises ``SingularMatrixError`` above this condition number.

    Attributes:
        opened: Every opening, in order (``OpenedValue``).
        op_counts: Phase -> op -> ``{"calls", "elements", "comparisons"}``.
        ranges: None: float64 has no ring range to check client values against.
    """

    def __init__(
        self, dtype: torch.dtype = torch.float64, max_condition: float = MAX_CONDITION
    ) -> None:
        super().__init__()
        self.dtype = dtype
        self.max_condition = max_condition
        self.ranges: StepRanges | None = None  # float64 has no ring: nothing to check

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
        check_order(entries, order)
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
        """Return a / b elementwise; log the range bit the 2PC servers would open."""
        self._count("div", a.value.numel())
        self._log_range(b.value, b_range)
        return self._wrap(a.value / b.value)

    def sqrt(self, a: PlainSecret, a_range: tuple[float, float] | None = None) -> PlainSecret:
        """Return the elementwise square root of max(a, 0); log the range bit."""
        self._count("sqrt", a.value.numel())
        self._log_range(a.value, a_range)
        return self._wrap(a.value.clamp_min(0).sqrt())

    def check_range(
        self,
        a: PlainSecret,
        value_range: tuple[float, float] | None = None,
        step: str = "range check",
    ) -> None:
        """Log the range bit the 2PC servers would open (and stop on, when 0)."""
        self._count("check_range", a.value.numel())
        self._log_range(a.value, value_range)

    def _log_range(self, x: torch.Tensor, value_range: tuple[float, float] | None) -> None:
        """Log ``range_check``: 1 if every entry is in the range (the 2PC guard's one bit).

        The mirror computes in the clear and does not stop on 0; the 2PC servers would.
        """
        lo, hi = value_range or DEFAULT_RANGE
        inside = bool(((x >= lo) & (x <= hi)).all())
        self._log_opening("range_check", (), 1.0 if inside else 0.0)

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
