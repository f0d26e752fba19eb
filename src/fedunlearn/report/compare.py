"""Run unlearning methods on one finished run and judge them on the same measures.

Each method's row (the ``results.json`` format, documented in ``docs/results_format.md``):
test accuracy; backdoor ASR on triggered non-target test inputs and on the forgotten clients'
own triggered data; membership inference on the forgotten clients' data (shadow-model attack:
member rate, AUC, precision, recall; loss-threshold attack AUC); L2 and cosine distance to the
retrained model; the history the method needs kept; the cost ledger. Fractions are in [0, 1];
a figure that does not apply is ``None``. Retrain and the no-unlearning control always run: the
first is the reference for distances, the second the control row.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

import fedunlearn
from fedunlearn.eval.backdoor import client_backdoor_success_rate
from fedunlearn.eval.distance import cosine_similarity, l2_distance
from fedunlearn.eval.mia import ShadowAttack, ShadowSpec, loss_threshold_attack
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientData
from fedunlearn.runs import run_privacy
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method

RESULTS_SCHEMA_VERSION = 1


def _clean(value: Any) -> Any:
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
        return {k: _clean(v) for k, v in row.items()}


def _ordered(methods: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(methods))
    for required, pos in (("retrain", 0), ("none", 0)):
        if required not in names:
            names.insert(pos, required)
    names.sort(key=lambda n: (n != "none", n != "retrain"))  # control, reference, then the rest
    return names


def compare_methods(
    run_dir: str | Path,
    forget: Sequence[int],
    methods: Sequence[str],
    *,
    params: dict[str, dict[str, Any]] | None = None,
    kind: str = "forget",
    seed: int = 0,
    progress: Any = None,
) -> dict[str, Any]:
    """Run ``methods`` (plus ``none`` and ``retrain``) on a run and return the results document.

    Args:
        run_dir: A finished run directory.
        forget: Client ids to remove.
        methods: Registered method names.
        params: Per-method hyperparameters, ``{"federaser": {"calibration_ratio": 1.0}}``.
        kind: ``forget`` or ``recover``.
        seed: Seed of the evaluation (shadow models, MIA split).
        progress: Optional callable ``(method_name) -> None`` told before each method runs.

    Returns:
        The ``results.json`` document (see ``docs/results_format.md``).
    """
    params = params or {}
    names = _ordered(methods)
    unlearners = {n: make_method(n, params.get(n)) for n in names}  # validate before work
    request = UnlearnRequest.of(forget, kind)
    started = time.perf_counter()
    with UnlearnSession(run_dir) as session:
        session.check_request(request)
        for method in unlearners.values():  # unsupported history fails before any work
            method.check_history(session.context(request))
        judge = Judge(session, request, seed)
        results: dict[str, UnlearnResult] = {}
        for name in ["retrain", *[n for n in names if n != "retrain"]]:
            if progress is not None:
                progress(name)
            results[name] = session.run(unlearners[name], request)
            if name == "retrain":
                judge.retrain_params = results[name].params
        rows = []
        retrain_epochs = results["retrain"].costs.client_epochs
        for name in names:
            result = results[name]
            row = judge.judge(result)
            row["stored_bytes"] = unlearners[name].history_bytes_needed(session.context(request))
            row["epoch_saving_vs_retrain"] = (
                retrain_epochs / row["client_epochs"] if row["client_epochs"] else None
            )
            row["params"] = unlearners[name].params.model_dump(mode="json")
            row["round_metrics"] = [
                {k: _clean(v) for k, v in r.items()} for r in result.round_metrics
            ]
            row["details"] = result.details.to_dict()
            variant = getattr(result.details, "variant", None)
            if variant is not None:  # e.g. fedadp on a run trained without DP
                row["label"] = f"{name} ({variant})"
            rows.append(row)
        config = session.config.model_dump(mode="json")
        malicious = sorted(session.malicious)
        privacy = run_privacy(session.config, session.store)
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "fedunlearn_version": fedunlearn.__version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "run_dir": str(run_dir),
        "request": {"forget": sorted(request.forget), "kind": request.kind},
        "malicious_clients": malicious,
        "wall_seconds": time.perf_counter() - started,
        "methods": rows,
        "config": config,
        "privacy": {k: v for k, v in privacy.items() if k != "rounds"},
    }


def unlearn_one(
    run_dir: str | Path,
    forget: Sequence[int],
    method: str,
    *,
    params: dict[str, Any] | None = None,
    kind: str = "forget",
) -> tuple[UnlearnResult, dict[str, Any]]:
    """Run one method and return its result with a JSON summary (metrics and costs)."""
    unlearner = make_method(method, params)
    request = UnlearnRequest.of(forget, kind)
    with UnlearnSession(run_dir) as session:
        result = session.run(unlearner, request)
        quality = session.setup.evaluate(result.params)
        summary = {
            "method": method,
            "request": {"forget": sorted(request.forget), "kind": kind},
            "params": unlearner.params.model_dump(mode="json"),
            **{k: _clean(v) for k, v in quality.items()},
            "stored_bytes": unlearner.history_bytes_needed(session.context(request)),
            "costs": result.costs.to_dict(),
            "round_metrics": [{k: _clean(v) for k, v in r.items()} for r in result.round_metrics],
            "details": result.details.to_dict(),
            "privacy": {
                k: v for k, v in run_privacy(session.config, session.store).items() if k != "rounds"
            },
        }
    return result, summary
