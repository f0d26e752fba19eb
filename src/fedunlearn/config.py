"""Run configuration: the one place YAML becomes validated, frozen objects.

Every model is frozen and forbids unknown keys, so a typo is an error naming the field rather
than a silently ignored setting. ``load_config`` wraps pydantic's errors in ``ConfigError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedunlearn.errors import ConfigError

DATASET_NAMES = ("digits", "mnist", "fashion-mnist", "cifar10", "ag_news", "synthetic")
MODEL_NAMES = ("logreg", "mlp", "cnn", "cnn_fmnist", "textcnn")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DataConfig(_Frozen):
    """Dataset and its split across clients."""

    dataset: Literal["digits", "mnist", "fashion-mnist", "cifar10", "ag_news", "synthetic"] = (
        "digits"
    )
    data_dir: str | None = None
    num_clients: int = Field(10, ge=1, le=100_000)
    partition: Literal["iid", "dirichlet", "label_bias", "shards"] = "iid"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    bias: float = Field(0.5, ge=0, le=1, description="label_bias q")
    shards_per_client: int = Field(2, ge=1)
    max_train_samples: int | None = Field(None, ge=1, description="subsample the train set")
    max_test_samples: int | None = Field(None, ge=1, description="subsample the test set")
    options: dict[str, Any] = Field(default_factory=dict, description="loader options")


class ModelConfig(_Frozen):
    """Model architecture, built by name."""

    name: Literal["logreg", "mlp", "cnn", "cnn_fmnist", "textcnn"] = "mlp"
    hidden: tuple[int, ...] = Field((128,), description="mlp hidden widths")


class AggregatorConfig(_Frozen):
    """Aggregation rule and its options."""

    name: Literal["fedavg", "median", "trimmed_mean", "krum", "multi_krum"] = "fedavg"
    trim: int = Field(1, ge=0, description="trimmed mean: values cut at each end")
    krum_f: int = Field(1, ge=0, description="Krum: Byzantine clients tolerated")
    multi_krum_m: int | None = Field(None, ge=1, description="Multi-Krum: updates averaged")


class TrainingConfig(_Frozen):
    """Federated training: rounds, local SGD, participation, aggregation, execution."""

    rounds: int = Field(20, ge=1, le=100_000)
    local_epochs: int = Field(1, ge=1)
    lr: float = Field(0.05, gt=0)
    batch_size: int = Field(32, ge=1)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    participation: float = Field(1.0, gt=0, le=1)
    aggregator: AggregatorConfig = AggregatorConfig()
    executor: Literal["auto", "serial", "vectorized", "pool"] = "auto"
    num_workers: int | None = Field(None, ge=1)


class AttackConfig(_Frozen):
    """Poisoning attack run by a seeded malicious client set."""

    kind: Literal["none", "backdoor", "label_flip", "trim_random", "fang_trim"] = "none"
    num_malicious: int = Field(0, ge=0)
    target_label: int = Field(0, ge=0)
    trigger_size: int = Field(4, ge=1)
    poison_fraction: float = Field(1.0, ge=0, le=1)
    rho: float = Field(0.1, gt=0, le=1, description="trim_random: share of coordinates hit")
    sigma: float = Field(0.1, gt=0, description="trim_random: noise scale")
    p_noise: float = Field(0.8, ge=0, le=1, description="trim_random: noise vs replacement")
    fang_b: float = Field(2.0, gt=1, description="fang_trim: scale factor b")

    @model_validator(mode="after")
    def _consistent(self) -> AttackConfig:
        if self.kind == "none" and self.num_malicious:
            raise ValueError("attack.num_malicious > 0 needs an attack.kind other than 'none'")
        if self.kind != "none" and self.num_malicious == 0:
            raise ValueError(f"attack.kind '{self.kind}' needs attack.num_malicious >= 1")
        return self


class CrabSelectionConfig(_Frozen):
    """Crab's selective storage (Crab spec §2.2): windows, round and client selection.

    Used live by ``history.policy: crab`` and by the ``crab`` method when it derives the
    selection from a run recorded with ``all`` (both give the identical selection).
    """

    alpha: float = Field(0.1, gt=0, lt=1, description="α: a window closes at a loss drop of α")
    round_ratio: float = Field(0.6, gt=0, le=1, description="λ: share of a window's rounds kept")
    client_ratio: float = Field(0.7, gt=0, le=1, description="δ: share of a round's clients kept")
    divergence: Literal["pred_kl", "param_softmax_kl"] = Field(
        "pred_kl", description="round score: KL of predictions on R, or the code's param proxy"
    )
    rounding: Literal["half_up", "floor"] = Field(
        "half_up", description="P_b = max(1, round_half_up(λ B_b)) (spec A5) or floor (code)"
    )
    reference_size: int = Field(
        2000, ge=1, description="|R|: seeded clean subsample of the clients' training data"
    )
    max_window: int | None = Field(
        None, ge=1, description="close a window after this many rounds (spec A11); None = never"
    )


class FedADPSelectionConfig(_Frozen):
    """FedADP's dual-layer selective storage (FedADP spec §3.5): loss stages, λ rounds, γ clients.

    Used live by ``history.policy: fedadp`` and by the ``fedadp`` method when it derives the
    selection from a run recorded with ``all``.
    """

    beta: float = Field(0.1, gt=0, lt=1, description="β: a stage ends at a loss drop of β")
    round_ratio: float = Field(0.6, gt=0, le=1, description="λ: share of a stage's rounds kept")
    client_ratio: float = Field(0.7, gt=0, le=1, description="γ: share of a round's updates kept")
    model_align: Literal["params", "updates"] = Field(
        "params", description="Eq. 7 on the global models (paper) or on consecutive aggregates"
    )
    selection_mode: Literal["staged", "global"] = Field(
        "staged", description="select per loss stage, or round(λT) rounds over all of training"
    )
    loss_samples: int = Field(
        512, ge=1, le=1_000_000, description="samples per client of the server loss (spec A3)"
    )


class HistoryConfig(_Frozen):
    """What the server records during training (global models are always kept)."""

    policy: Literal["all", "every", "none", "crab", "fedadp"] = "all"
    every: int = Field(5, ge=1, description="policy 'every': keep updates of every k-th round")
    crab: CrabSelectionConfig = CrabSelectionConfig()
    fedadp: FedADPSelectionConfig = FedADPSelectionConfig()


class PrivacyConfig(_Frozen):
    """DP of training at FedADP's adaptive per-round budget ε_t (Eq. 4): the mechanism and budget.

    ``mechanism``: ``client_update`` clips each client's whole update to S and adds Gaussian
    noise (Eq. 5-6; client-level, FedADP spec §3.2-§3.3, A1-A5); ``dp_sgd`` trains each client
    by DP-SGD, per-example clipping to C and Gaussian noise on every batch's sum, the round
    costing ε_t (per-example guarantee; docs/privacy.md).
    """

    enabled: bool = Field(False, description="train with differential privacy")
    mechanism: Literal["client_update", "dp_sgd"] = Field(
        "client_update",
        description="clip+noise each client's update (Eq. 5-6) or DP-SGD in local training",
    )
    clip_norm: float | Literal["auto"] = Field(
        "auto",
        description="S (client_update, parameter-delta units) or C (dp_sgd, per-example "
        "gradient norm), or 'auto' (median norm of a no-DP pilot / of the gradients at M_0)",
    )
    pilot_rounds: int = Field(1, ge=1, le=10, description="no-DP pilot rounds of S='auto'")
    noise_mode: Literal["standard", "paper_literal"] = Field(
        "standard", description="std = S z (standard) or S^2 z (Eq. 5 as printed)"
    )
    dp_scope: Literal["train_and_store", "store_only"] = Field(
        "train_and_store",
        description="noisy uploads drive training (faithful) or only the stored copies are noisy",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of each release")
    epsilon_initial: float = Field(1.0, gt=0, le=1000, description="ε_0")
    epsilon_min: float = Field(1.0, gt=0, le=1000, description="ε_min")
    epsilon_max: float = Field(3.0, gt=0, le=1000, description="ε_max")
    signed_delta: bool = Field(False, description="Eq. 4 with the signed loss change")
    sens_factor: Literal[1, 2] = Field(
        1, description="L2 sensitivity S (add/remove) or 2S (replace) for the headline ε"
    )

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyConfig:
        if isinstance(self.clip_norm, float) and not 0 < self.clip_norm <= 1e6:
            raise ValueError(
                f"privacy.clip_norm must be in (0, 1e6] or 'auto'; got {self.clip_norm}"
            )
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(
                f"privacy.epsilon_min ({self.epsilon_min}) must not exceed privacy.epsilon_max "
                f"({self.epsilon_max})"
            )
        if self.mechanism == "dp_sgd":
            for name, value, allowed in (
                ("dp_scope", self.dp_scope, "train_and_store"),
                ("noise_mode", self.noise_mode, "standard"),
                ("sens_factor", self.sens_factor, 1),
            ):
                if value != allowed:
                    raise ValueError(
                        f"privacy.{name} {value!r} applies to mechanism 'client_update' only; "
                        f"dp_sgd needs {allowed!r} (per-example add/remove accounting, noise in "
                        "training). Drop the setting or use mechanism 'client_update'."
                    )
        return self


class RunConfig(_Frozen):
    """A whole training run."""

    seed: int = Field(0, ge=0)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    attack: AttackConfig = AttackConfig()
    history: HistoryConfig = HistoryConfig()
    privacy: PrivacyConfig = PrivacyConfig()

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        n = self.data.num_clients
        if self.privacy.dp_scope == "store_only" and self.privacy.enabled:
            if self.history.policy != "fedadp":
                raise ValueError(
                    "privacy.dp_scope 'store_only' noises only the stored copies, which needs "
                    f"history.policy 'fedadp'; got '{self.history.policy}'"
                )
        if self.attack.num_malicious >= n:
            raise ValueError(
                f"attack.num_malicious ({self.attack.num_malicious}) must be smaller than "
                f"data.num_clients ({n})"
            )
        if self.model.name == "textcnn" and self.data.dataset != "ag_news":
            raise ValueError("model.name 'textcnn' needs data.dataset 'ag_news'")
        if self.data.dataset == "ag_news" and self.model.name != "textcnn":
            raise ValueError("data.dataset 'ag_news' needs model.name 'textcnn'")
        if self.attack.kind == "backdoor" and self.data.dataset in ("ag_news", "synthetic"):
            raise ValueError("attack.kind 'backdoor' (pixel trigger) needs an image dataset")
        return self


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {where}: {msg}{shown}")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a plain dict into a ``RunConfig``.

    Raises:
        ConfigError: naming every offending field, the value received and what is allowed.
    """
    try:
        return RunConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML file into a ``RunConfig``; ``overrides`` are merged over it (dotted keys ok)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping; got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return parse_config(data, str(path))


def dump_config(config: RunConfig) -> str:
    """Return the config as YAML (every field, defaults included)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
