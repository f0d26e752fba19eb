"""Retrain from scratch: FedAvg from the same M_0 with the remaining clients only.

The reference every method is judged against (the "exact unlearning" upper bound): same T, E, lr,
batch size and aggregation rule as the original run, and the original per-(round, client) seeds,
so the remaining clients follow the batch orders they would have used. Under partial
participation each round's participants are the original run's participants of that round minus
the forgotten clients (as the replay methods use them), read from the history's client records;
a round whose participants were all forgotten leaves the model unchanged. Needs no client
update (only M_0 and the client records every policy keeps). On a run trained with TV-stable
sampling (``training.sampling: tv_stable``) each round is re-drawn on the remaining clients with
the run's own deletion-consistent sampler, which is what training without them from scratch
draws (``UnlearnContext.draw``). A sample-level request retrains on the clients' data without
the deleted samples (``serves_samples``). The loop is ``fedunlearn.unlearn.exact.replay_from``
from round 1, which the deletion-ready methods run from a later round.

Trajectory: the result carries the rounds Retrain ran (``UnlearnResult.trajectory``), every
update a real one computed by a remaining client; a round with no remaining participant is a
round with a zero aggregate, so the new history has the run's T rounds (docs/lifecycle.md).

DP Retrain (``dp: true``, on a run trained with DP on its uploads): every round retrains under
the run's own mechanism (``fedunlearn.privacy.reference``: DP-SGD or clip-and-noise) at ε_max
(fixed a priori: the run's stored ε_t were chosen from a server loss that read the forgotten
clients' data), at the clip norm the remaining clients give (the configured one, or ``auto``
recomputed over them: ``UnlearnSession.release_clip_norm``), with noise and Poisson batches of
its own (``release_noise_salt``: the run's rounds' noise drawn again with other data would
cancel in the difference of the two releases, and shared batches are not independent draws).
Its model is a DP release: ``details`` say so (``released_model_dp``) with the fresh rounds'
ledger, and ``fedunlearn apply`` recomputes its status and a-priori ε from the method, its
parameters and the run (``dp_release``; docs/privacy.md, "A living DP run").

Deviation: [REC] resampling a fraction of the *remaining* clients (the earlier behaviour) gave a
different set, and a different number, of participants each round than the run had, so Retrain
differed from the original even when the forgotten client never took part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from fedunlearn.config import PrivacyConfig
from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.fl.clients import RunClients
from fedunlearn.privacy.ledger import privacy_summary, round_scalars
from fedunlearn.privacy.releases import DPRelease
from fedunlearn.unlearn.base import (
    Details,
    MethodParams,
    RunOutput,
    Unlearner,
    UnlearnRequest,
)
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.exact import replay_from, replay_shards
from fedunlearn.unlearn.registry import register


class RetrainParams(MethodParams):
    """Retrain's options."""

    dp: bool = Field(
        False,
        description="DP Retrain: train under the run's DP mechanism, every round at eps_max (a "
        "run trained with DP on its uploads); the released model is DP",
    )


@dataclass(frozen=True)
class RetrainDetails(Details):
    """What a DP Retrain released (``dp: true``; plain Retrain has no details).

    Attributes:
        released_model_dp: True: every round trained under the run's mechanism.
        released_model_reason: Why.
        privacy: ``unlearning_privacy``: the fresh rounds' own ledger (``rounds``,
            ``fresh_total_epsilon`` realised, ``fresh_guarantee_epsilon`` a priori with every
            round at ε_max, both PLD at the run's δ).
    """

    released_model_dp: bool = True
    released_model_reason: str = ""
    privacy: dict[str, Any] = field(default_factory=dict)


@register("retrain")
class Retrain(Unlearner[RetrainParams]):
    """Federated retraining from M_0 without the forgotten clients."""

    reads_round_models = False  # M_0 (or the last model) and updates only
    reads_stored_rounds = False  # M_0 and the client records: serves any generation

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    serves_samples = True  # retrains on the reduced data
    serves_shards = True  # retrains every shard
    params_type = RetrainParams

    @classmethod
    def dp_release(cls, params: MethodParams, privacy: PrivacyConfig) -> DPRelease | None:
        """``dp: true`` on a run whose uploads trained under DP: every round at ε_max."""
        if not (
            isinstance(params, RetrainParams)
            and params.dp
            and privacy.enabled
            and privacy.dp_scope == "train_and_store"
        ):
            return None
        return DPRelease(
            rounds="run",
            reason=f"DP Retrain: every round retrained under the run's mechanism "
            f"({privacy.mechanism}) at ε_max with noise of its own",
        )

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Only M_0 must be kept."""
        return context.initial_params.numel() * 4

    def check_history(self, context: UnlearnContext) -> None:
        """Also refuse ``dp: true`` on a run whose uploads were not trained under DP."""
        super().check_history(context)
        if self.params.dp and context.private_clients is None:
            raise UnsupportedHistoryError(
                "retrain dp=true retrains under the run's DP mechanism; this run was not "
                "trained with DP on its uploads (privacy.enabled with dp_scope "
                "train_and_store), so there is none to re-run. Use retrain without dp."
            )

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        if not self.params.dp:
            return self._retrain(request, context, context.clients)
        privacy = context.privacy
        assert context.private_clients is not None  # check_history refused otherwise
        # ε_max every round (privacy.reference), and its own noise and batches: the run's
        # rounds' noise again, with other data, would cancel out
        private = context.private_clients(
            None, noise_salt=context.release_noise_salt(self.name, request.forget)
        )
        try:
            out = self._retrain(request, context, private.clients)
            stats = private.stats()
        finally:
            private.close()
        fresh = privacy_summary(
            privacy, [round_scalars(stats[r], privacy.delta) for r in sorted(stats)]
        )
        guarantee = fresh.get("epsilon_guarantee") or {}
        details = RetrainDetails(
            released_model_reason=f"every round retrained under the run's mechanism "
            f"({privacy.mechanism}) at ε_max with noise of its own: (ε, δ)-DP at the "
            "composition of the run's rounds and these (fresh_guarantee_epsilon, a priori, "
            "replace-one)",
            privacy={
                "unlearning_privacy": {
                    "mechanism": privacy.mechanism,
                    "retrained_rounds": len(stats),
                    "epsilon_per_round": [stats[r].epsilon for r in sorted(stats)],
                    "clip_norm": fresh.get("clip_norm"),
                    "fresh_total_epsilon": fresh.get("total_epsilon") or 0.0,
                    "fresh_guarantee_epsilon": guarantee.get("pld_epsilon", 0.0),
                    "delta": privacy.delta,
                    "neighbour_relation": guarantee.get("neighbour_relation"),
                    "basis": "the retrained rounds alone, every one at ε_max (fixed a priori), "
                    "composed by PLD at replace-one",
                }
            },
        )
        return RunOutput(out.params, out.round_metrics, details, out.trajectory)

    def _retrain(
        self, request: UnlearnRequest, context: UnlearnContext, clients: RunClients
    ) -> RunOutput:
        shards = context.training.shards
        if shards is not None:  # every shard from M_0
            return replay_shards(context, request, dict.fromkeys(shards.shards, 1), clients)
        return replay_from(context, request, 1, clients)
