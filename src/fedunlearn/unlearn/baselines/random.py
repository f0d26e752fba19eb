"""Random round selection: calibrated replay of a random σ-fraction of the rounds.

Steps: draw T' = max(1, round(σ T)) distinct rounds with the method's own seed, sort them, and
replay them from M_0 with ``calibrated_replay`` (full local epochs, whole-vector norms).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal"
(Starfish), §VI-A "Baselines", random round selection: "the servers randomly choose T' rounds,
upon which they initiate the unlearning process".
Deviations (docs/methods/baselines.md):
    RR1 "the unlearning process" is the calibrated replay shared with FedEraser and Crab
    (fresh direction, stored norm), not Starfish's L-BFGS estimation: method packages are
    independent. RR2 T' = max(1, round(σ T)), Starfish uses ceil(σ T). RR3 default σ = 0.5
    (the Starfish experiments: 0.6). RR4 every chosen round is calibrated, with E_loc epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from fedunlearn.unlearn.base import Details, MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.replay import calibrated_replay


class RandomRoundsParams(MethodParams):
    """Random round selection hyperparameters."""

    fraction: float = Field(0.5, gt=0, le=1, description="σ: share of the T rounds replayed")
    seed: int = Field(0, ge=0)


@dataclass(frozen=True)
class RandomRoundsDetails(Details):
    """What ``random`` did.

    Attributes:
        rounds: The replayed rounds, ascending.
    """

    rounds: tuple[int, ...]


@register("random")
class RandomRounds(Unlearner[RandomRoundsParams]):
    """Replay a random σ-fraction of the rounds with calibrated fresh updates."""

    reads_round_models = False  # M_0 (or the last model) and updates only

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    params_type = RandomRoundsParams
    required_policies = frozenset({"all"})

    def chosen_rounds(self, num_rounds: int) -> list[int]:
        """Return the sorted replayed rounds."""
        count = max(1, round(self.params.fraction * num_rounds))
        rng = np.random.default_rng(self.params.seed)
        return sorted(int(r) for r in rng.choice(np.arange(1, num_rounds + 1), count, False))

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        rounds = self.chosen_rounds(context.num_rounds)
        params, rows = calibrated_replay(
            context,
            rounds,
            start_params=context.start_from(0),
            spec=context.clients.spec,
        )
        return RunOutput(params, rows, RandomRoundsDetails(tuple(rounds)))
