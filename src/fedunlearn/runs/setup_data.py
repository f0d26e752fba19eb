"""The data a run's config names, loaded before poisoning (``fedunlearn.runs.setup``).

A user data source (``data.source`` or ``data=``: ``fedunlearn.runs.user``) gives the clients'
data as it is; a registered dataset is subsampled (``data.max_train_samples``,
``max_test_samples``) and partitioned among the clients, every draw seeded from the run's seed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedunlearn.config import BackdoorAttack, RunConfig
from fedunlearn.data import Dataset, FederatedData, load_dataset, partition
from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs.user import FunctionTrigger, user_data

__all__ = ["LoadedData", "load_data"]


def _subsample(
    x: np.ndarray, y: np.ndarray, limit: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if limit is None or limit >= len(y):
        return x, y
    idx = np.sort(np.random.default_rng(seed).choice(len(y), size=limit, replace=False))
    return x[idx], y[idx]


#: partition()'s parameters -> the config keys that set them (its errors, in the user's words).
_CONFIG_KEYS = {
    "num_clients": "data.num_clients",
    "min_size": "data.min_client_samples",
    "alpha": "data.alpha",
    "bias": "data.bias",
    "shards_per_client": "data.shards_per_client",
}
_CONFIG_WORDS = re.compile(r"(?<![.\w])(" + "|".join(_CONFIG_KEYS) + r")\b")


def _builtin_data(
    cfg: RunConfig,
) -> tuple[Dataset, dict[int, ClientData], np.ndarray, np.ndarray]:
    """Load a registered dataset, subsample it and partition it among the clients."""
    dataset = load_dataset(cfg.data.dataset, data_dir=cfg.data.data_dir, **cfg.data.options)
    x_train, y_train = _subsample(
        dataset.x_train,
        dataset.y_train,
        cfg.data.max_train_samples,
        derive_seed(cfg.seed, "partition", 1),
    )
    x_test, y_test = _subsample(
        dataset.x_test,
        dataset.y_test,
        cfg.data.max_test_samples,
        derive_seed(cfg.seed, "partition", 2),
    )
    if isinstance(cfg.attack, BackdoorAttack) and cfg.attack.target_label >= dataset.num_classes:
        raise ConfigError(
            f"attack.target_label {cfg.attack.target_label} is not a class of "
            f"{dataset.name} (0..{dataset.num_classes - 1})"
        )
    try:
        parts = partition(
            y_train,
            cfg.data.num_clients,
            cfg.data.partition,
            seed=derive_seed(cfg.seed, "partition", 0),
            alpha=cfg.data.alpha,
            bias=cfg.data.bias,
            shards_per_client=cfg.data.shards_per_client,
            min_size=cfg.data.min_client_samples,
        )
    except ConfigError as err:  # partition() names its parameters; the user wrote config keys
        raise ConfigError(_CONFIG_WORDS.sub(lambda m: _CONFIG_KEYS[m[0]], str(err))) from None
    x_all, y_all = torch.from_numpy(np.ascontiguousarray(x_train)), torch.from_numpy(y_train)
    client_data = {c: ClientData(x_all[idx], y_all[idx]) for c, idx in enumerate(parts)}
    return dataset, client_data, x_test, y_test


@dataclass(frozen=True)
class LoadedData:
    """The data a config names, before poisoning: the clients', the test set, its shape."""

    dataset: Dataset | FederatedData
    client_data: dict[int, ClientData]
    x_test: torch.Tensor
    y_test: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int
    trigger: FunctionTrigger | None  # a user data source's own backdoor trigger


def load_data(
    cfg: RunConfig,
    data: FederatedData | Mapping[str, Any] | None,
    components: dict[str, dict[str, Any]],
) -> LoadedData:
    """Load the clients' data: a user data source (recorded in ``components``) or a dataset."""
    if data is not None or cfg.data.source is not None:
        user = user_data(cfg, data)
        components["data"] = user.record
        x_test, y_test = user.data.test
        input_shape, num_classes = user.data.input_shape, int(user.data.num_classes or 0)
        assert input_shape is not None  # FederatedData derives it from the test set when absent
        trigger_function = user.data.trigger  # the attack and the checks call .apply(x)
        if isinstance(cfg.attack, BackdoorAttack) and cfg.attack.target_label >= num_classes:
            raise ConfigError(
                f"attack.target_label {cfg.attack.target_label} is not a class of "
                f"{user.what} (0..{num_classes - 1})"
            )
        return LoadedData(
            user.data,
            {c: ClientData(x, y) for c, (x, y) in user.data.clients.items()},
            x_test,
            y_test,
            input_shape,
            num_classes,
            None if trigger_function is None else FunctionTrigger(trigger_function),
        )
    if cfg.data.dataset == "node-local":
        raise ConfigError(
            "this run was recorded from a Flower app whose clients keep their data on their "
            "nodes (data.dataset: node-local); nothing loads it here: unlearn it over the app "
            "(docs/deployment.md, 'Your own Flower app')"
        )
    dataset, client_data, x_np, y_np = _builtin_data(cfg)
    return LoadedData(
        dataset,
        client_data,
        torch.from_numpy(np.ascontiguousarray(x_np)),
        torch.from_numpy(y_np),
        dataset.input_shape,
        dataset.num_classes,
        None,
    )
