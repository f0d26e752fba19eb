"""Starfish Stage II, step 3: replaying the selected rounds, and where exact updates come from.

``Replay`` holds the replay's state (each remaining client's curvature buffer, the exact-update
requests T_r, the flags) and replays one selected round at a time. Round k of the replay
(original round r), in order:

1. the public displacement v = M_hat - M_{r-1} (SF5);
2. a warm-up round (k <= K_w, SF6) or a final-tuning round (SF20) asks every remaining
   participant for an exact update; any other round estimates each participant's update with
   SecUE (Alg. 2; the compact L-BFGS G_r + B v by default, SF4), and a client with no usable
   curvature pair is asked instead (SF17);
3. in a correction round (r mod T_c == 0, SF8) SecTC (Alg. 3) opens one flag per estimated
   client; flagged clients are asked for an exact update at M_hat with round r's seeds (SF9);
4. exact updates become curvature pairs (v, [G_bar] - [G_r]) while an estimated round is
   still ahead (SF5, SF6);
5. the FedAvg aggregate over the round's remaining contributors (SF16) is opened and applied:
   M_hat <- M_hat - eta_u G_hat^agg (SF13).

A ``ClientGateway`` delivers exact updates as secrets: ``LocalClients`` trains the run's
federation in this process and shares the uploads with the backend (the in-process 2PC
servers use it over ``deploy.servers.SharedClients``, so each upload is trained once); a
server process uses ``deploy.clients.RemoteClients``.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Alg. 2 (SecUE), Alg. 3 (SecTC), Alg. 4 lines 15-24 (the unlearning rounds), Sec. IV-B, IV-C.
Deviations: docs/methods/starfish.md, SF4-SF6, SF8, SF9 (exact uploads are screened as in
training; a non-finite one is left out and listed in ``rejected_updates``), SF13, SF16, SF17, SF20.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.engine import screen_update
from fedunlearn.linalg.lbfgs import DEGENERATE_STEP_RTOL, NoCurvaturePairsError
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.starfish.backend.protocol import StarfishBackend
from fedunlearn.unlearn.starfish.steps import CurvatureBuffer, StageOneShares, check_thresholds

__all__ = ["ClientGateway", "LocalClients", "Replay"]

log = logging.getLogger(__name__)


class ClientGateway(Protocol):
    """Where Stage II's exact updates come from: the remaining clients, as secrets."""

    def exact(
        self, m_hat: torch.Tensor, client_ids: list[int], round_: int
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Return (client -> shared exact update at ``m_hat``, client -> rejection reason)."""
        ...


class LocalClients:
    """Exact updates from the run's federation in this process, shared with ``backend.share``.

    Args:
        context: The run (its remaining clients train with round r's seeds, SF9).
        backend: Where the client's SecShare is made.
        scale: Update units, G = scale * delta.
        dtype: Working dtype of the shared value.
    """

    def __init__(
        self,
        context: UnlearnContext,
        backend: StarfishBackend[Any],
        scale: float,
        dtype: torch.dtype,
    ) -> None:
        self.context, self.backend, self.scale, self.dtype = context, backend, scale, dtype

    def exact(
        self, m_hat: torch.Tensor, client_ids: list[int], round_: int
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Train the clients at ``m_hat``, screen the uploads as training does, share them."""
        shares: dict[int, Any] = {}
        rejected: dict[int, str] = {}
        for update in self.context.clients.train(TrainTask(m_hat, client_ids, round_)):
            reason = screen_update(update, self.context.clients.num_params)
            if reason is not None:
                rejected[update.client_id] = reason
                continue
            shares[update.client_id] = self.backend.share(update.delta.to(self.dtype) * self.scale)
        return shares, rejected


@dataclass
class Replay:
    """Step 3's state (buffers, requests, flags) and ``round``, the module's steps 1-5 in order.

    ``requests`` counts T_r per remaining client (ARP, SF15), ``no_pair`` the exact requests
    made for lack of a curvature pair (SF17); ``flags`` maps a correction round to its flagged
    clients; ``rejected`` lists exact uploads left out of the aggregate.
    """

    context: UnlearnContext
    backend: StarfishBackend[Any]
    record: StageOneShares
    thresholds: dict[int, Any]
    participants: dict[int, list[int]]
    dtype: torch.dtype
    gateway: ClientGateway
    eta_u: float
    estimator: str
    warmup: int
    last_estimating: int
    interval: int
    correct_on: str
    buffers: dict[int, CurvatureBuffer]
    requests: Counter[int]
    no_pair: Counter[int] = field(default_factory=Counter)
    flags: dict[int, list[int]] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    estimated: int = 0

    def kind(self, k: int, r: int) -> tuple[Any, ...]:
        """Public description of round k's work; equal kinds make (mostly) equal 2PC requests.

        Exact or estimated, whether it corrects, and each participant's curvature-buffer
        length (all public: they follow from the flags and the opened SecMI masks). A
        streaming 2PC backend plans a round from the last one of its kind; what differs
        later in a round (the flags, the pairs pushed) falls back to on-demand material.
        """
        exact = k <= self.warmup or k > self.last_estimating
        correction = (r if self.correct_on == "round" else k) % self.interval == 0
        lengths = tuple(len(self.buffers[c]) for c in self.participants[r])
        return ("exact" if exact else "estimate", correction, lengths)

    def round(self, k: int, r: int, m_hat: torch.Tensor) -> torch.Tensor:
        """Replay selected round ``k`` (original round ``r``) from ``m_hat``; return M_hat."""
        ids = self.participants[r]
        if not ids:
            log.warning("round %d: no remaining participant; model unchanged", r)
            return m_hat
        backend = self.backend
        v = m_hat.to(self.dtype) - self.context.history.read_model(r - 1).to(self.dtype)  # SF5
        exact = k <= self.warmup or k > self.last_estimating
        stored: dict[int, Any] = {}
        estimates: dict[int, Any] = {}
        asked = set(ids) if exact else set()
        if not exact:
            with backend.phase("UE"):
                for cid in ids:
                    stored[cid] = self.record.update(r, cid)
                    try:
                        estimates[cid] = self._estimate(cid, stored[cid], v)
                    except NoCurvaturePairsError:
                        self.no_pair[cid] += 1
                        asked.add(cid)
            if (r if self.correct_on == "round" else k) % self.interval == 0 and estimates:
                with backend.phase("TC"):
                    flags = check_thresholds(backend, estimates, self.thresholds)
                self.flags[r] = sorted(c for c, flagged in flags.items() if flagged)
                for cid in self.flags[r]:
                    del estimates[cid]
                asked |= set(self.flags[r])
        exact_shares = self._exact(m_hat, sorted(asked), r)
        if k < self.last_estimating and self.last_estimating > self.warmup and exact_shares:
            self._push_pairs(exact_shares, stored, r, v, float(m_hat.norm()))
        self.estimated += len(estimates)
        self.context.meter.add(estimated_updates=len(estimates))
        contributions = {**estimates, **exact_shares}
        kept = [c for c in ids if c in contributions]
        if not kept:
            log.warning("round %d: every update was rejected; model unchanged", r)
            return m_hat
        # SF16: FedAvg weights n_j over the round's remaining contributors (as fedavg computes them)
        weights = torch.tensor([float(self.context.clients.num_samples(c)) for c in kept])
        weights = weights.to(torch.float64)
        weights = weights / weights.sum()
        with backend.phase("AGG"):
            total = backend.weighted_sum([contributions[c] for c in kept], weights)
            aggregate = backend.reveal(total, "aggregate")
        # M_hat <- M_hat - eta_u G_hat^agg
        return m_hat - (aggregate * self.eta_u).to(m_hat.dtype)

    def _estimate(self, cid: int, g_old: Any, v: torch.Tensor) -> Any:
        """SecUE for one client (compact: G_r + B v; two_loop: H^{-1} G_r)."""
        if self.estimator == "compact":
            return self.buffers[cid].estimate_compact(self.backend, g_old, v)
        return self.buffers[cid].estimate_two_loop(self.backend, g_old)

    def _exact(self, m_hat: torch.Tensor, client_ids: Sequence[int], r: int) -> dict[int, Any]:
        """Ask clients for exact updates at M_hat with round r's seeds (SF9), as secrets."""
        if not client_ids:
            return {}
        with self.backend.phase("EXACT"):
            out, rejected = self.gateway.exact(m_hat, list(client_ids), r)
        for cid in client_ids:
            self.requests[cid] += 1
        for cid, reason in sorted(rejected.items()):
            log.warning("round %d: rejected client %d: %s", r, cid, reason)
            self.rejected.append({"round": r, "client_id": cid, "reason": reason})
        return out

    def _push_pairs(
        self,
        exact_shares: dict[int, Any],
        stored: dict[int, Any],
        r: int,
        v: torch.Tensor,
        model_norm: float,
    ) -> None:
        """Push (v, [G_bar] - [G_r]) into each recomputing client's FIFO (SF5)."""
        if not float(v.to(torch.float64).norm()) > DEGENERATE_STEP_RTOL * (1.0 + model_norm):
            for cid in exact_shares:  # SF6: ||v|| ~ 0 gives no pair
                self.buffers[cid].counts.degenerate_step += 1
            return
        with self.backend.phase("UE"):
            for cid, g_bar in exact_shares.items():
                g_old = stored[cid] if cid in stored else self.record.update(r, cid)
                self.buffers[cid].push(self.backend, v, self.backend.sub(g_bar, g_old), model_norm)
