"""Judge unlearned models of one run on the same measures: quality, backdoor, membership, distance.

``Judge(run, evaluation, request)`` reads a session's two views (``session.run_view``,
``session.evaluation``), fits the membership attack once (shadow models on half of the test set,
the other half as non-members) and then scores any model of the run: test accuracy and loss;
backdoor ASR on triggered non-target test inputs and on the forgotten clients' own triggered
data; membership inference on the forgotten clients' *clean* training data against unseen test
data (shadow-model attack: member rate, AUC, precision, recall; loss-threshold attack AUC and
member rate); the L2 distance to the original model and, given the retrained model
(``retrain=``, computed by the caller), L2 and cosine distance to it and the model's position
along the line from Retrain to the original (``toward_original``); the cost ledger. The judge
keeps no reference between calls: the same call gives the same row. Fractions are in [0, 1]; a
figure that does not apply is ``None``. Row format: docs/results_format.md.

Membership protocol: members are the forgotten clients' training samples with their true labels
and no trigger (``EvaluationView.clean_data``). Attacking the poisoned copies a backdoored client
trained on would measure the fit to the poison labels, not membership (a model that forgot them
finds the relabelled samples unlikely, and the AUC fell far below 0.5). The triggered samples serve
the backdoor ASR only. The shadow models train for as many epochs as each sample of the target
saw: local epochs x rounds x participation (capped at ``max_shadow_epochs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from fedunlearn.eval.backdoor import client_backdoor_success_rate
from fedunlearn.eval.distance import cosine_similarity, l2_distance
from fedunlearn.eval.mia import ShadowAttack, ShadowSpec, loss_threshold_attack
from fedunlearn.eval.mia.client_lira import share_toward
from fedunlearn.fl.records import ClientData
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult
from fedunlearn.unlearn.views import EvaluationView, RunView

__all__ = ["Judge", "finite_or_none"]

_MIA_KEYS = (
    "mia_member_rate",
    "mia_auc",
    "mia_precision",
    "mia_recall",
    "mia_loss_auc",
    "mia_loss_member_rate",
    "mia_samples",
    "mia_loss_samples",
)


def finite_or_none(value: Any) -> Any:
    """Return ``value``, or None for a non-finite float (JSON has no NaN or inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _concat(parts: Sequence[ClientData]) -> ClientData:
    return ClientData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


class Judge:
    """Evaluates models of one run against the same attacks and references.

    Args:
        run: What the run is (``session.run_view``).
        evaluation: How its models are judged (``session.evaluation``).
        request: The clients removed (their clean data are the membership attack's members).
        seed: Seed of the attack's split and shadow models.
        max_shadow_epochs: Cap on the shadow models' local epochs.
        attacks: Fit the membership attack (shadow models: training); False leaves the
            membership columns None.
    """

    def __init__(
        self,
        run: RunView,
        evaluation: EvaluationView,
        request: UnlearnRequest,
        seed: int = 0,
        *,
        max_shadow_epochs: int = 100,
        attacks: bool = True,
    ) -> None:
        self.run = run
        self.evaluation = evaluation
        self.request = request
        forgotten = sorted(request.forget)
        self.forgotten_clean = [evaluation.clean_data(c) for c in forgotten]
        x_test, y_test = evaluation.x_test, evaluation.y_test
        half = len(y_test) // 2
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(y_test), generator=g)
        shadow_idx, nonmember_idx = perm[:half], perm[half:]
        self.nonmembers = ClientData(x_test[nonmember_idx], y_test[nonmember_idx])
        spec = run.spec
        training = run.config.training
        # each sample of the target took part in E local epochs per round it was sampled in
        exposures = math.ceil(spec.epochs * run.num_rounds * training.participation)
        self.shadow_epochs = max(1, min(max_shadow_epochs, exposures))
        self.attack: ShadowAttack | None = None
        if not attacks:  # no membership attack: its columns stay None (no shadow training)
            self.members = None
            return
        self.attack = ShadowAttack.fit(
            run.model,
            x_test[shadow_idx],
            y_test[shadow_idx],
            ShadowSpec(
                num_shadows=4,
                # the run's optimiser settings, for shadow_epochs epochs (never a step count)
                training=replace(spec, epochs=self.shadow_epochs, steps=None),
            ),
            seed=seed,
        )
        self.members = _concat(self.forgotten_clean) if self.forgotten_clean else None

    def judge(self, result: UnlearnResult, retrain: torch.Tensor | None = None) -> dict[str, Any]:
        """Return the result row of one method: the model's measures and the cost ledger.

        Args:
            result: The method's result.
            retrain: The retrained model's parameters (distance columns), if computed.
        """
        row = self.measure(result.params, result.method, retrain)
        costs = result.costs
        row.update(
            {
                "rounds": costs.rounds,
                "client_participations": costs.client_participations,
                "client_epochs": costs.client_epochs,
                "estimated_updates": costs.estimated_updates,
                "wall_seconds": costs.wall_seconds,
                "server_seconds": costs.server_seconds,
                "client_train_seconds": costs.client_train_seconds,
                "evaluation_seconds": costs.evaluation_seconds,
                "history_bytes_read": costs.history_bytes_read,
                "bytes_communicated": costs.bytes_communicated,
            }
        )
        return {k: finite_or_none(v) for k, v in row.items()}

    def measure(
        self, params: torch.Tensor, label: str = "model", retrain: torch.Tensor | None = None
    ) -> dict[str, Any]:
        """Return the measures of any model of the run's architecture (no costs).

        Args:
            params: The model's flat parameters.
            label: The row's ``method``.
            retrain: The retrained model's parameters; without them the distance-to-retrain
                columns are None.
        """
        evaluation = self.evaluation
        quality = evaluation.evaluate(params)
        row: dict[str, Any] = {
            "method": label,
            "test_accuracy": quality["test_accuracy"],
            "test_error": 1 - quality["test_accuracy"],
            "test_loss": quality["test_loss"],
            "backdoor_asr": quality.get("backdoor_asr"),
            "backdoor_asr_forgotten": None,
            # the inputs each share was measured on (its confidence interval's n)
            "test_samples": len(evaluation.y_test),
            "backdoor_samples": (
                int((evaluation.y_test != evaluation.target_label).sum())
                if evaluation.trigger is not None
                else None
            ),
        }
        if evaluation.trigger is not None and self.forgotten_clean:
            row["backdoor_asr_forgotten"] = client_backdoor_success_rate(
                evaluation.model,
                params,
                self.forgotten_clean,
                evaluation.trigger,
                evaluation.target_label,
            )
        row.update(dict.fromkeys(_MIA_KEYS))
        if self.members is not None and self.attack is not None:
            mia = self.attack.evaluate(
                params, self.members.x, self.members.y, self.nonmembers.x, self.nonmembers.y
            )
            loss_mia = loss_threshold_attack(
                evaluation.model,
                params,
                self.members.x,
                self.members.y,
                self.nonmembers.x,
                self.nonmembers.y,
            )
            row.update(
                {
                    "mia_member_rate": mia.member_rate,
                    "mia_auc": mia.auc,
                    "mia_precision": mia.precision,
                    "mia_recall": mia.recall,
                    "mia_loss_auc": loss_mia.auc,
                    "mia_loss_member_rate": loss_mia.member_rate,
                    # (members, non-members) each AUC was computed on: its sampling noise
                    "mia_samples": [mia.num_members, mia.num_nonmembers],
                    "mia_loss_samples": [loss_mia.num_members, loss_mia.num_nonmembers],
                }
            )
        row["distance_to_original"] = l2_distance(params, self.run.final_params)
        if retrain is not None:
            m0 = self.run.initial_params
            row["distance_to_retrain"] = l2_distance(params, retrain)
            row["cosine_to_retrain"] = cosine_similarity(params - m0, retrain - m0)
            row["toward_original"] = share_toward(params, retrain, self.run.final_params)
        else:
            row["distance_to_retrain"] = row["cosine_to_retrain"] = None
            row["toward_original"] = None
        return {k: finite_or_none(v) for k, v in row.items()}
