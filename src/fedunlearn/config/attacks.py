"""The ``attack`` section: a poisoning attack by a seeded malicious client set, and its schedule.

A discriminated union on ``kind``: every attack shares ``num_malicious``, ``start_round`` and
``join_round``; each attack's own options live on its model (``target_label``,
``trigger_size`` and ``poison_fraction`` on ``backdoor``; ``poison_fraction`` on
``label_flip``; ``rho``, ``sigma`` and ``p_noise`` on ``trim_random``; ``fang_b`` on
``fang_trim``), so an option given to an attack that ignores it is an error naming both.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedunlearn.config.base import Variant


class _Attack(Variant):
    """What every attack shares: how many attackers, and when they attack.

    ``start_round``: the malicious clients train and upload honestly (on their clean data,
    without the update attack) before this round. ``join_round``: they join the federation at
    this round and are never sampled before it (with partial participation, the other clients
    are sampled from those present). Both default to 1: attackers present and attacking from
    the first round.
    """

    LAYOUT = (
        ("kind", "none"),
        ("num_malicious", 0),
        ("target_label", 0),
        ("trigger_size", 4),
        ("poison_fraction", 1.0),
        ("rho", 0.1),
        ("sigma", 0.1),
        ("p_noise", 0.8),
        ("fang_b", 2.0),
        ("start_round", 1),
        ("join_round", 1),
    )

    kind: str
    num_malicious: int = Field(0, ge=0)
    start_round: int = Field(1, ge=1, description="attackers behave honestly before this round")
    join_round: int = Field(1, ge=1, description="attackers are not sampled before this round")


class NoAttack(_Attack):
    """No attack: every client is honest."""

    kind: Literal["none"] = "none"

    @model_validator(mode="after")
    def _nobody(self) -> NoAttack:
        if self.num_malicious:
            raise ValueError("attack.num_malicious > 0 needs an attack.kind other than 'none'")
        if self.start_round > 1 or self.join_round > 1:
            raise ValueError(
                "attack.start_round and attack.join_round schedule an attack; with "
                "attack.kind 'none' leave them at 1"
            )
        return self


class _Poisoning(_Attack):
    @model_validator(mode="after")
    def _somebody(self) -> _Poisoning:
        if self.num_malicious == 0:
            raise ValueError(f"attack.kind '{self.kind}' needs attack.num_malicious >= 1")
        return self


class BackdoorAttack(_Poisoning):
    """A pixel-trigger backdoor: poisoned samples carry the trigger and ``target_label``."""

    kind: Literal["backdoor"] = "backdoor"
    target_label: int = Field(0, ge=0)
    trigger_size: int = Field(4, ge=1)
    poison_fraction: float = Field(1.0, ge=0, le=1)


class LabelFlipAttack(_Poisoning):
    """Label flipping on a share ``poison_fraction`` of each attacker's samples."""

    kind: Literal["label_flip"] = "label_flip"
    poison_fraction: float = Field(1.0, ge=0, le=1)


class TrimRandomAttack(_Poisoning):
    """Random noise or replacement on a share ``rho`` of the attackers' update coordinates."""

    kind: Literal["trim_random"] = "trim_random"
    rho: float = Field(0.1, gt=0, le=1, description="trim_random: share of coordinates hit")
    sigma: float = Field(0.1, gt=0, description="trim_random: noise scale")
    p_noise: float = Field(0.8, ge=0, le=1, description="trim_random: noise vs replacement")


class FangTrimAttack(_Poisoning):
    """Fang et al.'s attack on the trimmed mean, scaled by ``fang_b``."""

    kind: Literal["fang_trim"] = "fang_trim"
    fang_b: float = Field(2.0, gt=1, description="fang_trim: scale factor b")


#: ``attack.kind`` -> the attack's model (the first is the default).
ATTACK_MODELS: dict[str, type[_Attack]] = {
    "none": NoAttack,
    "backdoor": BackdoorAttack,
    "label_flip": LabelFlipAttack,
    "trim_random": TrimRandomAttack,
    "fang_trim": FangTrimAttack,
}

#: Poisoning attack run by a seeded malicious client set: one model per attack, picked by kind.
AttackConfig = Annotated[
    NoAttack | BackdoorAttack | LabelFlipAttack | TrimRandomAttack | FangTrimAttack,
    Field(discriminator="kind"),
]


def backdoor_target(attack: AttackConfig) -> int:
    """Return the class a backdoor's triggered inputs aim at (0 without a backdoor: unused)."""
    return attack.target_label if isinstance(attack, BackdoorAttack) else 0
