"""DP of one training run: the mechanism, the budget schedule and the ledger.

The budget schedule ε_t is a training hook that a plugin provides: ``privacy.budget.schedule``
names a ``BudgetScheduleSpec`` in ``BUDGET_SCHEDULES`` (``fedunlearn.privacy.budget``; FedADP's
Eq. 4 is the ``fedadp`` plugin's), built from the ``privacy.budget`` section.

``PrivateTraining`` ties together, for ``train_run``:

1. the mechanism of ``privacy.mechanism``, attached to the federation for training only by
   ``attach`` (unlearning's fresh updates are not noised unless a method asks, AD9, and
   Retrain runs without DP): ``client_update`` appends the ``ClipAndNoise`` update
   mod (``mod``); ``dp_sgd`` sets the federation's ``local_training`` to ``DPSGDTraining``
   (``local_training``);
2. ``round_scalars``: the ledger entries of the round just trained, merged into its metrics so
   they are committed with the round;
3. ``on_round_end``: a round observer that feeds L(M_t) to the budget schedule (Eq. 4) and
   composes the round's event in the accountant (one Gaussian release, or ``steps`` sampled
   Gaussian steps);
4. ``resume``: rebuilds the schedule and the accountant from the stored round scalars.

Paper: FedADP (Jiang et al.), Sec. IV-B1 and Alg. 1; the mechanisms: deviation AD1 of
docs/methods/fedadp.md; DP-SGD: docs/privacy.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedunlearn.config import PrivacyConfig
from fedunlearn.errors import HistoryError
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import RoundRecord
from fedunlearn.privacy.accountant import PrivacyAccountant
from fedunlearn.privacy.budget import (
    BUDGET_SCHEDULES,
    BudgetScheduleSpec,
    EpsilonSchedule,
    budget_schedule,
)
from fedunlearn.privacy.ledger import DP_SGD_SCALAR_KEYS, LOSS_KEY, SCALAR_KEYS, round_scalars
from fedunlearn.privacy.local_training import DPSGDTraining
from fedunlearn.privacy.uploads import ClipAndNoise

__all__ = [
    "BUDGET_SCHEDULES",
    "BudgetScheduleSpec",
    "EpsilonSchedule",
    "PrivateTraining",
    "budget_schedule",
]


class PrivateTraining:
    """DP state of a training run.

    Args:
        config: The run's ``privacy`` section (enabled).
        seed: Run seed.
        clip_norm: S (``client_update``) or C (``dp_sgd``), resolved: a number, not ``"auto"``.
        noise_salt: The noise draws' salt (0: the run's own; a continuation after an applied
            trajectory passes its generation, so re-used round numbers draw new noise).
    """

    def __init__(
        self, config: PrivacyConfig, *, seed: int, clip_norm: float, noise_salt: int = 0
    ) -> None:
        self.config = config
        self.seed = seed
        self.noise_salt = int(noise_salt)
        self._clip_norm = float(clip_norm)
        self.schedule = budget_schedule(config.budget)
        self.mod: ClipAndNoise | None = None
        self.local_training: DPSGDTraining | None = None
        if config.mechanism == "client_update":
            self.mod = ClipAndNoise(
                clip_norm=clip_norm,
                delta=config.delta,
                noise_mode=config.noise_mode,
                seed=seed,
                epsilon_of=self.schedule.epsilon,
                perturb=config.dp_scope == "train_and_store",
                noise_salt=self.noise_salt,
            )
        self.accountant = PrivacyAccountant()

    @property
    def clip_norm(self) -> float:
        """S (``client_update``) or C (``dp_sgd``)."""
        return self._clip_norm

    def wrap(self, federation: Federation) -> Federation:
        """Return ``federation`` training under the mechanism; ``federation`` is unchanged.

        ``client_update``: the same clients with the clip-and-noise update mod appended;
        ``dp_sgd``: the same clients with DP-SGD as their local training. For training only
        (see module doc); the caller closes the returned federation.
        """
        if self.mod is not None:
            return federation.with_update_mod(self.mod)
        self.local_training = DPSGDTraining(
            federation.model,
            federation.training_data,  # with attackers' clean copies before attack.start_round
            clip_norm=self._clip_norm,
            delta=self.config.delta,
            epsilon_of=self.schedule.epsilon,
            device=federation.device,
            noise_salt=self.noise_salt,
        )
        return federation.with_local_training(self.local_training)

    @property
    def _stats(self) -> dict[int, Any]:
        if self.mod is not None:
            return self.mod.stats
        return self.local_training.stats if self.local_training is not None else {}

    def round_scalars(self, round_: int) -> dict[str, Any]:
        """Return the ledger entries of ``round_`` (empty if the mechanism did not run in it)."""
        noise = self._stats.get(round_)
        return round_scalars(noise, self.config.delta) if noise is not None else {}

    def latest_scalars(self) -> dict[str, Any]:
        """Return the ledger entries of the most recent round the mechanism ran in (or ``{}``)."""
        stats = self._stats
        return self.round_scalars(max(stats)) if stats else {}

    def on_round_end(self, record: RoundRecord) -> None:
        """Feed L(M_round) to the schedule; compose the round's event in the accountant."""
        if LOSS_KEY not in record.metrics:
            raise HistoryError(f"round {record.round} has no '{LOSS_KEY}' metric for the budget")
        self.schedule.observe(record.round, float(record.metrics[LOSS_KEY]))
        noise = self._stats.get(record.round)
        if noise is None:
            return
        if self.mod is not None:
            self.accountant.compose(noise.noise_multiplier / self.config.sens_factor)
        else:
            self.accountant.compose(noise.noise_multiplier, noise.sample_rate, noise.steps)

    def resume(
        self,
        scalars: Sequence[Mapping[str, Any]],
        restart: tuple[int, float] | None = None,
    ) -> None:
        """Rebuild the schedule and accountant from the scalars of rounds 0..last.

        Args:
            scalars: The stored scalars of rounds 0..last.
            restart: ``(s, L(M_s))``: the schedule restarts after round s at ε_0 from that
                loss and reads the stored losses of rounds s+1..last only (a continuation of
                a run with forgotten clients); None: every round's stored loss.
        """
        start, first = (0, None) if restart is None else (int(restart[0]), float(restart[1]))
        read = range(start + 1 if first is not None else 0, len(scalars))
        missing = [r for r in read if LOSS_KEY not in scalars[r]]
        if missing:
            raise HistoryError(
                f"rounds {missing} have no '{LOSS_KEY}' scalar; this run was not trained with "
                "privacy enabled and cannot be resumed with it"
            )
        losses = [float(scalars[r][LOSS_KEY]) for r in read]
        self.schedule.reset(losses if first is None else [first, *losses], start)
        self.accountant = PrivacyAccountant()
        key = SCALAR_KEYS["noise_multiplier"]
        for sc in scalars[1:]:
            if sc.get(key) is None:
                continue
            if self.mod is not None:
                self.accountant.compose(float(sc[key]) / self.config.sens_factor)
            else:
                self.accountant.compose(
                    float(sc[key]),
                    float(sc[DP_SGD_SCALAR_KEYS["sample_rate"]]),
                    int(sc[DP_SGD_SCALAR_KEYS["steps"]]),
                )
