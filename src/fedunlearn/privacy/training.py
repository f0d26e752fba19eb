"""Client-level DP of one training run: the upload mod, the budget schedule and the ledger.

``PrivateTraining`` ties together, for ``train_run``:

1. ``mod``: the ``ClipAndNoise`` update mod (attached to the federation for training only:
   unlearning's fresh updates are not noised unless a method asks, spec A9, and Retrain runs
   without DP, spec §6.3);
2. ``round_scalars``: the ledger entries of the round just trained, merged into its metrics so
   they are committed with the round;
3. ``on_round_end``: a round observer that feeds L(M_t) to the budget schedule (Eq. 4) and
   composes the round's Gaussian event in the accountant;
4. ``resume``: rebuilds the schedule and the accountant from the stored round scalars.

Paper: FedADP (Jiang et al.), Alg. 1; FedADP spec §3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedunlearn.config import PrivacyConfig
from fedunlearn.errors import HistoryError
from fedunlearn.fl.records import RoundRecord
from fedunlearn.privacy.accountant import PrivacyAccountant
from fedunlearn.privacy.ledger import LOSS_KEY, SCALAR_KEYS, round_scalars
from fedunlearn.privacy.schedule import BudgetSchedule
from fedunlearn.privacy.uploads import ClipAndNoise


class PrivateTraining:
    """DP state of a training run.

    Args:
        config: The run's ``privacy`` section (enabled).
        seed: Run seed.
        clip_norm: S (resolved: a number, not ``"auto"``).
    """

    def __init__(self, config: PrivacyConfig, *, seed: int, clip_norm: float) -> None:
        self.config = config
        self.schedule = BudgetSchedule(
            config.epsilon_initial, config.epsilon_min, config.epsilon_max, config.signed_delta
        )
        self.mod = ClipAndNoise(
            clip_norm=clip_norm,
            delta=config.delta,
            noise_mode=config.noise_mode,
            seed=seed,
            epsilon_of=self.schedule.epsilon,
            perturb=config.dp_scope == "train_and_store",
        )
        self.accountant = PrivacyAccountant()

    @property
    def clip_norm(self) -> float:
        """S."""
        return self.mod.clip_norm

    def round_scalars(self, round_: int) -> dict[str, Any]:
        """Return the ledger entries of ``round_`` (empty if the mod did not run in it)."""
        noise = self.mod.stats.get(round_)
        return round_scalars(noise, self.config.delta) if noise is not None else {}

    def latest_scalars(self) -> dict[str, Any]:
        """Return the ledger entries of the most recent round the mod ran in (``{}`` if none)."""
        return self.round_scalars(max(self.mod.stats)) if self.mod.stats else {}

    def on_round_end(self, record: RoundRecord) -> None:
        """Feed L(M_round) to the schedule; compose the round's Gaussian event."""
        if LOSS_KEY not in record.metrics:
            raise HistoryError(f"round {record.round} has no '{LOSS_KEY}' metric for the budget")
        self.schedule.observe(record.round, float(record.metrics[LOSS_KEY]))
        noise = self.mod.stats.get(record.round)
        if noise is not None:
            self.accountant.compose(noise.noise_multiplier / self.config.sens_factor)

    def resume(self, scalars: Sequence[Mapping[str, Any]]) -> None:
        """Rebuild the schedule and accountant from the scalars of rounds 0..last."""
        missing = [r for r, sc in enumerate(scalars) if LOSS_KEY not in sc]
        if missing:
            raise HistoryError(
                f"rounds {missing} have no '{LOSS_KEY}' scalar; this run was not trained with "
                "privacy enabled and cannot be resumed with it"
            )
        self.schedule.reset([float(sc[LOSS_KEY]) for sc in scalars])
        self.accountant = PrivacyAccountant()
        key = SCALAR_KEYS["noise_multiplier"]
        for sc in scalars[1:]:
            if sc.get(key) is not None:
                self.accountant.compose(float(sc[key]) / self.config.sens_factor)
