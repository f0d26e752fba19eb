"""``privacy.mechanism: dp_sgd``: clients train by DP-SGD, one round costing ε_t of Eq. 4.

``DPSGDTraining`` is the ``Federation.local_training`` hook: ``run(global, tasks, spec, round)``.
Per round, in the order ``run`` does them:

1. the accounted event: q = the largest sample rate min(1, B / n_c) and ``steps`` = the most
   steps ceil(E n_c / B) among the round's clients. Every client's own (q_c, steps_c) event is
   dominated by it (the sampled Gaussian's privacy loss grows with q and with the number of
   steps), so accounting it bounds every example's loss; with equal client sizes it is exact;
2. σ_t: the smallest noise multiplier with which that event costs ε_t (the Eq. 4 schedule's
   budget of the round) at δ by RDP (``calibrate_sampled_gaussian``; cached); the achieved ε
   by RDP (<= ε_t) and by PLD (tighter) are recorded;
3. training: ``VectorizedDPSGD`` (all clients at once) for models whose parameters all live in
   ``nn.Linear`` layers, else ``dp_sgd_update`` client by client (the reference);
4. the round's ``RoundDPSGD``: the above, the share of clipped per-example gradients, their
   median norm and the measured noise-to-signal ratio of the FedAvg-weighted aggregate;
5. the uploads leave without their training loss (``withhold_loss``): it is noise-free.

``ClippedTraining`` is the same optimiser without the noise (Poisson batches, per-example
clipping to C, no accounting): the local training of unlearning on a ``dp_sgd`` run, whose
learning rate was chosen for clipped steps (docs/methods/fedadp.md, AD22).

Paper: FedADP (Jiang et al.), Alg. 1 and Eq. 4 (the per-round budget ε_t); DP-SGD as Abadi et
al. 2016. Deviation from the paper's Eq. 5-6 and why: docs/privacy.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.privacy.accountant import (
    SampledGaussian,
    calibrate_sampled_gaussian,
    pld_epsilon,
    rdp_epsilon,
)
from fedunlearn.privacy.dp_sgd import (
    ClientNoise,
    check_tasks,
    dp_sgd_update,
    num_steps,
    sample_rate,
)
from fedunlearn.privacy.dp_sgd_vectorized import VectorizedDPSGD
from fedunlearn.privacy.per_example import check_per_example_model

__all__ = ["ClippedTraining", "DPSGDTraining", "RoundDPSGD", "withhold_loss"]


def withhold_loss(update: ClientUpdate) -> ClientUpdate:
    """Return ``update`` without its training loss (NaN: not reported).

    A client's mean training loss is computed without noise: on a DP run it would single the
    client out (a backdoored client's loss differs) and no ε covers it, so DP clients never
    upload it (issue 40; docs/privacy.md, "What is stored and released").
    """
    return replace(update, train_loss=float("nan"))


@dataclass(frozen=True)
class RoundDPSGD:
    """What DP-SGD did in one round (the ledger row of ``mechanism: dp_sgd``).

    Attributes:
        round: The round (1-based).
        epsilon: ε_t, the round's target budget (Eq. 4 schedule).
        epsilon_achieved: ε of the accounted event at δ by RDP (σ_t was calibrated to it).
        round_epsilon_pld: ε of the accounted event at δ by PLD (tighter).
        noise_multiplier: σ_t, noise std over C on each summed batch gradient.
        noise_std: σ_t C, the per-coordinate std of that noise.
        clip_norm: C, the per-example clipping norm.
        sample_rate: q of the accounted event (largest among the round's clients).
        steps: Steps of the accounted event (most among the round's clients).
        clipped_fraction: Share of sampled examples whose gradient norm exceeded C.
        raw_norm_median: Median unclipped per-example gradient norm.
        noise_to_signal: ||Σ w_c n_c|| / ||Σ w_c (Δ_c - n_c)||, n_c the noise's direct part of
            client c's delta, FedAvg weights w_c = n_c / n.
    """

    round: int
    epsilon: float
    epsilon_achieved: float
    round_epsilon_pld: float
    noise_multiplier: float
    noise_std: float
    clip_norm: float
    sample_rate: float
    steps: int
    clipped_fraction: float
    raw_norm_median: float
    noise_to_signal: float

    @property
    def event(self) -> SampledGaussian:
        """The accounted event of the round."""
        return SampledGaussian(self.noise_multiplier, self.sample_rate, self.steps)


@functools.lru_cache(maxsize=256)
def _event_epsilons(event: SampledGaussian, delta: float) -> tuple[float, float]:
    """Return ε at δ of ``event`` by RDP and by PLD (cached: rounds repeat their event)."""
    return rdp_epsilon(event.event(), delta), pld_epsilon(event.event(), delta)


@dataclass(frozen=True)
class _Plan:
    epsilon: float
    sample_rate: float
    steps: int
    noise_multiplier: float


class _ClippedSteps:
    """What ``DPSGDTraining`` and ``ClippedTraining`` share: the vectorised or reference steps."""

    model: nn.Module
    client_data: Mapping[int, ClientData]
    clip_norm: float
    noise_salt: int = 0
    vectorized: VectorizedDPSGD | None

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        clip_norm: float,
        *,
        clip_name: str,
        device: torch.device | str | None = None,
        vectorize: bool | None = None,
    ) -> None:
        """Check the model and C (``clip_name`` in the error); set up the vectorised path.

        ``vectorize``: None uses it where the model allows it, True requires it, False never.
        """
        check_per_example_model(model)
        if not clip_norm > 0 or not math.isfinite(clip_norm):
            raise ConfigError(f"{clip_name} must be a finite number > 0; got {clip_norm}")
        self.model = model
        self.client_data = client_data
        self.clip_norm = float(clip_norm)
        self.vectorized = None
        if vectorize is not False:
            try:
                self.vectorized = VectorizedDPSGD(model, client_data, device=device)
            except ConfigError:
                if vectorize:
                    raise

    def run(
        self,
        global_params: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
        round_: int,
    ) -> list[ClientUpdate]:
        """Train every ``(client_id, seed)`` task (``fl.federation.LocalTraining.run``).

        DP-SGD records the round's ``RoundDPSGD``; clipped SGD does not use ``round_``.
        """
        check_tasks(self.client_data, tasks)
        results = self._train(
            global_params, tasks, spec, self._noise_multiplier(round_, tasks, spec)
        )
        return self._uploads(round_, results)

    def _noise_multiplier(
        self, round_: int, tasks: Sequence[tuple[int, int]], spec: LocalTrainingSpec
    ) -> float:
        """σ of the round's steps: none, for clipped SGD."""
        return 0.0

    def _uploads(
        self, round_: int, results: Sequence[tuple[ClientUpdate, ClientNoise]]
    ) -> list[ClientUpdate]:
        """Return what the clients upload of the round's results: the updates."""
        return [update for update, _ in results]

    def _train(
        self,
        global_params: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
        noise_multiplier: float,
    ) -> list[tuple[ClientUpdate, ClientNoise]]:
        """Run the tasks by ``VectorizedDPSGD`` where it is set up, else by ``dp_sgd_update``."""
        if self.vectorized is not None:
            return self.vectorized.run(
                global_params,
                tasks,
                spec,
                clip_norm=self.clip_norm,
                noise_multiplier=noise_multiplier,
                noise_salt=self.noise_salt,
            )
        return [
            dp_sgd_update(
                self.model,
                global_params,
                self.client_data[cid],
                spec,
                clip_norm=self.clip_norm,
                noise_multiplier=noise_multiplier,
                seed=seed,
                client_id=cid,
                noise_salt=self.noise_salt,
            )
            for cid, seed in tasks
        ]

    def close(self) -> None:
        """Stop the vectorised path's threads, if any (it restarts them when needed)."""
        if self.vectorized is not None:
            self.vectorized.close()


class DPSGDTraining(_ClippedSteps):
    """DP-SGD local training for ``Federation.local_training`` (see module doc).

    Args:
        model: Template module; must have per-example gradients (no batch norm, dropout or
            buffers).
        client_data: Every client's training set.
        clip_norm: C, the per-example clipping norm.
        delta: δ of each round's guarantee.
        epsilon_of: Returns ε_t of a round (the budget schedule).
        device: Where the vectorised path trains (default CPU; the reference runs where the
            global parameters are).
        vectorize: Use ``VectorizedDPSGD`` (``None``: when the model allows it).
        noise_salt: A release's own noise and Poisson batches (``dp_sgd.noise_generator``,
            ``dp_sgd.batch_generator``); 0: the task seed's, as training. A DP release that
            re-runs rounds passes its own, and so does a reference model.

    Raises:
        ConfigError: if the model has no per-example gradients, C <= 0, or ``vectorize=True``
            for a model the vectorised path cannot train.
    """

    name = "dp_sgd"

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        *,
        clip_norm: float,
        delta: float,
        epsilon_of: Callable[[int], float],
        device: torch.device | str | None = None,
        vectorize: bool | None = None,
        noise_salt: int = 0,
    ) -> None:
        super().__init__(
            model,
            client_data,
            clip_norm,
            clip_name="the DP-SGD clip norm C",
            device=device,
            vectorize=vectorize,
        )
        self.noise_salt = int(noise_salt)
        self.delta = delta
        self.epsilon_of = epsilon_of
        self.stats: dict[int, RoundDPSGD] = {}
        self._plans: dict[int, _Plan] = {}

    def plan(self, round_: int, client_ids: Sequence[int], spec: LocalTrainingSpec) -> _Plan:
        """Return the round's accounted (q, steps) and calibrated σ_t (fixed once first asked)."""
        if round_ not in self._plans:
            sizes = [len(self.client_data[c]) for c in client_ids if len(self.client_data[c])]
            if not sizes:
                raise ConfigError(f"round {round_}: no client with data to train by DP-SGD")
            q = max(sample_rate(n, spec.batch_size) for n in sizes)
            steps = max(num_steps(n, spec) for n in sizes)
            epsilon = float(self.epsilon_of(round_))
            sigma = calibrate_sampled_gaussian(q, steps, epsilon, self.delta)
            self._plans[round_] = _Plan(epsilon, q, steps, sigma)
        return self._plans[round_]

    def _noise_multiplier(
        self, round_: int, tasks: Sequence[tuple[int, int]], spec: LocalTrainingSpec
    ) -> float:
        """σ_t, calibrated to the round's budget (``plan``)."""
        return self.plan(round_, [cid for cid, _ in tasks], spec).noise_multiplier

    def _uploads(
        self, round_: int, results: Sequence[tuple[ClientUpdate, ClientNoise]]
    ) -> list[ClientUpdate]:
        """Record the round's ``RoundDPSGD``; return the updates without their losses."""
        self.stats[round_] = self._round_stats(round_, self._plans[round_], results)
        # the mean loss of the sampled examples is noise-free: it stays with the client
        return [withhold_loss(update) for update, _ in results]

    def _round_stats(
        self, round_: int, plan: _Plan, results: Sequence[tuple[ClientUpdate, ClientNoise]]
    ) -> RoundDPSGD:
        event = SampledGaussian(plan.noise_multiplier, plan.sample_rate, plan.steps)
        total = sum(u.num_samples for u, _ in results) or 1
        signal = noise = None
        for update, client_noise in results:
            w = update.num_samples / total
            part_n = w * client_noise.noise_delta.to(torch.float64)
            part_s = w * update.delta.to(torch.float64) - part_n
            signal = part_s if signal is None else signal + part_s
            noise = part_n if noise is None else noise + part_n
        signal_norm = float(signal.norm()) if signal is not None else 0.0
        noise_norm = float(noise.norm()) if noise is not None else 0.0
        norms = torch.cat([n.norms for _, n in results]) if results else torch.zeros(0)
        achieved, pld = _event_epsilons(event, self.delta)
        return RoundDPSGD(
            round=round_,
            epsilon=plan.epsilon,
            epsilon_achieved=achieved,
            round_epsilon_pld=pld,
            noise_multiplier=plan.noise_multiplier,
            noise_std=plan.noise_multiplier * self.clip_norm,
            clip_norm=self.clip_norm,
            sample_rate=plan.sample_rate,
            steps=plan.steps,
            clipped_fraction=float((norms > self.clip_norm).to(torch.float64).mean())
            if norms.numel()
            else 0.0,
            raw_norm_median=float(norms.median()) if norms.numel() else 0.0,
            noise_to_signal=noise_norm / signal_norm if signal_norm > 0 else math.inf,
        )


class ClippedTraining(_ClippedSteps):
    """DP-SGD's optimiser without its noise, for ``Federation.local_training`` (see module doc).

    Each client takes ceil(E n_c / B) steps on Poisson batches of rate min(1, B / n_c), every
    example's gradient clipped to C, the clipped sum divided by the expected batch size: the
    steps of ``DPSGDTraining`` with σ = 0. Nothing is accounted (it releases no private output
    by itself; unlearning methods train their fresh updates without DP, AD9).

    Args:
        model: Template module; must have per-example gradients.
        client_data: Every client's training set.
        clip_norm: C, the per-example clipping norm (the run's).
        device: Where the vectorised path trains (default CPU).

    Raises:
        ConfigError: if the model has no per-example gradients or C is not a finite number > 0.
    """

    name = "clipped_sgd"

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        *,
        clip_norm: float,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(model, client_data, clip_norm, clip_name="the clip norm C", device=device)
