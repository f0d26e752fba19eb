"""The ``data`` and ``model`` sections: the dataset and its split, the model architecture."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from fedunlearn.config.base import Component, Frozen, refuse_replaced

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


class DataConfig(Frozen):
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
    source: Component = Field(
        None,
        description="a user data source 'pkg.module:function' called as function(num_clients, "
        "seed, **options); returns the clients' data already split (fedunlearn.data."
        "FederatedData); replaces dataset and partition",
    )

    @model_validator(mode="after")
    def _source_alone(self) -> DataConfig:
        if self.source is not None:
            refuse_replaced(
                self,
                _PARTITION_FIELDS,
                replaced_by=f"data.source '{self.source}' returns the clients' data already split",
                joiner=", ",
                options="the source's own options go in data.options",
            )
        return self


class ModelConfig(Frozen):
    """Model architecture, built by name or by a user factory (``factory`` with ``options``)."""

    name: Literal["logreg", "mlp", "cnn", "cnn_fmnist", "textcnn"] = "mlp"
    hidden: tuple[int, ...] = Field((128,), description="mlp hidden widths")
    factory: Component = Field(
        None,
        description="a user model factory 'pkg.module:function' called as "
        "function(input_shape, num_classes, **options) -> torch.nn.Module; replaces name",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of model.factory"
    )

    @model_validator(mode="after")
    def _factory_alone(self) -> ModelConfig:
        if self.factory is not None:
            refuse_replaced(
                self,
                {"name", "hidden"},
                replaced_by=f"model.factory '{self.factory}' builds the model",
                joiner=" and ",
                options="the factory's options go in model.options",
            )
        elif self.options:
            raise ValueError(
                "model.options are the keyword options of model.factory; give model.factory "
                "or drop model.options"
            )
        return self
