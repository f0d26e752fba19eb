"""The ``training`` section: rounds, local SGD, participation, aggregation and execution.

``training.aggregator`` is a discriminated union on ``name``: each rule's options live on its own
model (``trim`` on ``trimmed_mean``, ``krum_f`` on ``krum`` and ``multi_krum``, ``multi_krum_m``
on ``multi_krum``), so an option given to a rule that ignores it is an error naming both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from fedunlearn.config.base import FLOAT32_MAX, Frozen, Variant, pick_variant


class _Aggregator(Variant):
    """An aggregation rule; ``options("name")`` are the keyword options of ``make_aggregator``."""

    LAYOUT = (("name", "fedavg"), ("trim", 1), ("krum_f", 1), ("multi_krum_m", None))


class FedAvgAggregator(_Aggregator):
    """FedAvg: the mean of the updates weighted by n_c (no options)."""

    name: Literal["fedavg"] = "fedavg"


class MedianAggregator(_Aggregator):
    """The coordinate-wise median (no options)."""

    name: Literal["median"] = "median"


class TrimmedMeanAggregator(_Aggregator):
    """The coordinate-wise trimmed mean."""

    name: Literal["trimmed_mean"] = "trimmed_mean"
    trim: int = Field(1, ge=0, description="trimmed mean: values cut at each end")


class KrumAggregator(_Aggregator):
    """Krum: the update closest to its neighbours."""

    name: Literal["krum"] = "krum"
    krum_f: int = Field(1, ge=0, description="Krum: Byzantine clients tolerated")


class MultiKrumAggregator(_Aggregator):
    """Multi-Krum: the mean of the m updates Krum scores best."""

    name: Literal["multi_krum"] = "multi_krum"
    krum_f: int = Field(1, ge=0, description="Krum: Byzantine clients tolerated")
    multi_krum_m: int | None = Field(None, ge=1, description="Multi-Krum: updates averaged")


#: ``training.aggregator.name`` -> the rule's model (the first is the default).
AGGREGATOR_MODELS: dict[str, type[_Aggregator]] = {
    "fedavg": FedAvgAggregator,
    "median": MedianAggregator,
    "trimmed_mean": TrimmedMeanAggregator,
    "krum": KrumAggregator,
    "multi_krum": MultiKrumAggregator,
}

#: Aggregation rule and its options: one model per rule, picked by ``name``.
AggregatorConfig = Annotated[
    FedAvgAggregator
    | MedianAggregator
    | TrimmedMeanAggregator
    | KrumAggregator
    | MultiKrumAggregator,
    Field(discriminator="name"),
]


#: The most rounds a run may have (``training.rounds``; ``train --continue`` targets too).
MAX_ROUNDS = 100_000


class TrainingConfig(Frozen):
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

    rounds: int = Field(20, ge=1, le=MAX_ROUNDS)
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
    aggregator: AggregatorConfig = FedAvgAggregator()
    executor: Literal["auto", "serial", "vectorized", "pool"] = "auto"
    num_workers: int | None = Field(None, ge=1)
    eval_every: int = Field(
        1,
        ge=1,
        le=100_000,
        description="test-set evaluation every that many rounds, and at the last round (the "
        "server loss a DP schedule or a recording policy reads is measured every round)",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|mps|cuda(:[0-9]+)?)$",
        description="local training, evaluation and unlearning's client work: auto (CUDA if "
        "torch sees a GPU, else the CPU), cpu, cuda, cuda:<index> or mps",
    )

    @model_serializer(mode="wrap")
    def _leave_out_defaults_added_later(self, handler: SerializerFunctionWrapHandler) -> Any:
        # a field added after runs were stored is left out at its default, so the config's
        # dump, config.yaml and the run's fingerprint (runs.fingerprint) of every earlier run
        # stay what they were
        data = handler(self)
        if isinstance(data, dict) and data.get("eval_every") == 1:
            del data["eval_every"]
        return data

    @field_validator("aggregator", mode="before")
    @classmethod
    def _aggregator_variant(cls, value: Any) -> Any:
        return pick_variant(
            value, section="training.aggregator", key="name", variants=AGGREGATOR_MODELS
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
