"""Run unlearning methods on one finished run and judge them on the same measures.

``compare_methods`` runs the requested methods plus the no-unlearning control (``none``) and the
reference (``retrain``) on one request, scores each with ``fedunlearn.eval.judge.Judge`` and
returns the ``results.json`` document (``docs/results_format.md``); ``unlearn_one`` runs one
method and returns its result with a JSON summary. Rendering (tables, plots) is
``fedunlearn.report``'s job.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fedunlearn
from fedunlearn.eval.judge import Judge, finite_or_none
from fedunlearn.runs import run_privacy
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method

__all__ = ["RESULTS_SCHEMA_VERSION", "compare_methods", "unlearn_one"]

RESULTS_SCHEMA_VERSION = 1


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
                {k: finite_or_none(v) for k, v in r.items()} for r in result.round_metrics
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
            **{k: finite_or_none(v) for k, v in quality.items()},
            "stored_bytes": unlearner.history_bytes_needed(session.context(request)),
            "costs": result.costs.to_dict(),
            "round_metrics": [
                {k: finite_or_none(v) for k, v in r.items()} for r in result.round_metrics
            ],
            "details": result.details.to_dict(),
            "privacy": {
                k: v for k, v in run_privacy(session.config, session.store).items() if k != "rounds"
            },
        }
    return result, summary
