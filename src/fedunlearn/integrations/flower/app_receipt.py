"""The receipt of an unlearning request on a run whose clients keep their data (a Flower app).

``fedunlearn.eval.Verifier`` judges with the forgotten clients' data on the server (membership
attacks, the client-level test, backdoor ASR on the test set); a run ``Recording`` wrote has
none. ``app_verification`` builds the same receipt (``fedunlearn.eval.receipt.build_verification``)
from what the server can measure: the user's evaluation of the unlearned and the original
model (``UnlearnSession``'s evaluator), the distance to the original, the method's own
warnings and lineage, and the store's deletion evidence. The checks that need the forgotten
clients' data are ``n/a`` with the reason ``not shown: the forgotten client's data is on its
node``; where the client's node was reachable, its own report (``app_unlearn.client_check``:
its mean loss on its data under the original and the unlearned model, computed on the node)
is attached to them as evidence, not graded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.receipt import Attack, Claims, Controls, Evidence, build_verification
from fedunlearn.eval.verifier import deletion_evidence
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession
from fedunlearn.unlearn.base import UnlearnResult
from fedunlearn.unlearn.receipt import Check, Verification

ON_NODE = "not shown: the forgotten client's data is on its node"
DATA_CHECKS = ("membership", "client_membership")


def _row(session: UnlearnSession, params: torch.Tensor) -> dict[str, Any]:
    row: dict[str, Any] = dict(session.evaluation.evaluate(params))
    row["distance_to_original"] = l2_distance(params, session.run_view.final_params)
    return row


def _on_node(check: Check, reports: Mapping[str, Mapping[str, Any]]) -> Check:
    told = []
    for cid, report in sorted(reports.items()):
        if report.get("shown"):
            told.append(
                f"client {cid}'s node reports its mean loss {report['loss_before']:.4g} under "
                f"the original and {report['loss_after']:.4g} under this model (not graded)"
            )
        else:
            told.append(f"client {cid}: {report.get('reason', ON_NODE)}")
    reason = ON_NODE + ("; " + "; ".join(told) if told else "")
    return dataclasses.replace(
        check, reason=reason, evidence={**check.evidence, "on_node": dict(reports)}
    )


def app_verification(
    session: UnlearnSession,
    request: UnlearnRequest,
    result: UnlearnResult,
    reports: Mapping[str, Mapping[str, Any]] | None = None,
) -> Verification:
    """Return the receipt of ``result`` on a run whose data stays on the clients.

    Args:
        session: The run, opened without server-side data (``UnlearnSession(run, evaluator=)``).
        request: The clients removed.
        result: The method's result.
        reports: Each forgotten client's node report (``client_check``), by client id.
    """
    run = session.run_view
    malicious = run.malicious
    details = result.details
    claimed = result.claims()
    evidence = Evidence(
        row=_row(session, result.params),
        controls=Controls(original=_row(session, run.final_params)),
        attack=Attack(
            request_kind=request.kind,
            clients=tuple(sorted(request.forget)),
            backdoor=False,
            attackers_forgotten=len(malicious & request.forget),
            attackers_total=len(malicious),
            kind=run.config.attack.kind if malicious else None,
            private_run=bool(run.config.privacy.enabled),
        ),
        claims=Claims(
            bound=details.certified_bound() if details is not None else None,
            warnings=claimed.warnings,
            warnings_available=details is not None,
            lineage=result.lineage,
            assumptions=claimed.assumptions,
        ),
        deletion=deletion_evidence(run.store, request.forget),
    )
    receipt = build_verification(evidence, subject=result.method)
    checks = tuple(
        _on_node(c, reports or {}) if c.name in DATA_CHECKS and c.verdict == "n/a" else c
        for c in receipt.checks
    )
    return dataclasses.replace(receipt, checks=checks)
