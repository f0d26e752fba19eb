"""Calibrated replay: rebuild a model from stored rounds with fresh directions and stored norms.

Shared by FedEraser, the random-rounds baseline and Crab. For each replayed round t, the
remaining clients that took part in t train from the current unlearned model; each fresh delta
keeps its direction and takes the norm of the client's stored delta of round t (whole vector or
per parameter tensor); the calibrated deltas are aggregated with the run's rule and applied.

Paper: Liu et al., "FedEraser: Enabling Efficient Client-Level Data Removal from Federated
Learning Models", IWQoS 2021, the design section's four steps (calibration training, update
calibrating, calibrated update aggregating, unlearned model updating).
Deviations (docs/methods/baselines.md): FE1 [FIX] the aggregate has no extra 1/(K-1) factor;
FE3 norm scope ``model`` or ``layer``; FE4 ``first_uncalibrated``; FE7 participants are the
remaining clients with a stored accepted update, a fresh delta with norm < 1e-12 is calibrated
to zero, and a round with no participant is skipped. Crab (Jiang et al., arXiv:2401.08216v2)
Sec. IV-B3, Eqs. 7-10 runs the same steps with per-client whole-vector calibration and the run's
rule weighted by n_c over the replayed clients ([CB14] in docs/methods/crab.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.history.store import run_meta_of
from fedunlearn.history.trajectory import ESTIMATED_KEY
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.trajectory_log import TrajectoryLog

log = logging.getLogger(__name__)

EPS = 1e-12


def calibrate(
    stored: torch.Tensor,
    fresh: torch.Tensor,
    scope: str = "model",
    layer_sizes: Sequence[int] = (),
) -> torch.Tensor:
    """Return ``||stored|| * fresh / ||fresh||`` over the whole vector or per parameter tensor."""
    if scope == "model":
        chunks_s, chunks_f = [stored], [fresh]
    elif scope == "layer":
        chunks_s, chunks_f = stored.split(list(layer_sizes)), fresh.split(list(layer_sizes))
    else:
        raise ValueError(f"norm scope must be 'model' or 'layer'; got {scope!r}")
    out = []
    for s, f in zip(chunks_s, chunks_f, strict=True):
        f_norm = float(f.norm())
        if f_norm < EPS:
            log.info("calibration: a fresh update has norm %.3g; calibrated to zero", f_norm)
            out.append(torch.zeros_like(f))
        else:
            out.append(f * (float(s.norm()) / f_norm))
    return torch.cat(out)


def calibrate_to(norm: float, fresh: torch.Tensor) -> torch.Tensor:
    """Return ``norm * fresh / ||fresh||``: ``calibrate``'s whole-vector scope, given the norm.

    Bit for bit ``calibrate(stored, fresh)`` when ``norm == float(stored.norm())``.
    """
    f_norm = float(fresh.norm())
    if f_norm < EPS:
        log.info("calibration: a fresh update has norm %.3g; calibrated to zero", f_norm)
        return torch.zeros_like(fresh)
    return fresh * (norm / f_norm)


def records_describe_stored_updates(context: UnlearnContext) -> bool:
    """Whether the records' values of an update (norm, ||.||_inf) are those of its stored copy.

    ``RunMeta.records_describe_stored_updates`` of the run: true for float32 storage and for a
    float16 store whose recorder took the records of the copies it stores; false for a float16
    run recorded before that (its records describe the float32 deltas).
    """
    return run_meta_of(context.history).records_describe_stored_updates


def recorded_norms(context: UnlearnContext, round_: int) -> dict[int, float]:
    """Client -> ||stored delta|| of ``round_``, from the records (``ClientRecord.norm``).

    The recorder computes the norm from the very tensor it stores, upcast as ``read_update``
    reads it (``float(delta.norm())``), so a stored update's record gives its norm without
    reading its payload. Records without a norm (a DP store whose uploads were clean keeps
    none) are left out, and so is every record of a run whose records do not describe its
    stored copies (``records_describe_stored_updates``): their updates are read.
    """
    if not records_describe_stored_updates(context):
        return {}
    return {
        r.client_id: r.norm
        for r in context.history.client_records(round_)
        if r.stored and r.status == "accepted" and r.norm is not None
    }


def stored_participants(context: UnlearnContext, round_: int) -> list[int]:
    """Remaining clients whose delta of ``round_`` is stored, sorted."""
    remaining = set(context.clients.client_ids)
    return sorted(
        r.client_id
        for r in context.history.client_records(round_)
        if r.client_id in remaining and r.status == "accepted" and r.stored
    )


def calibrated_replay(
    context: UnlearnContext,
    rounds: Sequence[int],
    *,
    start_params: torch.Tensor,
    spec: LocalTrainingSpec,
    scope: str = "model",
    first_uncalibrated: bool = False,
    participants: Mapping[int, Sequence[int]] | None = None,
    trace: list[dict[str, Any]] | None = None,
    trajectory: TrajectoryLog | None = None,
) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """Replay ``rounds`` (in order) from ``start_params`` with calibrated fresh updates.

    Args:
        context: The unlearning context.
        rounds: Toolkit rounds (1-based) whose stored deltas give the step norms.
        start_params: The model the replay starts from (M_0 for FedEraser).
        spec: Local training of the calibration (FedEraser: E_cali epochs).
        scope: ``model`` (whole-vector norm) or ``layer`` (per parameter tensor).
        first_uncalibrated: Apply the first round's stored deltas as they are (FedEraser's first
            retained round: from M_0 they carry no influence of the forgotten clients).
        participants: Round -> clients to replay (remaining, with a stored delta); default:
            every remaining client with a stored delta of the round (Crab passes its selection).
        trace: If given, one dict per replayed round is appended: ``round``, ``params`` (the
            model after it), ``step_norm`` (of the applied aggregate), ``sigma_sum`` (sum over
            clients of ``n_c / n_P * ||stored|| / ||fresh||``) and ``max_stored_norm`` /
            ``max_fresh_norm`` (Crab's bound calculator).
        trajectory: If given, each replayed round is appended to it (a skipped round is not):
            calibrated updates are marked estimated; the stored updates of an uncalibrated first
            round keep the stored record's mark.

    Returns:
        The replayed model and one metrics row per replayed round.
    """
    params = start_params.clone()
    rows: list[dict[str, float]] = []
    parameters = context.clients.model.parameters() if scope == "layer" else ()
    layer_sizes = [p.numel() for p in parameters]  # per-tensor calibration (FE3)
    for j, round_ in enumerate(rounds):
        if participants is None:
            ids = stored_participants(context, round_)
        else:
            ids = sorted(set(participants.get(round_, ())) & set(context.clients.client_ids))
        if not ids:
            log.warning("round %d: no remaining client has a stored update; skipped", round_)
            continue
        norms: list[tuple[int, float, float]] = []
        if j == 0 and first_uncalibrated:
            steps = [(cid, context.history.read_update(round_, cid)) for cid in ids]
            estimated = {
                r.client_id
                for r in context.history.client_records(round_)
                if r.scalars.get(ESTIMATED_KEY) is True
            }
        else:
            estimated = set(ids)
            fresh = context.clients.train(TrainTask(params, ids, round_, spec=spec))
            recorded = recorded_norms(context, round_) if scope == "model" else {}
            steps = []
            for u in fresh:
                if u.client_id in recorded:  # ||stored delta||, without reading it
                    stored_norm = recorded[u.client_id]
                    # the result still depends on that update: its lineage says so
                    if (reads := context.read_log) is not None:
                        reads.record("update", round_, u.client_id)
                    steps.append((u.client_id, calibrate_to(stored_norm, u.delta)))
                else:
                    stored = context.history.read_update(round_, u.client_id)
                    stored_norm = float(stored.norm())
                    steps.append((u.client_id, calibrate(stored, u.delta, scope, layer_sizes)))
                if trace is not None:
                    norms.append((u.client_id, stored_norm, float(u.delta.norm())))
        step = context.aggregate(steps)
        params = params + step
        row = context.end_round(round_, params)
        rows.append(row)
        if trajectory is not None:
            trajectory.add(params, step, steps, estimated=estimated, scalars=row)
        if trace is not None:
            n_p = sum(context.clients.num_samples(c) for c, _, _ in norms)
            trace.append(
                {
                    "round": round_,
                    "params": params,
                    "step_norm": float(step.norm()),
                    "sigma_sum": sum(
                        context.clients.num_samples(c) / n_p * s / max(f, EPS) for c, s, f in norms
                    ),
                    "max_stored_norm": max((s for _, s, _ in norms), default=0.0),
                    "max_fresh_norm": max((f for _, _, f in norms), default=0.0),
                }
            )
    return params, rows
