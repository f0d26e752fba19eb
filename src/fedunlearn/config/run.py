"""A whole run (``RunConfig``): its sections and the checks that need two of them at once."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from fedunlearn.config.attacks import ATTACK_MODELS, AttackConfig, BackdoorAttack, NoAttack
from fedunlearn.config.base import Frozen, pick_variant
from fedunlearn.config.data import DataConfig, ModelConfig
from fedunlearn.config.history import HistoryConfig
from fedunlearn.config.privacy import PrivacyConfig
from fedunlearn.config.training import TrainingConfig


class MarkersConfig(Frozen):
    """Participation markers (``fedunlearn.fl.markers``; docs/verification.md).

    Each listed client adds ``samples`` copies of its own samples stamped with a secret pattern
    of ``pixels`` pixels and labelled with a secret target class, both derived from the
    client's secret seed: ``seeds[client]`` when given, else derived from the run's seed and
    the client id (a simulation stand-in for a seed only the client knows).
    """

    clients: list[int] = Field(min_length=1)
    samples: int = Field(20, ge=1, description="marked copies each client adds")
    pixels: int = Field(10, ge=1, description="pixels in each client's secret pattern")
    seeds: dict[int, int] = Field(default_factory=dict, description="client -> secret seed")

    @model_validator(mode="after")
    def _consistent(self) -> MarkersConfig:
        if len(set(self.clients)) != len(self.clients) or min(self.clients) < 0:
            raise ValueError(
                f"verification.markers.clients must be distinct client ids >= 0; got {self.clients}"
            )
        extra = sorted(set(self.seeds) - set(self.clients))
        if extra:
            raise ValueError(
                f"verification.markers.seeds names client(s) {extra} not in markers.clients"
            )
        return self


class VerificationConfig(Frozen):
    """What clients do during training so that their removal can be verified later."""

    markers: MarkersConfig | None = None


class RunConfig(Frozen):
    """A whole training run."""

    seed: int = Field(0, ge=0)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    attack: AttackConfig = NoAttack()
    history: HistoryConfig = HistoryConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    verification: VerificationConfig = VerificationConfig()

    @field_validator("attack", mode="before")
    @classmethod
    def _attack_variant(cls, value: Any) -> Any:
        return pick_variant(value, section="attack", key="kind", variants=ATTACK_MODELS)

    @model_validator(mode="after")
    def _markers_consistent(self) -> RunConfig:
        markers = self.verification.markers
        if markers is not None:
            n = self.data.num_clients
            if max(markers.clients) >= n:
                raise ValueError(
                    f"verification.markers.clients {markers.clients} names a client outside "
                    f"0..{n - 1} (data.num_clients = {n})"
                )
            if self.data.dataset in ("ag_news", "synthetic"):
                raise ValueError("verification.markers (pixel patterns) need an image dataset")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        n = self.data.num_clients
        if self.attack.num_malicious >= n:
            raise ValueError(
                f"attack.num_malicious ({self.attack.num_malicious}) must be smaller than "
                f"data.num_clients ({n})"
            )
        builtin = self.model.factory is None and self.data.source is None
        if builtin and self.model.name == "textcnn" and self.data.dataset != "ag_news":
            raise ValueError("model.name 'textcnn' needs data.dataset 'ag_news'")
        if builtin and self.data.dataset == "ag_news" and self.model.name != "textcnn":
            raise ValueError("data.dataset 'ag_news' needs model.name 'textcnn'")
        if (
            isinstance(self.attack, BackdoorAttack)
            and self.data.source is None
            and self.data.dataset in ("ag_news", "synthetic")
        ):
            raise ValueError("attack.kind 'backdoor' (pixel trigger) needs an image dataset")
        _check_deletion_ready(self)
        for name in ("start_round", "join_round"):
            value = getattr(self.attack, name)
            if value > self.training.rounds:
                raise ValueError(
                    f"attack.{name} ({value}) is after the last round (training.rounds = "
                    f"{self.training.rounds}); use a round in 1..{self.training.rounds}"
                )
        return self


def _check_deletion_ready(config: RunConfig) -> None:
    """Refuse what TV-stable sampling and shards cannot serve exactly (one line each)."""
    tr, n = config.training, config.data.num_clients
    if tr.sampling == "tv_stable":
        if config.privacy.enabled:
            raise ValueError(
                "training.sampling 'tv_stable' and privacy.enabled do not combine yet (DP-SGD "
                "draws Poisson batches, not FATS's mini-batches); use one of them"
            )
        if config.attack.join_round > 1:
            raise ValueError(
                "training.sampling 'tv_stable' draws from every client every round; "
                "attack.join_round > 1 is not supported with it"
            )
    if tr.shards > 1:
        if tr.shards > n:
            raise ValueError(f"training.shards ({tr.shards}) exceeds data.num_clients ({n})")
        if config.privacy.enabled:
            raise ValueError("training.shards > 1 and privacy.enabled do not combine yet")
        if config.attack.join_round > 1:
            raise ValueError("training.shards > 1 does not support attack.join_round > 1")
        if tr.shard_map is not None:
            missing = sorted(set(range(n)) - set(tr.shard_map))
            extra = sorted(set(tr.shard_map) - set(range(n)))
            if missing or extra:
                raise ValueError(
                    f"training.shard_map must assign every client 0..{n - 1} exactly once "
                    f"(missing {missing[:10]}, unknown {extra[:10]})"
                )
            empty = sorted(set(range(tr.shards)) - set(tr.shard_map.values()))
            if empty:
                raise ValueError(f"training.shard_map leaves shard(s) {empty} without clients")
