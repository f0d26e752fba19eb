"""Run configuration: the one place YAML becomes validated, frozen objects.

Every model is frozen and forbids unknown keys, so a typo is an error naming the field rather
than a silently ignored setting. ``load_config`` wraps pydantic's errors in ``ConfigError``, one
line naming every offending field. YAML that parses but cannot be meant is refused too: a
duplicated key (YAML keeps the last one silently), a non-finite number anywhere (``.inf``,
``.nan``), an empty file (it would train a default run nobody asked for). What a plugin provides
(``history.policy`` with its section ``history.<policy>``, ``privacy.budget.schedule``) is stored
by name and imports nothing here; ``fedunlearn.runs.resolve_config`` looks the names up and
validates the section where the run is assembled (docs/architecture.md, "The plugin seam").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from fedunlearn.errors import ConfigError


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


#: A user component: ``"pkg.module:function"`` (the attribute may be dotted: ``"pkg.m:Cls.make"``).
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_COMPONENT = rf"^{_DOTTED}:{_DOTTED}$"


def _component(value: str | None) -> str | None:
    """Return ``value`` if it is ``"pkg.module:function"`` or a registered name (None passes)."""
    if value is not None and not (
        re.fullmatch(_COMPONENT, value) or re.fullmatch(_REGISTERED, value)
    ):
        raise ValueError(
            "must name a function as 'pkg.module:function' (module path, a colon, the "
            "attribute) or by a name an installed package registers"
        )
    return value


def _changed(section: BaseModel, names: frozenset[str] | set[str]) -> list[str]:
    """Return which of ``names`` differ from their default in ``section`` (sorted)."""
    fields = type(section).model_fields
    return sorted(n for n in names if getattr(section, n) != fields[n].get_default())


#: A name registered under the entry-point group ``fedunlearn.models`` / ``fedunlearn.datasets``.
_REGISTERED = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
#: The largest finite float32: the engine's tensors cannot hold a step size past it.
FLOAT32_MAX = 3.4028234663852886e38
#: What a built-in dataset's loading and partitioning read; a data source splits by itself.
_PARTITION_FIELDS = frozenset(
    {
        "dataset",
        "data_dir",
        "partition",
        "alpha",
        "bias",
        "shards_per_client",
        "min_client_samples",
        "max_train_samples",
        "max_test_samples",
    }
)


class DataConfig(_Frozen):
    """Dataset and its split across clients."""

    # node-local: the clients' data stays on their Flower nodes (a user's own Flower app
    # recorded by fedunlearn.integrations.flower.Recording); no server loads it
    dataset: Literal[
        "digits", "mnist", "fashion-mnist", "cifar10", "ag_news", "synthetic", "node-local"
    ] = "digits"
    data_dir: str | None = None
    num_clients: int = Field(10, ge=1, le=100_000)
    partition: Literal["iid", "dirichlet", "label_bias", "shards"] = "iid"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    bias: float = Field(0.5, ge=0, le=1, description="label_bias q")
    shards_per_client: int = Field(2, ge=1)
    min_client_samples: int = Field(
        1,
        ge=0,
        description="smallest client size the partition draws (redraws until met); TV-stable "
        "runs need at least training.batch_size",
    )
    max_train_samples: int | None = Field(None, ge=1, description="subsample the train set")
    max_test_samples: int | None = Field(None, ge=1, description="subsample the test set")
    options: dict[str, Any] = Field(
        default_factory=dict, description="loader options (of data.source when given)"
    )
    source: str | None = Field(
        None,
        description="a user data source 'pkg.module:function' called as function(num_clients, "
        "seed, **options); returns the clients' data already split (fedunlearn.data."
        "FederatedData); replaces dataset and partition",
    )

    @field_validator("source")
    @classmethod
    def _source_shape(cls, value: str | None) -> str | None:
        return _component(value)

    @model_validator(mode="after")
    def _source_alone(self) -> DataConfig:
        if self.source is not None:
            clash = _changed(self, _PARTITION_FIELDS)
            if clash:
                raise ValueError(
                    f"data.source '{self.source}' returns the clients' data already split; "
                    f"data.{', data.'.join(clash)} cannot apply to it. Drop "
                    f"{'it' if len(clash) == 1 else 'them'}; the source's own options go in "
                    "data.options"
                )
        return self


class ModelConfig(_Frozen):
    """Model architecture, built by name or by a user factory (``factory`` with ``options``)."""

    name: Literal["logreg", "mlp", "cnn", "cnn_fmnist", "textcnn"] = "mlp"
    hidden: tuple[int, ...] = Field((128,), description="mlp hidden widths")
    factory: str | None = Field(
        None,
        description="a user model factory 'pkg.module:function' called as "
        "function(input_shape, num_classes, **options) -> torch.nn.Module; replaces name",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of model.factory"
    )

    @field_validator("factory")
    @classmethod
    def _factory_shape(cls, value: str | None) -> str | None:
        return _component(value)

    @model_validator(mode="after")
    def _factory_alone(self) -> ModelConfig:
        if self.factory is not None:
            clash = _changed(self, {"name", "hidden"})
            if clash:
                raise ValueError(
                    f"model.factory '{self.factory}' builds the model; model."
                    f"{' and model.'.join(clash)} cannot apply to it. Drop "
                    f"{'it' if len(clash) == 1 else 'them'}; the factory's options go in "
                    "model.options"
                )
        elif self.options:
            raise ValueError(
                "model.options are the keyword options of model.factory; give model.factory "
                "or drop model.options"
            )
        return self


class AggregatorConfig(_Frozen):
    """Aggregation rule and its options."""

    name: Literal["fedavg", "median", "trimmed_mean", "krum", "multi_krum"] = "fedavg"
    trim: int = Field(1, ge=0, description="trimmed mean: values cut at each end")
    krum_f: int = Field(1, ge=0, description="Krum: Byzantine clients tolerated")
    multi_krum_m: int | None = Field(None, ge=1, description="Multi-Krum: updates averaged")


class TrainingConfig(_Frozen):
    """Federated training: rounds, local SGD, participation, aggregation, execution.

    ``sampling``: ``fraction`` (default) samples ``participation`` of the clients without
    replacement and weighs uploads by n_c; ``tv_stable`` is FATS's deletion-ready sampling
    (docs/deletion_ready.md): K = ``participation`` x ``data.num_clients`` draws with
    replacement per round, weights by multiplicity, and ``local_steps`` local iterations on
    fresh mini-batches of ``batch_size`` samples, so most deletion requests recompute nothing
    (method ``tv_exact``). ``shards``: clients split into that many isolated sub-federations
    (``shard_map``, or a seeded balanced split), each training its own model; the run's model is
    their weight average, and a request retrains only the affected shards (``shard_retrain``).
    """

    rounds: int = Field(20, ge=1, le=100_000)
    local_epochs: int = Field(1, ge=1)
    lr: float = Field(0.05, gt=0)
    batch_size: int = Field(32, ge=1)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    participation: float = Field(1.0, gt=0, le=1)
    sampling: Literal["fraction", "tv_stable"] = Field(
        "fraction",
        description="fraction: participation without replacement, FedAvg by n_c; tv_stable: "
        "FATS's K draws with replacement and local_steps fresh mini-batches (deletion-ready)",
    )
    local_steps: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="local iterations per round (FATS's E), each on a fresh mini-batch of "
        "batch_size samples drawn without replacement (instead of local_epochs; needed by "
        "tv_stable)",
    )
    shards: int = Field(1, ge=1, le=10_000, description="isolated sub-federations (SISA for FL)")
    shard_map: dict[int, int] | None = Field(
        None, description="client -> shard (0..shards-1); default: a seeded balanced split"
    )
    aggregator: AggregatorConfig = AggregatorConfig()
    executor: Literal["auto", "serial", "vectorized", "pool"] = "auto"
    num_workers: int | None = Field(None, ge=1)
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|mps|cuda(:[0-9]+)?)$",
        description="local training, evaluation and unlearning's client work: auto (CUDA if "
        "torch sees a GPU, else the CPU), cpu, cuda, cuda:<index> or mps",
    )

    @field_validator("lr", "weight_decay")
    @classmethod
    def _float32_range(cls, value: float) -> float:
        # they multiply the engine's float32 tensors: past float32's range the step cannot run
        if value > FLOAT32_MAX:
            raise ValueError(
                f"must be at most {FLOAT32_MAX:.3g} (float32's largest value, the engine's "
                f"dtype); got {value:g}"
            )
        return value

    @model_validator(mode="after")
    def _deletion_ready(self) -> TrainingConfig:
        if self.local_steps is not None and self.local_epochs != 1:
            raise ValueError(
                "training.local_epochs and training.local_steps both set local work; keep one "
                "(local_steps: that many mini-batches of batch_size per round)"
            )
        if self.sampling == "tv_stable":
            if self.local_steps is None:
                raise ValueError(
                    "training.sampling 'tv_stable' needs training.local_steps (E, local "
                    "iterations per round on fresh mini-batches; the FATS paper uses 10)"
                )
            if self.aggregator.name != "fedavg":
                raise ValueError(
                    f"training.sampling 'tv_stable' aggregates by multiplicity (FedAvg over the "
                    f"round's draws); training.aggregator '{self.aggregator.name}' would change "
                    "what a deletion recomputes. Use aggregator fedavg"
                )
        if self.shard_map is not None:
            if self.shards == 1:
                raise ValueError("training.shard_map needs training.shards > 1")
            bad = sorted({s for s in self.shard_map.values() if not 0 <= s < self.shards})
            if bad:
                raise ValueError(
                    f"training.shard_map names shard(s) {bad}; shards are 0..{self.shards - 1}"
                )
        return self

    @model_validator(mode="after")
    def _pool_needs_cpu(self) -> TrainingConfig:
        # pool with device auto trains on the CPU (fl.executors.executor_device)
        if self.executor == "pool" and self.device not in ("auto", "cpu"):
            raise ValueError(
                f"training.executor 'pool' trains in CPU worker processes; it cannot use "
                f"training.device '{self.device}'. Use executor 'vectorized', 'serial' or 'auto' "
                "on a GPU"
            )
        return self


class AttackConfig(_Frozen):
    """Poisoning attack run by a seeded malicious client set, and when it runs.

    ``start_round``: the malicious clients train and upload honestly (on their clean data,
    without the update attack) before this round. ``join_round``: they join the federation at
    this round and are never sampled before it (with partial participation, the other clients
    are sampled from those present). Both default to 1: attackers present and attacking from
    the first round.
    """

    kind: Literal["none", "backdoor", "label_flip", "trim_random", "fang_trim"] = "none"
    num_malicious: int = Field(0, ge=0)
    target_label: int = Field(0, ge=0)
    trigger_size: int = Field(4, ge=1)
    poison_fraction: float = Field(1.0, ge=0, le=1)
    rho: float = Field(0.1, gt=0, le=1, description="trim_random: share of coordinates hit")
    sigma: float = Field(0.1, gt=0, description="trim_random: noise scale")
    p_noise: float = Field(0.8, ge=0, le=1, description="trim_random: noise vs replacement")
    fang_b: float = Field(2.0, gt=1, description="fang_trim: scale factor b")
    start_round: int = Field(1, ge=1, description="attackers behave honestly before this round")
    join_round: int = Field(1, ge=1, description="attackers are not sampled before this round")

    @model_validator(mode="after")
    def _consistent(self) -> AttackConfig:
        if self.kind == "none" and self.num_malicious:
            raise ValueError("attack.num_malicious > 0 needs an attack.kind other than 'none'")
        if self.kind != "none" and self.num_malicious == 0:
            raise ValueError(f"attack.kind '{self.kind}' needs attack.num_malicious >= 1")
        if self.kind == "none" and (self.start_round > 1 or self.join_round > 1):
            raise ValueError(
                "attack.start_round and attack.join_round schedule an attack; with "
                "attack.kind 'none' leave them at 1"
            )
        return self


class HistoryConfig(_Frozen):
    """What the server records during training (global models are always kept).

    ``policy`` names a recording policy (``fedunlearn.history.policy.POLICIES``: ``all``,
    ``every``, ``none`` and those installed plugins declare, e.g. ``crab``, ``fedadp``). A
    policy with options reads them from the section named after it (``history.crab: {...}``).
    This model stores the name and the sections as given; they are validated by the policy's
    own options model where the run is assembled (``fedunlearn.history.policy.resolve_history``,
    called by ``fedunlearn.runs``), which also fills the active policy's defaults.
    ``options(name)`` returns a validated section.
    """

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)

    policy: str = Field("all", description="recording policy, by registered name")
    every: int = Field(5, ge=1, description="policy 'every': keep updates of every k-th round")

    # set by ``resolve_history``: name -> the policy's options model (its defaults, when the
    # section is absent); None until the config is assembled
    _options_type: Callable[[str], type[BaseModel] | None] | None = PrivateAttr(None)

    def options(self, name: str) -> BaseModel:
        """Return the options of policy ``name``: its validated section, else its defaults.

        Raises:
            ConfigError: Policy ``name`` has no options, or the config was not assembled by
                ``fedunlearn.history.policy.resolve_history`` (``fedunlearn.runs`` does).
        """
        value = (self.__pydantic_extra__ or {}).get(name)
        if isinstance(value, BaseModel):
            return value
        if value is None and self._options_type is not None:
            options_type = self._options_type(name)
            if options_type is None:
                raise ConfigError(f"history policy '{name}' has no options")
            return options_type()
        raise ConfigError(
            f"history.{name} has not been validated; assemble the config with "
            "fedunlearn.history.policy.resolve_history (fedunlearn.runs does) before reading "
            "a policy's options"
        )


#: The budget options that used to sit flat in ``privacy`` (still accepted there, moved into
#: ``privacy.budget`` on parsing).
BUDGET_KEYS = ("epsilon_initial", "epsilon_min", "epsilon_max", "signed_delta")


def _nest_budget(privacy: dict[str, Any]) -> dict[str, Any]:
    """Return a ``privacy`` mapping with its flat budget keys moved into ``budget``.

    Raises:
        ValueError: a key is given both flat and in ``budget``.
    """
    if not any(k in privacy for k in BUDGET_KEYS):
        return privacy
    data = dict(privacy)
    budget = data.get("budget") or {}
    if isinstance(budget, BaseModel):
        budget = budget.model_dump()
    if not isinstance(budget, dict):
        return data  # the field validator reports the bad type
    budget = dict(budget)
    for key in BUDGET_KEYS:
        if key not in data:
            continue
        if key in budget:
            raise ValueError(
                f"privacy.{key} and privacy.budget.{key} are both given; keep "
                f"privacy.budget.{key} only"
            )
        budget[key] = data.pop(key)
    data["budget"] = budget
    return data


class BudgetConfig(_Frozen):
    """The per-round budget ε_t of DP training (the YAML section ``privacy.budget``).

    ``schedule`` names a budget schedule that an installed plugin declares
    (``fedunlearn.privacy.training.BUDGET_SCHEDULES``; checked where the run is assembled).
    ``fedadp`` is FedADP's adaptive budget (Eq. 4): ε_1 = ε_0 and
    ε_{t+1} = min(max(ε_t · e^{|Δloss|}, ε_min), ε_max); it is the only schedule so far, and its
    options are FedADP's, not the privacy layer's (docs/methods/fedadp.md, AD4-AD5). The same
    keys given flat in ``privacy`` (the pre-issue-13 layout) are accepted and moved here.
    """

    schedule: str = Field(
        "fedadp",
        description="budget schedule by name; fedadp: FedADP's Eq. 4 (ε follows the loss change)",
    )
    epsilon_initial: float = Field(1.0, gt=0, le=1000, description="ε_0")
    epsilon_min: float = Field(1.0, gt=0, le=1000, description="ε_min")
    epsilon_max: float = Field(3.0, gt=0, le=1000, description="ε_max")
    signed_delta: bool = Field(False, description="Eq. 4 with the signed loss change")

    @model_validator(mode="after")
    def _bounds(self) -> BudgetConfig:
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(
                f"privacy.budget.epsilon_min ({self.epsilon_min}) must not exceed "
                f"privacy.budget.epsilon_max ({self.epsilon_max})"
            )
        return self


class PrivacyConfig(_Frozen):
    """DP of training at FedADP's adaptive per-round budget ε_t (Eq. 4): the mechanism and budget.

    ``mechanism``: ``client_update`` clips each client's whole update to S and adds Gaussian
    noise (Eq. 5-6; client-level; docs/methods/fedadp.md AD1-AD5); ``dp_sgd`` trains each client
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
    sens_factor: Literal[1, 2] = Field(
        1, description="L2 sensitivity S (add/remove) or 2S (replace) for the headline ε"
    )
    budget: BudgetConfig = Field(
        default_factory=BudgetConfig, description="the per-round ε_t schedule (FedADP Eq. 4)"
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_budget_keys(cls, data: Any) -> Any:
        """Accept ``privacy.epsilon_max`` etc. (the flat layout) as ``privacy.budget.*``."""
        return _nest_budget(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyConfig:
        if isinstance(self.clip_norm, float) and not 0 < self.clip_norm <= 1e6:
            raise ValueError(
                f"privacy.clip_norm must be in (0, 1e6] or 'auto'; got {self.clip_norm}"
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


class MarkersConfig(_Frozen):
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


class VerificationConfig(_Frozen):
    """What clients do during training so that their removal can be verified later."""

    markers: MarkersConfig | None = None


class RunConfig(_Frozen):
    """A whole training run."""

    seed: int = Field(0, ge=0)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    attack: AttackConfig = AttackConfig()
    history: HistoryConfig = HistoryConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    verification: VerificationConfig = VerificationConfig()

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
            self.attack.kind == "backdoor"
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


def _format_errors(err: ValidationError, source: str) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        if msg.startswith(f"{where}."):  # a nested section's own errors, already located
            parts.append(msg)
        else:
            parts.append(f"{where}: {msg}{shown}")
    return f"invalid configuration in {source}: " + "; ".join(parts)


def _non_finite(data: Any, where: str = "") -> list[str]:
    """Return the dotted paths of every NaN or infinite float in ``data``."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _non_finite(v, f"{where}{k}.")]
    if isinstance(data, list | tuple):
        return [p for i, v in enumerate(data) for p in _non_finite(v, f"{where}{i}.")]
    if isinstance(data, float) and not math.isfinite(data):
        return [f"{where.rstrip('.')} ({data!r})"]
    return []


def parse_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a plain dict into a ``RunConfig``.

    Raises:
        ConfigError: naming every offending field, the value received and what is allowed.
    """
    bad = _non_finite(data or {})
    if bad:
        raise ConfigError(
            f"invalid configuration in {source}: {', '.join(bad)}: numbers must be finite "
            "(no .inf or .nan); give a finite value"
        )
    try:
        return RunConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(
                        f"key {key!r} appears twice in one mapping (lines {seen[key]} and "
                        f"{line}); YAML would keep the last silently. Keep one"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """Read a YAML file strictly (no duplicate keys), turning every failure into ConfigError.

    Args:
        path: The file.
        what: What the file is, for messages ("config file", "--params-file").

    Raises:
        ConfigError: The file is missing, a directory, unreadable, not UTF-8 text, not valid
            YAML, or has a duplicated key; the message names the file and what to do.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory; give a YAML file") from None
    except PermissionError:
        raise ConfigError(f"{what} {path} cannot be read (permission denied)") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x});"
            " give a YAML file"
        ) from None
    except OSError as err:
        raise ConfigError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{what} {path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{what} {path} is not valid YAML{where}: {problem}") from None


def _examples() -> str:
    shipped = Path(__file__).resolve().parents[2] / "configs"
    names = sorted(p.name for p in shipped.glob("*.yaml")) if shipped.is_dir() else []
    if names:
        return f"start from an example in {shipped}: {', '.join(names)}"
    return "start from an example in the configs/ directory of the fedunlearn repository"


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML file into a ``RunConfig``; ``overrides`` are merged over it (dotted keys ok).

    Raises:
        ConfigError: The file cannot be read, is not YAML, is empty, has a duplicated key or a
            non-finite number, or a field is invalid.
    """
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(
            f"config file {path} is empty; a run config names at least data, model and "
            f"training ({_examples()})"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping; got {type(data).__name__}")
    if isinstance(data.get("privacy"), dict):  # the flat budget keys, nested before overriding
        try:
            data["privacy"] = _nest_budget(data["privacy"])
        except ValueError as err:
            raise ConfigError(f"invalid configuration in {path}: {err}") from None
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        if parents == ["privacy"] and leaf in BUDGET_KEYS:  # privacy.epsilon_max=... still works
            parents = ["privacy", "budget"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return parse_config(data, str(path))


def dump_config(config: RunConfig) -> str:
    """Return the config as YAML (every field, defaults included)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
