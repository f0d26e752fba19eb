"""Client-side DP as an update mod: clip every upload to S, add seeded Gaussian noise.

``ClipAndNoise`` has the ``UpdateMod`` signature ``(round, global_params, updates) -> updates``
(like the update attacks of :mod:`fedunlearn.fl.attacks`). It asks the budget schedule for ε of
the round, clips each client's delta to L2 norm S and adds N(0, std² I) drawn from a generator
seeded by ``derive_seed(seed, "dp_noise", round, client)``, so a run (and a resumed run) is
bit-identical and ``privatize`` reproduces the exact noisy copy of any (round, client) later
(``dp_scope: store_only`` stores those copies while the clean uploads drive training). Every
upload leaves without its training loss (noise-free; NaN: not reported). It keeps
one ``RoundNoise`` per round: ε_t, z_t, std, S, clipped share and the measured noise-to-signal
ratio of the FedAvg-weighted aggregate.

Paper: FedADP (Jiang et al.), Sec. IV-B1, Alg. 1 lines 9-12, Eq. 5-6; deviations AD1 (the
noise-to-signal this mechanism gives), AD2 (noise mode) of docs/methods/fedadp.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from fedunlearn.fl.records import ClientUpdate
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.privacy.mechanisms import NoiseMode, noise_multiplier, noise_std, privatize


@dataclass(frozen=True)
class RoundNoise:
    """What the DP mod did in one round.

    Attributes:
        round: The round (1-based).
        epsilon: Nominal ε_t of the round (Eq. 4 schedule).
        noise_multiplier: ζ_t = std / S, the effective noise multiplier at sensitivity S
            (z_t in standard mode, S z_t in paper_literal mode).
        noise_std: Per-coordinate noise std.
        clip_norm: S.
        clipped_fraction: Share of uploads whose norm exceeded S.
        raw_norm_median: Median L2 norm of the uploads before clipping.
        noise_to_signal: ||Σ w_c n_c|| / ||Σ w_c clip(g_c)||, FedAvg weights n_c / n.
    """

    round: int
    epsilon: float
    noise_multiplier: float
    noise_std: float
    clip_norm: float
    clipped_fraction: float
    raw_norm_median: float
    noise_to_signal: float


class ClipAndNoise:
    """Update mod clipping each upload to S and adding seeded Gaussian noise (Eq. 5).

    Args:
        clip_norm: S, in parameter-delta units.
        delta: δ of the per-round guarantee (Eq. 6).
        noise_mode: ``standard`` (std = S z) or ``paper_literal`` (std = S² z).
        seed: Run seed (noise seeds derive from it, the round and the client).
        epsilon_of: Returns ε of a round (the budget schedule).
        perturb: Return the noisy uploads (``train_and_store``); False returns them unchanged
            and only measures (``store_only``).
        noise_salt: A release's own noise draws; 0: the run's, as training. A DP release that
            re-runs rounds (DP Retrain, a continuation after an applied trajectory) passes its
            own: reusing a round's noise with other data lets the difference cancel it.
    """

    def __init__(
        self,
        *,
        clip_norm: float,
        delta: float,
        noise_mode: NoiseMode,
        seed: int,
        epsilon_of: Callable[[int], float],
        perturb: bool = True,
        noise_salt: int = 0,
    ) -> None:
        self.noise_salt = int(noise_salt)
        self.clip_norm = float(clip_norm)
        self.delta = delta
        self.noise_mode = noise_mode
        self.seed = seed
        self.epsilon_of = epsilon_of
        self.perturb = perturb
        self.stats: dict[int, RoundNoise] = {}
        self._std: dict[int, float] = {}

    def std(self, round_: int) -> float:
        """Return the per-coordinate noise std of round ``round_`` (fixed once first asked)."""
        if round_ not in self._std:
            z = noise_multiplier(self.epsilon_of(round_), self.delta)
            self._std[round_] = noise_std(self.clip_norm, z, self.noise_mode)
        return self._std[round_]

    def privatize(
        self, round_: int, client_id: int, delta: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (noisy, clipped) of a client's delta in a round; the noise is seeded."""
        keys = (round_, client_id, self.noise_salt) if self.noise_salt else (round_, client_id)
        generator = torch_generator(derive_seed(self.seed, "dp_noise", *keys))
        return privatize(delta, self.clip_norm, self.std(round_), generator)

    def __call__(
        self, round_: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]
    ) -> list[ClientUpdate]:
        """Clip and perturb the round's uploads; record the round's ``RoundNoise``."""
        out: list[ClientUpdate] = []
        total = sum(u.num_samples for u in updates) or 1
        signal = noise = None
        raw_norms = []
        for u in updates:
            raw_norms.append(float(u.delta.to(torch.float64).norm()))
            noisy, clipped = self.privatize(round_, u.client_id, u.delta)
            w = u.num_samples / total
            part_s, part_n = w * clipped.to(torch.float64), w * (noisy - clipped).to(torch.float64)
            signal = part_s if signal is None else signal + part_s
            noise = part_n if noise is None else noise + part_n
            # the training loss is noise-free: it never leaves a DP client (issue 40)
            out.append(replace(u, delta=noisy if self.perturb else u.delta, train_loss=math.nan))
        std = self.std(round_)
        signal_norm = float(signal.norm()) if signal is not None else 0.0
        noise_norm = float(noise.norm()) if noise is not None else 0.0
        ordered = sorted(raw_norms)
        median = (
            (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2 if ordered else 0.0
        )
        self.stats[round_] = RoundNoise(
            round=round_,
            epsilon=self.epsilon_of(round_),
            noise_multiplier=std / self.clip_norm,
            noise_std=std,
            clip_norm=self.clip_norm,
            clipped_fraction=sum(n > self.clip_norm for n in raw_norms) / max(1, len(raw_norms)),
            raw_norm_median=median,
            noise_to_signal=noise_norm / signal_norm if signal_norm > 0 else math.inf,
        )
        return out
