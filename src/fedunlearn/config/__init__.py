"""Run configuration: the one place YAML becomes validated, frozen objects.

Every model is frozen and forbids unknown keys, so a typo is an error naming the field rather
than a silently ignored setting. ``load_config`` wraps pydantic's errors in ``ConfigError``, one
line naming every offending field. YAML that parses but cannot be meant is refused too: a
duplicated key (YAML keeps the last one silently), a non-finite number anywhere (``.inf``,
``.nan``), an empty file (it would train a default run nobody asked for). What a plugin provides
(``history.policy`` with its section ``history.<policy>``, ``privacy.budget.schedule``) is stored
by name and imports nothing here; ``fedunlearn.runs.resolve_config`` looks the names up and
validates the section where the run is assembled (docs/architecture.md, "The plugin seam").

One module per component: ``data`` (data and model), ``training`` (with the aggregation rules),
``attacks``, ``history``, ``privacy``, ``run`` (``RunConfig``), ``loading`` (YAML in and out),
``migrate`` (earlier layouts); ``base`` holds what they share. A section with variants
(``attack.kind``, ``training.aggregator.name``) is a discriminated union with one model per
variant.
"""

from fedunlearn.config.attacks import (
    ATTACK_MODELS,
    AttackConfig,
    BackdoorAttack,
    FangTrimAttack,
    LabelFlipAttack,
    NoAttack,
    TrimRandomAttack,
    backdoor_target,
)
from fedunlearn.config.base import FLOAT32_MAX
from fedunlearn.config.data import DataConfig, ModelConfig
from fedunlearn.config.history import HistoryConfig
from fedunlearn.config.loading import dump_config, load_config, parse_config, read_yaml
from fedunlearn.config.migrate import BUDGET_KEYS
from fedunlearn.config.privacy import BudgetConfig, PrivacyConfig
from fedunlearn.config.run import MarkersConfig, RunConfig, VerificationConfig
from fedunlearn.config.training import (
    AGGREGATOR_MODELS,
    AggregatorConfig,
    FedAvgAggregator,
    KrumAggregator,
    MedianAggregator,
    MultiKrumAggregator,
    TrainingConfig,
    TrimmedMeanAggregator,
)

__all__ = [
    "AGGREGATOR_MODELS",
    "ATTACK_MODELS",
    "BUDGET_KEYS",
    "FLOAT32_MAX",
    "AggregatorConfig",
    "AttackConfig",
    "BackdoorAttack",
    "BudgetConfig",
    "DataConfig",
    "FangTrimAttack",
    "FedAvgAggregator",
    "HistoryConfig",
    "KrumAggregator",
    "LabelFlipAttack",
    "MarkersConfig",
    "MedianAggregator",
    "ModelConfig",
    "MultiKrumAggregator",
    "NoAttack",
    "PrivacyConfig",
    "RunConfig",
    "TrainingConfig",
    "TrimRandomAttack",
    "TrimmedMeanAggregator",
    "VerificationConfig",
    "backdoor_target",
    "dump_config",
    "load_config",
    "parse_config",
    "read_yaml",
]
