"""FedADP unlearning: replay the stored rounds from M_0 with projection-calibrated fresh updates.

Steps, in the order ``FedADP._run`` calls them:

1. ``selection``: the stored rounds τ_1 < ... < τ_T' and their stored clients C_τ. On a run
   recorded with ``history.policy: fedadp`` they are what the store holds; on a run recorded
   with ``all`` they are derived with the same ``StageSelector`` the live policy uses (the
   run's ``history.fedadp`` options or the overrides given here; AD16).
2. Replay (Alg. 2): from M_0, for each τ, the remaining stored clients C_τ minus C_u train
   from the current model (the run's E, η, B and its seeds of round τ) and return ĝ; each is
   calibrated against the stored (noisy) update ḡ by Eq. 10-11, in its projection form
   ``U = (<ḡ, ĝ> / ||ĝ||²) ĝ`` (= cos θ · ||ḡ|| / ||ĝ|| · ĝ); the run's aggregation rule combines
   them with weights n_c over the round's participants (Eq. 12) and the model steps.
3. Final tuning (AD23): FedAvg rounds of the remaining clients after the replay, sized by
   the shared rule of :mod:`fedunlearn.unlearn.tuning` (Crab's) within ``epoch_budget`` x
   Retrain's client epochs: ``final_rounds: auto`` does so on a DP-noised history only.
4. Reporting: the variant (``FedADP``, or ``FedADP-without-DP`` on a run trained without
   ``privacy.enabled``), the privacy ledger of the run with each artefact's guarantee and
   whether the released model is DP (``released_model_dp``), the effective step ratio
   Σ||U|| / Σ||ĝ||, the stored update fraction.

Paper: Jiang, Tong, Liu, Ye, Tan, Lam, "Efficient Federated Unlearning with Adaptive Differential
Privacy Preservation" (FedADP), Sec. IV-C, Alg. 2, Eq. 10-12. Design note and the deviation
tags below: docs/methods/fedadp.md.

Deviations:
    [REC] Start from the stored initial model M_0 (``init="initial"``, AD8);
        ``"first_selected"`` starts from the global model after the first stored round.
    [REC] ||ĝ|| = 0 or ||ḡ|| = 0 gives U = 0; cos θ < 0 is kept (literal) unless
        ``clamp_negative_cos`` (AD11). Inner products in float64.
    [REC] Fresh updates are not clipped or noised (Alg. 2 as printed, AD9); ``unlearn_dp``
        trains them under the run's mechanism so the released model is DP (AD25):
        client_update clips to the release's S (``context.release_clip_norm``) and noises at
        ε_max (fixed a priori, issue 40), seeds ``derive_seed(seed, "fedadp_unlearn_noise",
        τ, c)``; dp_sgd trains by DP-SGD at
        ``unlearn_epsilon`` per round through ``context.private_clients`` (salt
        ``UNLEARN_DP_SALT``). Fresh updates are never stored.
    [REC] Eq. 12's D^- is the data of the round's participants (weights sum to 1, AD10).
        A round whose stored clients are all forgotten is skipped.
    [REC] Server step η_s = 1 (the toolkit's M_{t+1} = M_t + A(deltas)); deltas throughout, so
        U is a delta and the paper's M - η U is M + U here (AD15).
    [REC] On an ``all`` run without the ``clients_loss`` round metric (trained without privacy
        and without the fedadp policy), the stage trigger uses the loss on the clean reference
        set R (AD3's server-held validation option).
    [REC] ``calibration="fresh"`` (ĝ as is) and ``"norm"`` (FedEraser's ||ḡ|| ĝ / ||ĝ||) are
        ablations that isolate Eq. 11's cos θ factor (AD19).
    [REC] ``calibration="auto"`` (default) is ``fresh`` on a DP-noised history (a DP run) and
        Eq. 11 otherwise: under DP, Eq. 11 shrinks each step to ~0.29 of ĝ (AD24);
        ``preset="paper"`` keeps Eq. 11 everywhere and no final tuning.
    [REC] Final tuning after the replay, ``final_rounds="auto"`` on a DP-noised history (AD23).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
from torch.nn import functional as F  # noqa: N812

from fedunlearn.config import PrivacyConfig
from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.history.store import run_meta_of
from fedunlearn.privacy.accountant import totals
from fedunlearn.privacy.budget import epsilon_bounds
from fedunlearn.privacy.guarantees import dp_sgd_unlearning_ledger, unlearned_model_guarantee
from fedunlearn.privacy.ledger import SCALAR_KEYS, privacy_summary
from fedunlearn.privacy.mechanisms import noise_multiplier, noise_std, privatize
from fedunlearn.privacy.releases import DPRelease
from fedunlearn.unlearn.base import Details, MethodParams, RunOutput, UnlearnRequest
from fedunlearn.unlearn.context import PrivateClients, UnlearnContext
from fedunlearn.unlearn.fedadp.params import FedADPParams, fedadp_options
from fedunlearn.unlearn.fedadp.policy import LOSS_KEY, Stage, StageSelector
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.selection import Selection, SelectiveReplay, StoredRound
from fedunlearn.unlearn.tuning import final_round_count, final_tuning

log = logging.getLogger(__name__)

# Samples of the clean reference set that stands in for the server loss on an 'all' run trained
# without it (the same seeded subsample as Crab's R at its default size).
REFERENCE_SIZE = 2000
#: Seed salt of DP-SGD fresh updates (``unlearn_dp`` on a dp_sgd run): their batches and noise
#: differ from the stored round's, whose release they would otherwise repeat.
UNLEARN_DP_SALT = 24


def project(
    stored: torch.Tensor, fresh: torch.Tensor, *, clamp_negative_cos: bool = False
) -> tuple[torch.Tensor, float]:
    """Return (U, cos θ) with U = (<ḡ, ĝ> / ||ĝ||²) ĝ, the projection form of Eq. 11.

    U = 0 when ||ĝ|| = 0 or ||ḡ|| = 0, or when cos θ < 0 and ``clamp_negative_cos``.
    """
    g = fresh.to(torch.float64)
    gb = stored.to(torch.float64)
    gg = float(g @ g)
    gb_norm = float(gb.norm())
    if gg == 0.0 or gb_norm == 0.0:
        return torch.zeros_like(fresh, dtype=torch.float32), 0.0
    inner = float(gb @ g)
    cos = inner / (gb_norm * gg**0.5)  # Eq. 10
    if clamp_negative_cos and cos < 0:
        return torch.zeros_like(fresh, dtype=torch.float32), cos
    # Eq. 11: U = cos(theta) ||g_bar|| / ||g_hat|| g_hat = (<g_bar, g_hat> / ||g_hat||^2) g_hat
    return ((inner / gg) * g).to(torch.float32), cos


def calibrate(
    stored: torch.Tensor, fresh: torch.Tensor, mode: str, clamp_negative_cos: bool
) -> tuple[torch.Tensor, float]:
    """Return the calibrated update of ``mode`` (projection, fresh, norm) and cos θ."""
    if mode == "projection":
        return project(stored, fresh, clamp_negative_cos=clamp_negative_cos)
    _, cos = project(stored, fresh)
    if mode == "fresh":
        return fresh.to(torch.float32).clone(), cos
    norm = float(fresh.to(torch.float64).norm())
    if norm == 0.0:
        return torch.zeros_like(fresh, dtype=torch.float32), cos
    return (fresh.to(torch.float64) * (float(stored.to(torch.float64).norm()) / norm)).to(
        torch.float32
    ), cos


@dataclass(frozen=True)
class FedADPDetails(Details):
    """What ``fedadp`` did (JSON keys of round-indexed maps are strings).

    Attributes:
        variant: ``FedADP`` (trained with DP) or ``FedADP-without-DP``.
        trained_with_dp: Whether the run was trained with ``privacy.enabled``.
        privacy: The run's privacy ledger summary and ε_t per round.
        selection_source: ``fedadp`` (stored live) or ``all`` (derived).
        selection_cached: Whether the derived selection was read from the run directory, where
            an earlier request on the same history kept it (``unlearn.derived_cache``).
        selection_options: The effective β, λ, γ.
        stored_rounds: The replayed stored rounds.
        stored_clients: Round -> stored clients.
        num_stored_rounds: How many rounds store updates.
        stored_round_fraction: Stored rounds / T.
        stored_update_fraction: Stored updates / (T C).
        participants: Round -> replayed clients (stored minus the forgotten).
        skipped_rounds: Stored rounds with no remaining client.
        negative_cos_fraction: Share of calibrations with cos θ < 0 (Eq. 10).
        calibration: The calibration applied: ``projection`` (Eq. 11), ``fresh`` or ``norm``
            (``auto`` resolved, AD24).
        local_epochs: Local epochs of the fresh updates.
        timing: Seconds of selection, replay and final tuning.
        preset: ``default`` or ``paper``.
        step_ratio: Σ||U|| / Σ||ĝ|| over every calibrated update: how far the replay steps
            relative to fresh training (1 for ``fresh``).
        final_rounds: FedAvg rounds run after the replay (AD23).
        epoch_budget: The cap of ``final_rounds: auto`` (share of Retrain's client epochs).
        released_model_dp: Whether the unlearned model carries a DP guarantee.
        released_model_reason: Why (or why not), in one sentence.
        stages: The loss stages (rounds, closed, kept) when derived from an ``all`` run.
    """

    variant: str
    trained_with_dp: bool
    privacy: dict[str, Any]
    selection_source: str
    selection_cached: bool = field(compare=False)  # how, not what: the same selection
    selection_options: dict[str, Any]
    stored_rounds: tuple[int, ...]
    stored_clients: dict[str, list[int]]
    num_stored_rounds: int
    stored_round_fraction: float
    stored_update_fraction: float
    participants: dict[str, list[int]]
    skipped_rounds: tuple[int, ...]
    negative_cos_fraction: float
    calibration: str
    local_epochs: int
    timing: dict[str, float] = field(compare=False)  # wall seconds: not part of the result
    preset: str = "default"
    step_ratio: float = 1.0
    final_rounds: int = 0
    epoch_budget: float = 0.5
    released_model_dp: bool = False
    released_model_reason: str = ""
    stages: tuple[dict[str, Any], ...] = ()


@register("fedadp")
class FedADP(SelectiveReplay[FedADPParams]):
    """Calibrated replay of FedADP's stored rounds from M_0 (projection of the stored updates)."""

    params_type = FedADPParams
    required_policies = frozenset({"all", "fedadp"})

    policy = "fedadp"
    overrides = ("beta", "round_ratio", "client_ratio")
    log_type = Stage

    @classmethod
    def dp_release(cls, params: MethodParams, privacy: PrivacyConfig) -> DPRelease | None:
        """``unlearn_dp``: every replayed round noised under the run's mechanism, no tuning."""
        if not (isinstance(params, FedADPParams) and params.unlearn_dp and privacy.enabled):
            return None
        dp_sgd = privacy.mechanism == "dp_sgd"
        return DPRelease(
            rounds="stored",
            per_round_epsilon=params.unlearn_epsilon if dp_sgd else None,
            local_epochs=params.local_epochs,
            reason="FedADP unlearn_dp: every fresh update of the replay trained under the "
            f"run's mechanism ({privacy.mechanism}) and no final tuning",
        )

    # ----- step 1: the selection ----------------------------------------------------------

    def check_history(self, context: UnlearnContext) -> None:
        """Also refuse unlearn_dp without DP training or private clients (and the base checks)."""
        super().check_history(context)
        if self.params.unlearn_dp and not context.privacy.enabled:
            raise UnsupportedHistoryError(
                "fedadp with unlearn_dp=true needs a run trained with privacy.enabled (its "
                "per-round ε_t and S); drop unlearn_dp or train with a privacy section."
            )
        dp_sgd = context.privacy.mechanism == "dp_sgd"
        if self.params.unlearn_dp and dp_sgd and context.private_clients is None:
            raise UnsupportedHistoryError(
                "fedadp with unlearn_dp=true on a dp_sgd run trains the fresh updates by DP-SGD "
                "at the run's C; this context cannot (no private_clients): open the run with "
                "UnlearnSession (docs/methods/fedadp.md, AD25)."
            )
        if self.params.unlearn_epsilon is not None and not (self.params.unlearn_dp and dp_sgd):
            raise UnsupportedHistoryError(
                "fedadp's unlearn_epsilon is the per-round budget of DP-SGD fresh updates "
                "(unlearn_dp=true on a dp_sgd run); client_update's unlearn_dp uses each "
                "round's stored ε_τ. Drop unlearn_epsilon."
            )

    def check_derivable(self, context: UnlearnContext) -> None:
        """Deriving the stages of an ``all`` run needs the server loss or a reference set."""
        if not context.has_reference_set and LOSS_KEY not in context.history.round_scalars(0):
            raise UnsupportedHistoryError(
                "fedadp derives its selection from an 'all' run with a server loss; this run "
                f"has no '{LOSS_KEY}' metric and the context no reference set R; open the run "
                "with UnlearnSession."
            )

    def _losses(self, context: UnlearnContext) -> list[float]:
        history = context.history
        rounds = range(context.num_rounds + 1)
        scalars = [history.round_scalars(t) for t in rounds]
        if all(LOSS_KEY in sc for sc in scalars):
            return [float(cast(float, sc[LOSS_KEY])) for sc in scalars]
        if not context.has_reference_set:
            raise UnsupportedHistoryError(f"fedadp needs '{LOSS_KEY}' or a reference set R")
        ref = context.reference_set(REFERENCE_SIZE)
        model = context.clients.model
        return [
            float(F.cross_entropy(predict_logits(model, history.read_model(t), ref.x), ref.y))
            for t in rounds
        ]

    def derive_selection(self, context: UnlearnContext, log: list[Any]) -> list[StoredRound]:
        """Run the live policy's ``StageSelector`` over an ``all`` run (log: its stages)."""
        history = context.history
        total = context.num_rounds

        def stored_clients(t: int) -> tuple[int, ...]:
            records = history.client_records(t)
            return tuple(r.client_id for r in records if r.status == "accepted" and r.stored)

        opts = self.selection_options(context)
        run = fedadp_options(context.recording)
        selector = StageSelector(
            opts["beta"],
            opts["round_ratio"],
            opts["client_ratio"],
            run.model_align,
            run.selection_mode,
            total,
        )
        losses = self._losses(context)
        selector.start(losses[0])
        out = []
        before = history.read_model(0)
        for t in range(1, total + 1):
            after = history.read_model(t)
            updates = {c: history.read_update(t, c) for c in stored_clients(t)}
            kept = selector.observe(
                t,
                before,
                after,
                history.read_model(t, "aggregate"),
                losses[t],
                updates,
                final=t == total,
            )
            out += [StoredRound(r, ids) for r, ids in sorted((kept or {}).items()) if ids]
            before = after
        log.extend(selector.stages)
        return out

    # ----- step 2: replay -------------------------------------------------------------------

    def _noise_std(self, context: UnlearnContext) -> tuple[float, float]:
        """Return (S, std) of a replayed round's clip-and-noise: S of the release, ε_max.

        Fixed a priori and over the remaining clients (issue 40): the budget is ε_max, not the
        stored ε_τ (chosen from a loss on the forgotten clients' data too), and S is the
        configured one or ``auto`` recomputed over the remaining clients
        (``context.release_clip_norm``; the stored one where the context cannot).
        """
        cfg = context.privacy
        clip_norm = context.release_clip_norm() if context.release_clip_norm else None
        if clip_norm is None:
            clip_norm = float(
                cast(float, context.history.round_scalars(1)[SCALAR_KEYS["clip_norm"]])
            )
        z = noise_multiplier(epsilon_bounds(cfg.budget)[1], cfg.delta)
        return clip_norm, noise_std(clip_norm, z, cfg.noise_mode)

    @staticmethod
    def _unlearning_ledger(
        context: UnlearnContext, ledger: dict[str, Any], zeta: float, replayed: int
    ) -> dict[str, Any]:
        """``unlearn_dp``: the replayed rounds' releases composed with the run's (per client).

        Each replayed round releases every replaying client's update once more through the
        training mechanism at ε_max (noise multiplier ``zeta`` = std / S); a client's total
        composes the run's rounds and every replayed round (an upper bound: not every client
        replays). Replace one client's data: sensitivity 2S (factor 2).
        """
        cfg = context.privacy
        train = [float(r["noise_multiplier"]) / 2 for r in ledger.get("rounds", [])]
        replay = [zeta / 2] * replayed
        both = totals(train + replay, cfg.delta, 2) if train else None
        own = totals(replay, cfg.delta, 2) if replay else None
        return {
            "replayed_rounds": replayed,
            "epsilon_per_round": [epsilon_bounds(cfg.budget)[1]] * replayed,
            "fresh_total_epsilon": own.pld_epsilon if own else 0.0,
            # every replayed round at ε_max, fixed before the run: a priori as well
            "fresh_guarantee_epsilon": own.pld_epsilon if own else 0.0,
            "total_epsilon_with_training": both.pld_epsilon if both else None,
            "rdp_epsilon_with_training": both.rdp_epsilon if both else None,
            "neighbour_relation": "replace_one",
            "basis": "replace one client's data (2S): the run's realised rounds and the "
            "replayed rounds (each at ε_max), PLD; the choice of the replayed rounds (FedADP's "
            "stages) reads the non-private loss and is not covered",
        }

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        clock = time.perf_counter()
        p = self.params
        stages: list[Stage] = []
        selected = self.replay_selection(context, stages)
        selection_seconds = time.perf_counter() - clock
        private = None  # AD25: DP-SGD fresh updates at a stated budget (dp_sgd unlearn_dp)
        if p.unlearn_dp and context.privacy.mechanism == "dp_sgd":
            budget = p.unlearn_epsilon or epsilon_bounds(context.privacy.budget)[1]
            if context.private_clients is None:  # check_history refuses this before any work
                raise UnsupportedHistoryError("fedadp unlearn_dp needs context.private_clients")
            private = context.private_clients(lambda _round: budget)
        try:
            return self._replay(
                request, context, selected, stages, private, clock, selection_seconds
            )
        finally:
            if private is not None:
                private.close()

    def _fresh_updates(
        self, context: UnlearnContext, private: PrivateClients | None, task: TrainTask
    ) -> list[ClientUpdate]:
        """The remaining clients' fresh updates of one replayed round (noised if asked)."""
        if private is not None:  # fresh seeds: the stored release's noise is not reused
            return private.clients.train(replace(task, salt=UNLEARN_DP_SALT))
        fresh = context.clients.train(task)
        if not self.params.unlearn_dp:
            return fresh
        clip_norm, std = self._noise_std(context)
        seed = context.clients.seed
        return [
            replace(
                u,
                delta=privatize(
                    u.delta,
                    clip_norm,
                    std,
                    torch_generator(
                        derive_seed(seed, "fedadp_unlearn_noise", task.round, u.client_id)
                    ),
                )[0],
            )
            for u in fresh
        ]

    def _privacy(
        self,
        context: UnlearnContext,
        private: PrivateClients | None,
        replayed: int,
        released_dp: bool,
        released_reason: str,
    ) -> dict[str, Any]:
        """The run's privacy ledger, the unlearning's own, and this result's model's status."""
        p, history = self.params, context.history
        ledger = privacy_summary(
            context.privacy,
            [history.round_scalars(r) for r in range(1, context.num_rounds + 1)],
            context.clients.num_params,
        )
        privacy = {k: v for k, v in ledger.items() if k != "rounds"} | {
            "epsilon_per_round": [r["epsilon"] for r in ledger.get("rounds", [])]
        }
        if private is not None:
            privacy["unlearning_privacy"] = dp_sgd_unlearning_ledger(
                context.privacy, ledger, private.stats()
            )
        elif p.unlearn_dp:
            clip_norm, std = self._noise_std(context)
            privacy["unlearning_privacy"] = self._unlearning_ledger(
                context, ledger, std / clip_norm, replayed
            )
        # one status per artefact: this result's model, not every method's default
        if "artefacts" in privacy:
            privacy["artefacts"] = {
                **privacy["artefacts"],
                "unlearned_model": {"dp": released_dp, "guarantee": released_reason},
            }
        return privacy

    def _replay(
        self,
        request: UnlearnRequest,
        context: UnlearnContext,
        selected: Selection,
        stages: list[Stage],
        private: PrivateClients | None,
        clock: float,
        selection_seconds: float,
    ) -> RunOutput:
        p = self.params
        stored = selected.stored
        forget = request.forget
        history = context.history
        dp_history = context.privacy.enabled  # the stored updates are noised copies
        mode = p.resolved_calibration(dp_history)
        start_round = 0 if p.init == "initial" else stored[0].round
        params = context.start_from(start_round).clone()
        spec = context.clients.spec
        if p.local_epochs is not None:
            spec = replace(spec, epochs=p.local_epochs)
        rows: list[dict[str, float]] = []
        participants: dict[str, list[int]] = {}
        skipped: list[int] = []
        negative = total_cos = 0
        step_norm = fresh_norm = 0.0  # Σ||U||, Σ||ĝ|| (float64)
        for sr in stored:
            ids = [c for c in sr.clients if c not in forget]
            if not ids:
                skipped.append(sr.round)
                log.info("fedadp: round %d has no remaining stored client; skipped", sr.round)
                continue
            participants[str(sr.round)] = ids
            task = TrainTask(params, ids, sr.round, spec=spec)
            fresh = self._fresh_updates(context, private, task)
            steps = []
            for u in fresh:
                update, cos = calibrate(
                    history.read_update(sr.round, u.client_id),
                    u.delta,
                    mode,
                    p.clamp_negative_cos,
                )
                step_norm += float(update.to(torch.float64).norm())
                fresh_norm += float(u.delta.to(torch.float64).norm())
                negative += cos < 0
                total_cos += 1
                steps.append((u.client_id, update))
            params = params + context.aggregate(steps)  # Eq. 12, then M^ <- M^ - eta_s U
            rows.append(context.end_round(sr.round, params))
        replay_seconds = time.perf_counter() - clock - selection_seconds
        final = final_round_count(  # AD23: the shared rule (Crab's), within the epoch budget
            context,
            p.resolved_final_rounds(dp_history),
            p.epoch_budget,
            start_round=start_round,
            replay_sizes=[len(ids) for ids in participants.values()],
            replay_epochs=spec.epochs,
        )
        params, tuning_rows = final_tuning(context, params, final)
        rows.extend(tuning_rows)
        num_clients = len(run_meta_of(history).client_sizes) or len(context.clients.client_ids)
        num_updates = sum(len(s.clients) for s in stored)
        released_dp, released_reason = unlearned_model_guarantee(
            context.privacy, p.unlearn_dp and final == 0
        )
        # noised replayed rounds (client_update unlearn_dp): one per replayed round
        replayed = len(participants) if p.unlearn_dp and private is None else 0
        privacy = self._privacy(context, private, replayed, released_dp, released_reason)
        details = FedADPDetails(
            variant="FedADP" if context.privacy.enabled else "FedADP-without-DP",
            trained_with_dp=context.privacy.enabled,
            privacy=privacy,
            selection_source=history.policy,
            selection_cached=selected.cached,
            selection_options=self.selection_options(context),
            stored_rounds=tuple(s.round for s in stored),
            stored_clients={str(s.round): list(s.clients) for s in stored},
            num_stored_rounds=len(stored),
            stored_round_fraction=len(stored) / context.num_rounds,
            stored_update_fraction=num_updates / (context.num_rounds * num_clients),
            participants=participants,
            skipped_rounds=tuple(skipped),
            negative_cos_fraction=negative / total_cos if total_cos else 0.0,
            calibration=mode,
            local_epochs=spec.epochs,
            timing={
                "selection_seconds": selection_seconds,
                "replay_seconds": replay_seconds,
                "final_seconds": time.perf_counter() - clock - selection_seconds - replay_seconds,
            },
            preset=p.preset,
            step_ratio=step_norm / fresh_norm if fresh_norm > 0 else 0.0,
            final_rounds=final,
            epoch_budget=p.epoch_budget,
            released_model_dp=released_dp,
            released_model_reason=released_reason,
            stages=tuple(
                {"rounds": list(s.rounds), "closed": s.closed, "kept": sorted(s.kept)}
                for s in stages
            ),
        )
        return RunOutput(params, rows, details)
