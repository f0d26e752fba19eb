"""Poisoning attacks run by a seeded malicious client set.

Two kinds, matching where they act:
- data poisoning, applied once to a malicious client's local data: ``backdoor`` (pixel-patch
  trigger, relabel to the target) and ``label_flip``;
- update poisoning, applied to the uploads of a round (an *update mod*): ``trim_random`` (Crab's
  random "trim" perturbation) and ``fang_trim`` (Fang et al.'s full-knowledge trim attack).

When: attackers attack from ``start_round`` on (before it they upload honestly: the data poisons
act through ``Federation``'s ``honest_data``, the update attacks pass rounds before it through).

Papers: Crab (Jiang et al., arXiv:2401.08216v2) Sec. V-A (backdoor: 4x4 white patch
bottom-right, target 0, every non-target sample of a malicious client poisoned by default; the
random "trim" perturbation trim_random(rho=0.1, sigma=0.1, p_noise=0.8), whose parameters the
paper leaves open and the authors' code sets); Fang et al., "Local Model Poisoning Attacks to
Byzantine-Robust FL", USENIX Security 2020, §4 (trim attack, b = 2).
Deviations: [REC] the backdoor keeps a malicious client's target-class samples and its
unpoisoned samples clean (the authors' code drops target-class samples). Fang's attack is applied
to deltas rather than local models: the aggregate is a delta here and the crafted values are
relative to the same benign statistics, so the attack direction is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.seeding import derive_seed, torch_generator


class BackdoorTrigger(Protocol):
    """What stamps a backdoor trigger: the pixel ``Trigger`` or a user's function (runs.user)."""

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Return a copy of batch ``x`` with the trigger stamped on."""
        ...


@dataclass(frozen=True)
class Trigger:
    """A square patch of ``value`` in the bottom-right corner of every channel."""

    size: int = 4
    value: float = 1.0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Return a copy of image batch ``x`` (N, C, H, W) with the patch stamped on."""
        if x.ndim != 4:
            raise ConfigError(f"the pixel trigger needs images (N, C, H, W); got {tuple(x.shape)}")
        if self.size > min(x.shape[-2:]):
            raise ConfigError(f"trigger size {self.size} exceeds the image {tuple(x.shape[-2:])}")
        out = x.clone()
        out[..., -self.size :, -self.size :] = self.value
        return out


def backdoor_data(
    data: ClientData,
    trigger: BackdoorTrigger,
    target_label: int,
    poison_fraction: float,
    generator: torch.Generator,
) -> ClientData:
    """Stamp the trigger on a fraction of the non-target samples and relabel them to the target."""
    candidates = torch.nonzero(data.y != target_label).flatten()
    count = int(round(poison_fraction * len(candidates)))
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]]
    x, y = data.x.clone(), data.y.clone()
    x[chosen] = trigger.apply(x[chosen])
    y[chosen] = target_label
    return ClientData(x, y, data.ids)


def label_flip_data(
    data: ClientData, num_classes: int, poison_fraction: float, generator: torch.Generator
) -> ClientData:
    """Relabel a fraction of the samples from l to ``num_classes - 1 - l``."""
    count = int(round(poison_fraction * len(data)))
    chosen = torch.randperm(len(data), generator=generator)[:count]
    y = data.y.clone()
    y[chosen] = num_classes - 1 - y[chosen]
    return ClientData(data.x, y, data.ids)


def trim_random(
    update: ClientUpdate,
    global_params: torch.Tensor,
    generator: torch.Generator,
    rho: float = 0.1,
    sigma: float = 0.1,
    p_noise: float = 0.8,
) -> ClientUpdate:
    """Perturb a random rho-fraction of the *local model's* coordinates (Crab Sec. V-A).

    Each chosen coordinate gets N(0, sigma^2) added with probability ``p_noise``, otherwise is
    replaced by ``sigma * U(0, 1)``.
    """
    local = global_params + update.delta
    d = local.numel()
    count = int(round(rho * d))
    idx = torch.randperm(d, generator=generator)[:count]
    noisy = torch.rand(count, generator=generator) < p_noise
    noise = torch.randn(count, generator=generator) * sigma
    replacement = torch.rand(count, generator=generator) * sigma
    local[idx] = torch.where(noisy, local[idx] + noise, replacement)
    return replace(update, delta=local - global_params)


