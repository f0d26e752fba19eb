"""Judge unlearned models of one run on the same measures: quality, backdoor, membership, distance.

``Judge(session, request)`` fits the membership attack once (shadow models on half of the test
set, the other half as non-members) and then scores any model of the run: test accuracy and loss;
backdoor ASR on triggered non-target test inputs and on the forgotten clients' own triggered
data; membership inference on the forgotten clients' data (shadow-model attack: member rate,
AUC, precision, recall; loss-threshold attack AUC); L2 and cosine distance to the retrained model
once ``retrain_params`` is set; the cost ledger. Fractions are in [0, 1]; a figure that does not
apply is ``None``. Row format: docs/results_format.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fedunlearn.eval.backdoor import client_backdoor_success_rate
from fedunlearn.eval.distance import cosine_similarity, l2_distance
from fedunlearn.eval.mia import ShadowAttack, ShadowSpec, loss_threshold_attack
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientData
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession

__all__ = ["Judge", "finite_or_none"]


def finite_or_none(value: Any) -> Any:
    """Return ``value``, or None for a non-finite float (JSON has no NaN or inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _concat(parts: Sequence[ClientData]) -> ClientData:
    return ClientData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


class Judge:
    """Evaluates unlearned models of one session against the same attacks and references."""

    def __init__(self, session: UnlearnSession, request: UnlearnRequest, seed: int = 0) -> None:
        self.session = session
        self.setup = session.setup
        self.request = request
        forgotten = sorted(request.forget)
        self.forgotten_clean = [self.setup.clean_data(c) for c in forgotten]
        self.forgotten_train = [self.setup.federation.client_data[c] for c in forgotten]
        x_test, y_test = self.setup.x_test, self.setup.y_test
        half = len(y_test) // 2
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(y_test), generator=g)
        shadow_idx, nonmember_idx = perm[:half], perm[half:]
        self.nonmembers = ClientData(x_test[nonmember_idx], y_test[nonmember_idx])
        spec = self.setup.federation.spec
        self.attack = ShadowAttack.fit(
            self.setup.model,
            x_test[shadow_idx],
            y_test[shadow_idx],
            ShadowSpec(
                num_shadows=4,
                training=LocalTrainingSpec(
                    epochs=min(50, max(1, spec.epochs * session.config.training.rounds)),
                    lr=spec.lr,
                    batch_size=spec.batch_size,
                    momentum=spec.momentum,
                    weight_decay=spec.weight_decay,
                ),
            ),
            seed=seed,
        )
        self.members = _concat(self.forgotten_train)
        self.retrain_params: torch.Tensor | None = None

    def judge(self, result: UnlearnResult) -> dict[str, Any]:
        """Return the result row of one method."""
        setup = self.setup
        params = result.params
        quality = setup.evaluate(params)
        row: dict[str, Any] = {
            "method": result.method,
            "test_accuracy": quality["test_accuracy"],
            "test_error": 1 - quality["test_accuracy"],
            "test_loss": quality["test_loss"],
            "backdoor_asr": quality.get("backdoor_asr"),
            "backdoor_asr_forgotten": None,
        }
        if setup.trigger is not None and self.forgotten_clean:
            row["backdoor_asr_forgotten"] = client_backdoor_success_rate(
                setup.model,
                params,
                self.forgotten_clean,
                setup.trigger,
                setup.config.attack.target_label,
            )
        mia = self.attack.evaluate(
            params, self.members.x, self.members.y, self.nonmembers.x, self.nonmembers.y
        )
        loss_mia = loss_threshold_attack(
            setup.model,
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
            }
        )
        if self.retrain_params is not None:
            m0 = self.session.initial_params
            row["distance_to_retrain"] = l2_distance(params, self.retrain_params)
            row["cosine_to_retrain"] = cosine_similarity(params - m0, self.retrain_params - m0)
        else:
            row["distance_to_retrain"] = row["cosine_to_retrain"] = None
        costs = result.costs
        row.update(
            {
                "rounds": costs.rounds,
                "client_participations": costs.client_participations,
                "client_epochs": costs.client_epochs,
                "estimated_updates": costs.estimated_updates,
                "wall_seconds": costs.wall_seconds,
                "history_bytes_read": costs.history_bytes_read,
                "bytes_communicated": costs.bytes_communicated,
            }
        )
        return {k: finite_or_none(v) for k, v in row.items()}


