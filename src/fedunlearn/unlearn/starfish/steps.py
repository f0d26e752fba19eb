"""Starfish Stage I record and the Stage II steps TD, SecRS, SecUE and SecTC on a backend.

Each step is written against ``StarfishBackend`` (``backend/protocol.py``), so the plaintext
mirror and a 2PC backend run the same control flow:

1. ``StageOneShares``: what the servers hold after Stage I (Alg. 4 lines 1-9), the protocol
   every step reads: per round and client the shared update [G_r^j], its norm [||G_r^j||] and
   its alpha-quantile threshold [delta_r^j]. ``StageOneRecord`` implements it for the
   plaintext mirror and in-process runs: read from the run's history store and shared on first
   use; the norm and threshold are computed as the client would have (SF10, SF18). A deployed
   server's ``deploy.shares.SharedStageOneRecord`` reads its share store instead.
2. ``thresholds_td2`` (Starfish, Sec. IV-C1: per-client SecMax over rounds) and
   ``threshold_td1`` (FedRecover's global threshold by SecSrt over every coordinate, priced in
   Sec. V-A; for cost comparison); both return *squared* thresholds, once per client (SF10).
3. ``select_rounds``: SecRS Method 1 (cross-multiplication, SecGE2), Method 2 (SecDiv) and
   SecRS^alt (App. C, Alg. 6: signs and squares, no client norms), scoring rounds by
   cos(g_r^t, M_{r-1} - M_r) (Eq. 1 with the sign of SF2).
4. ``CurvatureBuffer``: SecUE (Alg. 2, Eqs. 2-4). Per remaining client a FIFO of the B newest
   *exact* curvature pairs (public s = M_hat - M_{r-1}, secret y = G_bar - G_r; SF5), with the
   compact L-BFGS estimate ``G_hat = G_r + B v`` (the default) or the literal two-loop
   ``G_hat = H^{-1} G_r`` (Eq. 2 with the standard BFGS update; SF4).
5. ``check_thresholds``: SecTC (Alg. 3), one opened flag per client.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Alg. 1 (SecRS), Alg. 2 (SecUE), Alg. 3 (SecTC), Alg. 4 (Stage I/II), Alg. 6 (SecRS^alt),
Sec. IV-A to IV-C, Sec. V-A (T_delta, comparison counts).
Deviations (docs/methods/starfish.md): SF2 (cosine sign), SF4 (estimator: compact L-BFGS by
default, the standard BFGS term rho s s^T in literal mode, never an m x m matrix), SF5 (pairs
from exact gradients only), SF6 and SF20 (curvature guards: no pair from a public
||s|| <= 1e-12 (1 + ||M_hat||); the optional secret s^T y check opens one bit per pair), SF7
(L-BFGS scale), SF10 (thresholds; TD^1's rank), SF11 (a singular or ill-conditioned SecMI input
drops the oldest pair and retries), SF14 (several targets: the cosine of the *sum*), SF19 (unit
direction, sentinel score), SF22 (TD^2, SecTC and SecRS each run as one batch).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

from fedunlearn.history.store import HistoryReader
from fedunlearn.linalg.lbfgs import DEGENERATE_STEP_RTOL, GuardCounts, NoCurvaturePairsError
from fedunlearn.unlearn.starfish.backend.protocol import SingularMatrixError, StarfishBackend

__all__ = [
    "CurvatureBuffer",
    "SelectionMethod",
    "StageOneRecord",
    "StageOneShares",
    "check_thresholds",
    "select_rounds",
    "switching_threshold",
    "threshold_td1",
    "thresholds_td2",
]

SelectionMethod = Literal["method1", "method2", "alt_method1", "alt_method2"]
SENTINEL_COSINE = -2.0  # below every cosine: rounds without a target score rank last
CURVATURE_EPS = 1e-10  # optional secret curvature check: s^T y > eps ||s||^2


class StageOneShares(Protocol):
    """What Stage II reads of Stage I (Alg. 4 lines 1-9): per round r and client j, secrets.

    Attributes:
        dtype: Working dtype of the shared values (public models are cast to it).
    """

    dtype: torch.dtype

    def update(self, round_: int, client_id: int) -> Any:
        """Return the shared update [G_r^j]."""
        ...

    def norm(self, round_: int, client_id: int) -> Any:
        """Return the shared norm [||G_r^j||] (assistive information #1)."""
        ...

    def threshold(self, round_: int, client_id: int) -> Any:
        """Return the shared threshold [delta_r^j] (assistive information #2)."""
        ...


class StageOneRecord:
    """What S1 and S2 hold after Stage I, loaded lazily from the history store (Alg. 4).

    ``G_r^j = scale * delta_r^j``: ``scale = -1 / eta_l`` gives the pseudo-gradient (SF1),
    ``scale = -1`` the model-delta mode.

    Args:
        history: The run's history (metered in a method: bytes read are counted).
        backend: Where shares are made.
        scale: Update units, ``G = scale * delta``.
        alpha: Tolerance rate of the per-round thresholds (SF10).
        dtype: Working dtype of the client-side computations (norm, quantile).
    """

    def __init__(
        self,
        history: HistoryReader,
        backend: StarfishBackend[Any],
        scale: float,
        alpha: float,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.history = history
        self.backend = backend
        self.scale = scale
        self.alpha = alpha
        self.dtype = dtype
        self._assistive: dict[tuple[int, int], tuple[float, float]] = {}

    def plain_update(self, round_: int, client_id: int) -> torch.Tensor:
        """Return G_r^j in the clear: the client's view (reads the store once)."""
        delta = self.history.read_update(round_, client_id)
        gradient = delta.to(self.dtype) * self.scale
        key = (round_, client_id)
        if key not in self._assistive:  # Stage I, client side: norm and alpha-quantile (SF10)
            values = gradient.detach().abs().cpu().to(torch.float64).numpy()
            threshold = float(np.quantile(values, 1.0 - self.alpha)) if values.size else 0.0
            self._assistive[key] = (float(gradient.to(torch.float64).norm()), threshold)
        return gradient

    def update(self, round_: int, client_id: int) -> Any:
        """Return the stored share [G_r^j]."""
        return self.backend.share(self.plain_update(round_, client_id))

    def assistive(self, round_: int, client_id: int) -> tuple[float, float]:
        """Return the client's (||G_r^j||, delta_r^j), as it computes them in Stage I (SF10)."""
        if (round_, client_id) not in self._assistive:
            self.plain_update(round_, client_id)
        return self._assistive[(round_, client_id)]

    def norm(self, round_: int, client_id: int) -> Any:
        """Return the stored share [||G_r^j||] (assistive information #1).

        Only SecRS reads it (a target's norm, Method 1's v): with a ring-checking backend the
        client checks it against the declared ``norm_range`` first (``StepRanges.check_norm``).
        """
        value = self.assistive(round_, client_id)[0]
        if self.backend.ranges is not None:
            self.backend.ranges.check_norm(value, "SecRS (a target's client-supplied norm)")
        return self.backend.share(torch.tensor(value, dtype=self.dtype))

    def threshold(self, round_: int, client_id: int) -> Any:
        """Return the stored share [delta_r^j] (assistive information #2)."""
        value = self.assistive(round_, client_id)[1]
        return self.backend.share(torch.tensor(value, dtype=self.dtype))


# ---- TD: threshold determination (Sec. IV-C) ----------------------------------------------------


def thresholds_td2(
    backend: StarfishBackend[Any],
    record: StageOneShares,
    rounds_of_client: Mapping[int, Sequence[int]],
) -> dict[int, Any]:
    """TD^2: [delta^j]^2 with delta^j = SecMax_r [delta_r^j], per remaining client.

    Args:
        backend: The arithmetic backend.
        record: Stage I record.
        rounds_of_client: Client -> the rounds it took part in (its stored thresholds).

    Returns:
        Client -> squared threshold (secret); clients without a round are left out.
    """
    out: dict[int, Any] = {}
    by_count: dict[int, list[int]] = {}  # clients with as many rounds run as one batch
    for cid, rounds in rounds_of_client.items():
        if rounds:
            by_count.setdefault(len(rounds), []).append(cid)
    for ids in by_count.values():
        rows = [backend.stack([record.threshold(r, c) for r in rounds_of_client[c]]) for c in ids]
        delta = backend.max(backend.stack(rows))  # one SecMax per row, all rows in parallel
        squared = backend.mul(delta, delta)
        for i, cid in enumerate(ids):
            out[cid] = backend.index(squared, i)
    return out


def threshold_td1(
    backend: StarfishBackend[Any],
    record: StageOneShares,
    clients_of_round: Mapping[int, Sequence[int]],
    alpha: float,
    num_params: int,
) -> Any:
    """TD^1: one squared threshold exceeded by a fraction alpha of all remaining coordinates.

    SecSrt over the N = m * (n - 1) * T squared coordinates (Sec. V-A, Table I's TD^1; SF10);
    k = floor(alpha N) + 1, clamped to N.
    """
    squares = []
    for round_, ids in clients_of_round.items():
        for cid in ids:
            g = record.update(round_, cid)
            squares.append(backend.mul(g, g))
    if not squares:
        raise ValueError("TD^1 needs at least one stored remaining update")
    joined = backend.concat(squares)
    total = len(squares) * num_params
    k = min(math.floor(alpha * total) + 1, total)
    return backend.kth_largest(joined, k)


# ---- SecRS: round selection (Sec. IV-A, Alg. 1) -------------------------------------------------


def switching_threshold(ring_bits: int = 64, security_bits: int = 128) -> float:
    """Return T_delta, below which Method 1 communicates less than Method 2 (Sec. V-A).

    ``T_delta = 2^{(sqrt(1 + 40 l_q + 4 (kappa + 1)) - 1) / 2}``; about 1.58e8 for 64 / 128.
    """
    exponent = (math.sqrt(1 + 40 * ring_bits + 4 * (security_bits + 1)) - 1) / 2
    return 2.0**exponent


def select_rounds(
    backend: StarfishBackend[Any],
    record: StageOneShares,
    model: Callable[[int], torch.Tensor],
    targets_of_round: Mapping[int, Sequence[int]],
    count: int,
    method: SelectionMethod = "method1",
    norm_range: tuple[float, float] | None = None,
) -> list[int]:
    """SecRS: return the ``count`` rounds with the largest target cosine, best first (opened).

    Args:
        backend: The arithmetic backend.
        record: Stage I record (targets' shared gradients and norms).
        model: Round r -> public global model M_r (0 = M_0); each is asked for once.
        targets_of_round: Round r (1..T) -> targets whose round-r update is stored.
        count: T' = ceil(sigma T).
        method: ``method1`` (SecGE2), ``method2`` (SecDiv + SecGE), ``alt_method1`` (SecGE4) or
            ``alt_method2`` (SecDiv + SecGE3).
        norm_range: Public bounds (lo, hi) on the targets' update norms: the range hints of
            SecDiv and of the secure square root (Newton iterations); None: the backend's.

    Returns:
        The selected rounds in descending score order (as opened by ``top_k``).
    """
    if backend.ranges is not None:  # the declared norm_range must fit the method's products
        backend.ranges.check_selection(method)
    rounds = sorted(targets_of_round)
    alt = method.startswith("alt")
    # range hints: v = ||g|| in Methods 1/2 (||y|| = 1), v = ||g||^2 in SecRS^alt
    squared = None if norm_range is None else (norm_range[0] ** 2, norm_range[1] ** 2)
    cols: dict[str, list[Any]] = {}
    cache: dict[int, torch.Tensor] = {}

    def public(r: int) -> torch.Tensor:
        if r not in cache:
            if len(cache) > 1:
                cache.pop(min(cache))  # rounds ascend: keep M_{r-1} and M_r only
            cache[r] = model(r).to(record.dtype)
        return cache[r]

    real: list[tuple[int, Any, Any, Any]] = []  # (position, g, u, norm) of rounds with a target
    sentinels: dict[int, dict[str, Any]] = {}
    for position, r in enumerate(rounds):
        y = public(r - 1) - public(r)  # SF2: the direction of G^agg
        y_norm = float(y.to(torch.float64).norm())
        targets = list(targets_of_round[r])
        if not targets or y_norm == 0.0 or not math.isfinite(y_norm):
            sentinels[position] = _sentinel(backend, record.dtype, method)
            continue
        unit = y / y_norm  # public normalisation, ||y|| = 1 below
        g = record.update(r, targets[0])
        for t in targets[1:]:
            g = backend.add(g, record.update(r, t))
        u = backend.matmul_public(unit, g)  # <g, y>: public vector, local
        norm = record.norm(r, targets[0]) if len(targets) == 1 else None  # client-supplied
        real.append((position, g if alt or norm is None else None, u, norm))
    # the interactive steps run once for all rounds (one batch, so the rounds add up once)
    batch: dict[str, Any] = {}
    if real:
        u_all = backend.stack([u for _, _, u, _ in real])
        if alt:
            g_all = backend.stack([g for _, g, _, _ in real])
            batch = {"w": backend.ge(u_all, 0.0), "a": backend.mul(u_all, u_all)}
            batch["v"] = backend.dot(g_all, g_all)  # ||g||^2 ||y||^2 with ||y|| = 1
        elif all(norm is not None for *_, norm in real):
            batch = {"u": u_all, "v": backend.stack([norm for *_, norm in real])}
            if method == "method1":  # client norms enter SecGE2's products (Method 2: SecDiv)
                backend.check_range(batch["v"], norm_range, "SecRS method1 (target norms)")
        else:  # several targets: ||sum of g|| by a secure square root (no client norm)
            g_all = backend.stack([g for _, g, _, _ in real])
            batch = {"u": u_all, "v": backend.sqrt(backend.dot(g_all, g_all), squared)}
    at = {position: i for i, (position, *_) in enumerate(real)}
    for position in range(len(rounds)):
        if position in sentinels:
            entry = sentinels[position]
        else:
            entry = {name: backend.index(col, at[position]) for name, col in batch.items()}
        for name, value in entry.items():
            cols.setdefault(name, []).append(value)
    stacked = {name: backend.stack(values) for name, values in cols.items()}
    if method == "method1":
        entries, order = stacked, "ratio"
    elif method == "method2":
        entries, order = {"tau": backend.div(stacked["u"], stacked["v"], norm_range)}, "value"
    elif method == "alt_method1":
        entries, order = stacked, "signed_ratio"
    elif method == "alt_method2":
        b = backend.div(stacked["a"], stacked["v"], squared)
        entries, order = {"w": stacked["w"], "b": b}, "signed_value"
    else:
        raise ValueError(f"unknown selection method {method!r}")
    chosen = backend.top_k(entries, order, count, "selected_rounds")  # type: ignore[arg-type]
    return [rounds[i] for i in chosen]


def _sentinel(backend: StarfishBackend[Any], dtype: torch.dtype, method: str) -> dict[str, Any]:
    """Entries that rank below every real cosine (public constants, trivially shared)."""

    def const(x: float) -> Any:
        return backend.share(torch.tensor(x, dtype=dtype))

    if method.startswith("alt"):
        return {"w": const(0.0), "a": const(SENTINEL_COSINE**2), "v": const(1.0)}
    return {"u": const(SENTINEL_COSINE), "v": const(1.0)}


# ---- SecUE: update estimation (Sec. IV-B, Alg. 2) -----------------------------------------------


@dataclass
class _CompactSetup:
    """The per-buffer part of the compact form, reused until the next push."""

    s_mat: torch.Tensor  # m x b, public
    y_mat: Any  # m x b, secret
    gam: Any  # secret scalar
    mid_inv: Any  # 2b x 2b, secret
    num_pairs: int


class CurvatureBuffer:
    """One remaining client's FIFO of the B newest exact curvature pairs, and its estimates.

    Args:
        capacity: B.
        counts: Guard counters (shared per run).
        curvature_check: Also skip pairs with s^T y <= eps ||s||^2, opening one bit each (SF20).
    """

    def __init__(self, capacity: int, counts: GuardCounts, curvature_check: bool = False) -> None:
        self.capacity = capacity
        self.counts = counts
        self.curvature_check = curvature_check
        self.pairs: deque[tuple[torch.Tensor, Any]] = deque(maxlen=capacity)
        self.pushed = 0
        self._setup: _CompactSetup | None = None
        self._rho: dict[int, Any] = {}
        self._ids: deque[int] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.pairs)

    def push(
        self, backend: StarfishBackend[Any], s: torch.Tensor, y: Any, model_norm: float
    ) -> bool:
        """Add the pair (s public, y secret) unless a guard rejects it; return whether added."""
        s_norm = float(s.to(torch.float64).norm())
        if not math.isfinite(s_norm) or s_norm <= DEGENERATE_STEP_RTOL * (1.0 + model_norm):
            self.counts.degenerate_step += 1  # SF6: no pair from ||v|| ~ 0
            return False
        if self.curvature_check:
            sty = backend.matmul_public(s, y)
            ok = backend.reveal(backend.ge(sty, CURVATURE_EPS * s_norm**2), "curvature_bit")
            if float(ok) < 0.5:
                self.counts.nonpositive_curvature += 1
                return False
        self.pairs.append((s, y))
        self._ids.append(self.pushed)
        self.pushed += 1
        self._setup = None
        return True

    # -- compact L-BFGS (SF4; Byrd, Nocedal, Schnabel, the paper's [5]) --

    def _compact(self, backend: StarfishBackend[Any]) -> _CompactSetup:
        if self._setup is not None:
            return self._setup
        pairs = list(self.pairs)
        for start in range(len(pairs)):
            used = pairs[start:]
            b = len(used)
            s_mat = torch.stack([s for s, _ in used], dim=1)  # m x b, public
            y_mat = backend.stack([y for _, y in used], dim=1)  # m x b, secret
            a = backend.matmul_public(s_mat.T, y_mat)  # A = S^T Y, local
            sts = s_mat.T @ s_mat
            # gam = s_b^T y_b / s_b^T s_b: secret numerator, public denominator (local)
            gam = backend.mul_public(backend.index(a, (b - 1, b - 1)), 1.0 / float(sts[-1, -1]))
            lower = backend.mul_public(a, torch.tril(torch.ones(b, b), diagonal=-1))
            diag = backend.mul_public(a, torch.eye(b))
            top = backend.concat([backend.mul_public(gam, sts), lower], dim=1)
            bottom = backend.concat([backend.transpose(lower), backend.mul_public(diag, -1.0)], 1)
            mid = backend.concat([top, bottom], dim=0)  # [[gam S^T S, L], [L^T, -D]]
            try:
                mid_inv = backend.inverse(mid)  # SecMI, 2b x 2b
            except SingularMatrixError:
                self.counts.ill_conditioned += 1
                continue
            self._setup = _CompactSetup(s_mat, y_mat, gam, mid_inv, b)
            return self._setup
        self.counts.no_pairs += 1
        raise NoCurvaturePairsError("no usable curvature pair for the compact L-BFGS estimate")

    def hessian_vector(self, backend: StarfishBackend[Any], v: torch.Tensor) -> Any:
        """Return [B v] = gam v - W Mid^{-1} W^T v (secret), W = [gam S, Y].

        Raises:
            NoCurvaturePairsError: if no usable pair is buffered (the caller asks for an exact
                update instead).
        """
        if not self.pairs:
            self.counts.no_pairs += 1
            raise NoCurvaturePairsError("the curvature buffer is empty")
        setup = self._compact(backend)
        b = setup.num_pairs
        stv = setup.s_mat.T @ v  # public
        p = backend.concat(
            [backend.mul_public(setup.gam, stv), backend.matmul_public(v, setup.y_mat)]
        )  # [gam S^T v; Y^T v]
        q = backend.matmul(setup.mid_inv, p)  # SecMul, 2b
        q1, q2 = backend.index(q, slice(0, b)), backend.index(q, slice(b, 2 * b))
        wq = backend.add(
            backend.matmul_public(setup.s_mat, backend.mul(setup.gam, q1)),  # S (gam q1)
            backend.matmul(setup.y_mat, q2),  # Y q2, SecMul m x b
        )
        return backend.sub(backend.mul_public(setup.gam, v), wq)

    def estimate_compact(self, backend: StarfishBackend[Any], g_old: Any, v: torch.Tensor) -> Any:
        """Return [G_hat] = [G_r] + [B v] (FedRecover-consistent, SF4).

        ``v == 0`` (the forgotten clients did not move the model yet) gives ``G_r`` as it is.
        """
        if not bool(v.any()):
            return g_old
        return backend.add(g_old, self.hessian_vector(backend, v))

    # -- literal two-loop (Eq. 2 with the standard BFGS update, SF4) --

    def estimate_two_loop(
        self, backend: StarfishBackend[Any], g_old: Any, gamma0: float = 1.0
    ) -> Any:
        """Return [G_hat] = H^{-1} [G_r] by the L-BFGS two-loop recursion (Eq. 2, SF4).

        rho_k = 1 / (y_k^T s_k) is a scalar SecMI (the paper's ``SecMI([DeltaG]^T DeltaM)``),
        cached per pair; with no pair, ``H^{-1} = gamma0 I``.
        """
        pairs = list(zip(self._ids, self.pairs, strict=True))
        rhos: list[Any] = []
        usable: list[tuple[torch.Tensor, Any]] = []
        for pid, (s, y) in pairs:
            if pid not in self._rho:
                sty = backend.matmul_public(s.unsqueeze(0), backend.stack([y], dim=1))  # 1 x 1
                try:
                    self._rho[pid] = backend.index(backend.inverse(sty), (0, 0))
                except SingularMatrixError:
                    self.counts.ill_conditioned += 1
                    self._rho[pid] = None
            if self._rho[pid] is not None:
                rhos.append(self._rho[pid])
                usable.append((s, y))
        live = set(self._ids)
        self._rho = {k: v for k, v in self._rho.items() if k in live}
        q = g_old
        alphas: list[Any] = []
        for (s, y), rho in zip(reversed(usable), reversed(rhos), strict=True):  # newest first
            a_k = backend.mul(rho, backend.matmul_public(s, q))
            q = backend.sub(q, backend.mul(a_k, y))
            alphas.append(a_k)
        z = backend.mul_public(q, gamma0)
        for (s, y), rho, a_k in zip(usable, rhos, reversed(alphas), strict=True):  # oldest first
            b_k = backend.mul(rho, backend.dot(y, z))
            z = backend.add(z, backend.mul_public(backend.sub(a_k, b_k), s))
        return z


# ---- SecTC: threshold checking (Sec. IV-C1, Alg. 3) ---------------------------------------------


def check_thresholds(
    backend: StarfishBackend[Any],
    estimates: Mapping[int, Any],
    thresholds_sq: Mapping[int, Any],
) -> dict[int, bool]:
    """SecTC: flag client j iff some coordinate has G_hat^j(k)^2 >= (delta^j)^2 (Alg. 3).

    Args:
        backend: The arithmetic backend.
        estimates: Client -> [G_hat^j].
        thresholds_sq: Client -> [(delta^j)^2] (TD^2), or one shared value for all (TD^1).

    Returns:
        Client -> opened flag (all flags are opened together, one SecRec).
    """
    ids = sorted(estimates)
    if not ids:
        return {}
    groups: dict[tuple[int, ...], list[int]] = {}  # estimates of one shape run as one batch
    for cid in ids:
        groups.setdefault(tuple(estimates[cid].shape), []).append(cid)
    order: list[int] = []
    flags = []
    for members in groups.values():  # one SecMul round and two SecGE per batch: rows = clients
        g = backend.stack([estimates[cid] for cid in members])  # (k, m)
        limits = backend.stack([backend.stack([thresholds_sq[cid]]) for cid in members])
        bits = backend.ge(backend.mul(g, g), limits)  # squares: no |.|, no sqrt
        flags.append(backend.ge(backend.sum(bits), 1.0))  # at least one coordinate exceeds
        order += members
    opened = backend.reveal(backend.concat(flags), "correction_flags")
    return {cid: bool(float(f) >= 0.5) for cid, f in zip(order, opened.tolist(), strict=True)}