def fang_trim(
    benign: torch.Tensor, num_malicious: int, generator: torch.Generator, b: float = 2.0
) -> torch.Tensor:
    """Craft ``num_malicious`` deltas against trimmed mean / median (Fang et al. 2020, §4.2).

    Per coordinate j with benign max ``w_max`` and min ``w_min`` and s_j the sign of the benign
    mean: if s_j > 0 the crafted values are drawn from [w_min / b, w_min] (w_min > 0) or
    [b * w_min, w_min] (otherwise); if s_j <= 0 from [w_max, b * w_max] (w_max > 0) or
    [w_max, w_max / b] (otherwise). This drags the aggregate against the benign direction.

    Args:
        benign: Benign deltas (K, d) — the full-knowledge attacker sees them.
        num_malicious: Number of crafted deltas to return.
        generator: Randomness of the uniform draws.
        b: Scale factor (> 1).
    """
    if b <= 1:
        raise ConfigError(f"fang_trim needs b > 1; got {b}")
    w_max = benign.max(dim=0).values
    w_min = benign.min(dim=0).values
    direction = benign.mean(dim=0)
    lo_inc = torch.where(w_min > 0, w_min / b, w_min * b)  # benign increase: push down
    hi_inc = w_min
    lo_dec = w_max  # benign decrease (or flat): push up
    hi_dec = torch.where(w_max > 0, w_max * b, w_max / b)
    lo = torch.where(direction > 0, lo_inc, lo_dec)
    hi = torch.where(direction > 0, hi_inc, hi_dec)
    u = torch.rand((num_malicious, benign.shape[1]), generator=generator, dtype=benign.dtype)
    return lo + u * (hi - lo)


@dataclass(frozen=True)
class UpdateAttack:
    """An update mod: rewrites the malicious clients' uploads of one round.

    ``kind`` is ``trim_random`` or ``fang_trim``; ``seed_of_round(round)`` seeds its randomness.
    Rounds before ``start_round`` pass through unchanged (the attackers upload honestly).
    """

    kind: str
    malicious: frozenset[int]
    seed: int
    rho: float = 0.1
    sigma: float = 0.1
    p_noise: float = 0.8
    fang_b: float = 2.0
    start_round: int = 1

    def __call__(
        self, round_: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]
    ) -> list[ClientUpdate]:
        """Return the round's updates with the malicious ones replaced."""
        if round_ < self.start_round:
            return list(updates)
        generator = torch_generator(derive_seed(self.seed, "attack", round_))
        out = list(updates)
        bad = [i for i, u in enumerate(out) if u.client_id in self.malicious]
        if not bad:
            return out
        if self.kind == "trim_random":
            for i in bad:
                out[i] = trim_random(
                    out[i], global_params, generator, self.rho, self.sigma, self.p_noise
                )
        elif self.kind == "fang_trim":
            good = [u.delta for u in out if u.client_id not in self.malicious]
            if not good:  # no benign reference this round: upload honestly
                return out
            crafted = fang_trim(torch.stack(good), len(bad), generator, self.fang_b)
            for row, i in enumerate(bad):
                out[i] = replace(out[i], delta=crafted[row].clone())
        else:
            raise ConfigError(f"unknown update attack '{self.kind}'; use trim_random or fang_trim")
        return out


def choose_malicious(num_clients: int, num_malicious: int, seed: int) -> frozenset[int]:
    """Pick the malicious client ids uniformly at random (seeded)."""
    if not 0 <= num_malicious < num_clients:
        raise ConfigError(
            f"num_malicious must be in [0, {num_clients - 1}] for {num_clients} clients; "
            f"got {num_malicious}"
        )
    rng = np.random.default_rng(seed)
    return frozenset(int(c) for c in rng.choice(num_clients, size=num_malicious, replace=False))
