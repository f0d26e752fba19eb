"""FedEraser: replay the retained rounds with calibration training by the remaining clients.

Steps: retained rounds 1, 1 + Δt, 1 + 2Δt, ... <= T (the run's ``every`` policy, or any subset
of an ``all`` run) and E_cali = ceil(r E_loc); from M_0, apply the first retained round's stored
updates uncalibrated, then for every later one: calibration training (E_cali epochs from the
current model), update calibrating (stored norm, fresh direction), calibrated update
aggregating (the run's rule) and unlearned model updating (``unlearn.replay``).

Paper: Liu, Ma, Yang, Wang, Liu, "FedEraser: Enabling Efficient Client-Level Data Removal from
Federated Learning Models", IWQoS 2021, arXiv:2012.13891, the design section's four steps and
its algorithm listing.
Deviations (docs/methods/baselines.md):
    FE1 [FIX] the aggregate is the weighted mean: the printed extra 1/(K-1) factor is dropped.
    FE2 the run's aggregation rule is used. FE3 norm scope: the whole vector by default (the
    project issue's choice); ``norm_scope="layer"`` calibrates per parameter tensor as the
    authors' code does. FE4 the first retained round is uncalibrated (the text, not the
    listing). FE5 E_cali = ceil(r E_loc). FE6 Δt defaults to the recorded interval.

Trajectory: the replayed rounds, in order, are rounds 1..L of the result's trajectory (L = the
retained rounds that had a remaining participant); the calibrated updates are marked estimated,
the first round's stored ones are not (docs/lifecycle.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import Field

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.history.store import run_meta_of
from fedunlearn.unlearn.base import Details, MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.replay import calibrated_replay
from fedunlearn.unlearn.trajectory_log import TrajectoryLog


class FedEraserParams(MethodParams):
    """FedEraser hyperparameters."""

    interval: int | None = Field(
        None, ge=1, description="Δt; default: the run's history.every (policy every) or 1"
    )
    calibration_ratio: float = Field(0.5, gt=0, le=1, description="r = E_cali / E_loc")
    norm_scope: Literal["model", "layer"] = "model"


@dataclass(frozen=True)
class FedEraserDetails(Details):
    """What ``federaser`` did.

    Attributes:
        retained_rounds: The replayed rounds 1, 1 + Δt, ... (ascending).
        calibration_epochs: E_cali, the local epochs of each calibration training.
    """

    retained_rounds: tuple[int, ...]
    calibration_epochs: int


@register("federaser")
class FedEraser(Unlearner[FedEraserParams]):
    """Calibrated replay of the retained rounds (every Δt-th round) from M_0."""

    reads_round_models = False  # M_0 (or the last model) and updates only

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    params_type = FedEraserParams
    required_policies = frozenset({"all", "every"})

    def retained_rounds(self, context: UnlearnContext) -> list[int]:
        """Return rounds 1, 1 + Δt, ... up to T (Δt: the parameter, else Deviation FE6)."""
        every = run_meta_of(context.history).history_every
        run_every = (every or 1) if context.history.policy == "every" else 1
        interval = self.params.interval or run_every
        if interval % run_every:
            raise UnsupportedHistoryError(
                f"federaser with interval {interval} needs updates of rounds 1, "
                f"{1 + interval}, ...; this run kept every {run_every}th round. "
                f"Use interval={run_every} (or a multiple)."
            )
        return list(range(1, context.num_rounds + 1, interval))

    def check_history(self, context: UnlearnContext) -> None:
        """Also check the interval fits the recorded rounds."""
        super().check_history(context)
        self.retained_rounds(context)

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Every client's delta of the retained rounds, plus M_0."""
        d = context.initial_params.numel()
        clients = len(run_meta_of(context.history).client_sizes)
        return (clients * len(self.retained_rounds(context)) + 1) * d * 4

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        rounds = self.retained_rounds(context)
        epochs = math.ceil(self.params.calibration_ratio * context.clients.spec.epochs)
        trajectory = TrajectoryLog(context)
        params, rows = calibrated_replay(
            context,
            rounds,
            start_params=context.start_from(0),
            spec=replace(context.clients.spec, epochs=epochs),
            scope=self.params.norm_scope,
            first_uncalibrated=True,
            trajectory=trajectory,
        )
        return RunOutput(
            params,
            rows,
            FedEraserDetails(tuple(rounds), epochs),
            trajectory.trajectory(request.forget),
        )
