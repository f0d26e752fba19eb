"""The run's DP mechanism for a new release or a reference: DP Retrain's local training.

Unlearning's fresh updates train without noise (docs/methods/fedadp.md, AD9 and AD22), so a
plain Retrain of a DP run is a non-private model, and judging a DP method against it mixes the
cost of privacy into the verdict. ``with_run_mechanism`` returns the run's clients training
under the run's own mechanism instead: ``dp_sgd`` (DP-SGD, σ_t calibrated so that each round
costs its budget for the round's own sampling) or ``client_update`` (clip to S and add seeded
noise of the budget). Every choice is fixed a priori or made over the remaining clients, never
read from the run's data-dependent history (issue 40): the budget of every round is ε_max (the
run's stored ε_t followed a loss measured on the forgotten clients' data too), the clip norm is
the caller's (``fedunlearn.runs.train.resolve_clip_norm`` over the remaining clients when
``auto``), and the noise and Poisson batches are drawn with the caller's salt (a release's or a
reference's own, never the run's rounds'). ``dp_scope: store_only`` trained on the clean
uploads, so its Retrain reference stays noise-free (None here).

Used by ``fedunlearn.eval.reference_retrain`` (the receipt's Retrain of a DP run) and by
unlearning sessions for DP fresh updates (``UnlearnContext.private_clients``: DP Retrain,
FedADP's ``unlearn_dp`` on a dp_sgd run); ``mechanism_stats`` returns the ledger rows of the
rounds it trained. Paper: FedADP (Jiang et al.), Eq. 4-6; DP-SGD as Abadi et al. 2016;
docs/privacy.md and docs/verification.md ("References").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedunlearn.config import PrivacyConfig
from fedunlearn.errors import HistoryError
from fedunlearn.fl.federation import Federation
from fedunlearn.privacy.budget import epsilon_bounds
from fedunlearn.privacy.ledger import DP_SGD_SCALAR_KEYS, SCALAR_KEYS
from fedunlearn.privacy.local_training import DPSGDTraining, RoundDPSGD
from fedunlearn.privacy.uploads import ClipAndNoise, RoundNoise

__all__ = ["mechanism_stats", "with_run_mechanism"]


def with_run_mechanism(
    federation: Federation,
    config: PrivacyConfig,
    round_scalars: Callable[[int], Mapping[str, Any]],
    *,
    seed: int,
    epsilon_of: Callable[[int], float] | None = None,
    clip_norm: float | None = None,
    noise_salt: int = 0,
) -> Federation | None:
    """Return ``federation`` training under the run's DP mechanism, or None if training had none.

    Args:
        federation: The run's clients (not changed; the caller closes the returned one).
        config: The run's ``privacy`` section.
        round_scalars: The stored round scalars of a round (its ledger row, ``dp_*`` keys).
        seed: The run seed (``client_update``'s noise seeds derive from it).
        epsilon_of: ε of a round; default: ε_max for every round (a priori: the stored ε_t
            were chosen from a loss on every client's data, forgotten ones included). A stated
            budget gives unlearning's DP fresh updates (FedADP's ``unlearn_dp``).
        clip_norm: The clip norm; default: round 1's stored one (a caller after a forget
            passes one computed over the remaining clients when the config says ``auto``).
        noise_salt: The draws' salt (noise, and DP-SGD's Poisson batches). 0 re-draws the
            run's own; a release and a reference pass their own, or the difference of two
            releases cancels the noise and their batches are not independent.

    Raises:
        HistoryError: if the clip norm is neither given nor stored with round 1.
    """
    if not config.enabled or config.dp_scope != "train_and_store":
        return None
    keys = DP_SGD_SCALAR_KEYS if config.mechanism == "dp_sgd" else SCALAR_KEYS

    def scalar(round_: int, name: str) -> float:
        value = round_scalars(round_).get(keys[name])
        if value is None:
            raise HistoryError(
                f"round {round_} has no '{keys[name]}' scalar; the run's privacy ledger is "
                "incomplete, so its mechanism cannot be re-run"
            )
        return float(value)

    def a_priori(_round: int) -> float:
        return epsilon_bounds(config.budget)[1]

    epsilon_of = epsilon_of or a_priori

    clip_norm = scalar(1, "clip_norm") if clip_norm is None else float(clip_norm)
    if config.mechanism == "dp_sgd":
        training = DPSGDTraining(
            federation.model,
            federation.training_data,
            clip_norm=clip_norm,
            delta=config.delta,
            epsilon_of=epsilon_of,
            device=federation.device,
            noise_salt=noise_salt,
        )
        return federation.with_local_training(training)
    mod = ClipAndNoise(
        clip_norm=clip_norm,
        delta=config.delta,
        noise_mode=config.noise_mode,
        seed=seed,
        epsilon_of=epsilon_of,
        noise_salt=noise_salt,
    )
    return federation.with_update_mod(mod)


def mechanism_stats(federation: Federation) -> dict[int, RoundDPSGD | RoundNoise]:
    """Return round -> the ledger row of the mechanism ``with_run_mechanism`` attached."""
    training = federation.local_training
    if isinstance(training, DPSGDTraining):
        return dict(training.stats)
    for mod in reversed(federation.update_mods):
        if isinstance(mod, ClipAndNoise):
            return dict(mod.stats)
    return {}
