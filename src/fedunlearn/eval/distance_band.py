"""The distance check's pass band, measured from independent exact retrains (issue 21, item 7).

Two exact unlearnings of the same request need not land on the same weights: Retrain from M_0
without the forgotten clients follows one batch order per (round, client); another batch order
gives another model that is just as exact. *Independent exact retrains* here are Retrain with
another seed salt for the clients' local training: the same M_0, the same data without the
forgotten clients, the same participants per round, the same hyperparameters and aggregation,
other batch orders (the "out" references of the client-level membership test are trained the
same way). The initial model is not resampled: every method starts from the run's M_0, so a
band that included other initialisations would be wider than any method needs.

``measure_distance_band(session, request, retrain, count=k)`` trains ``k`` of them and returns a
``DistanceBand``: each one's relative distance ``||r_i - r|| / ||o - r||`` to Retrain ``r`` (``o``
the original) and the band: the one-sided Student-t prediction bound of those distances at 95%
(where one more independent retrain lands with probability 0.95; the same bound the
client-level membership test uses for its threshold). The distance check passes a model inside
the band only when the original (and the original plus noise) lies outside it, else it says the
check has no power (docs/verification.md, "Distance band").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.mia.client_lira import (
    _Budget,
    _run_participants,
    _SaltedClients,
    _threshold,
    _train_reference,
    share_toward,
)
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession

__all__ = ["DistanceBand", "independent_retrains", "measure_distance_band", "upper_bound"]


@dataclass(frozen=True)
class DistanceBand:
    """The spread of independent exact retrains around Retrain.

    Attributes:
        relative: Each independent retrain's ``||r_i - r|| / ||o - r||`` (at least 2).
        level: The prediction level of the band (0.95).
        cost_seconds: Wall seconds spent training them.
        cost_client_epochs: Client epochs spent.
        toward: Each one's share of the way from Retrain to the original along their
            difference (``share_toward``: 0 at Retrain, 1 at the original); empty when not
            measured.
    """

    relative: tuple[float, ...]
    cost_seconds: float
    cost_client_epochs: float
    level: float = 0.95
    toward: tuple[float, ...] = ()

    @property
    def toward_line(self) -> float | None:
        """The prediction bound of ``toward`` at ``level`` (None: fewer than 2 measured)."""
        return upper_bound(self.toward, self.level) if len(self.toward) >= 2 else None

    @property
    def band(self) -> float:
        """The pass line: the Student-t prediction bound of ``relative`` at ``level``."""
        return _threshold(np.asarray(self.relative, dtype=np.float64), 1.0 - self.level)

    def to_dict(self) -> dict[str, object]:
        """Return a JSON-ready dict."""
        return {
            "relative": list(self.relative),
            "band": self.band,
            "count": len(self.relative),
            "level": self.level,
            "cost_seconds": self.cost_seconds,
            "cost_client_epochs": self.cost_client_epochs,
            "toward": list(self.toward),
        }


def upper_bound(values: tuple[float, ...] | list[float], level: float = 0.95) -> float:
    """Return the one-sided Student-t prediction bound at ``level`` of one more draw."""
    return _threshold(np.asarray(values, dtype=np.float64), 1.0 - level)


def independent_retrains(
    session: UnlearnSession,
    request: UnlearnRequest,
    count: int,
    *,
    seed: int = 0,
    max_seconds: float = 300.0,
) -> tuple[list[torch.Tensor], float]:
    """Train ``count`` exact retrains of ``request`` with other batch orders.

    Returns the models trained within ``max_seconds`` (no round starts past it) and their
    client epochs.

    Raises:
        ConfigError: for a ``count`` below 1.
    """
    if count < 1:
        raise ConfigError(f"independent retrains: count must be >= 1; got {count}")
    federation = session.federation
    forgotten = frozenset(request.forget)
    rounds = _run_participants(session)
    aggregator = session.context(request).aggregator
    budget = _Budget(max_seconds)
    models, epochs = [], 0.0
    for j in range(count):
        salt = derive_seed(seed, "distance_band", j)
        trained = _train_reference(
            _SaltedClients(federation, salt),
            session.run_view.initial_params,
            rounds,
            aggregator,
            forgotten,
            budget,
        )
        if trained is None:
            break
        models.append(trained[0].to(torch.float32))
        epochs += trained[1]
    return models, epochs


def measure_distance_band(
    session: UnlearnSession,
    request: UnlearnRequest,
    retrain: UnlearnResult,
    *,
    count: int = 3,
    seed: int = 0,
    max_seconds: float = 300.0,
) -> DistanceBand | None:
    """Return the band of ``count`` independent exact retrains around ``retrain``.

    None when fewer than 2 could be trained within ``max_seconds`` (no spread to measure) or
    the original equals Retrain.

    Raises:
        ConfigError: for a ``count`` below 2.
    """
    if count < 2:
        raise ConfigError(
            f"a distance band needs at least 2 independent retrains to measure a spread; got "
            f"count={count}"
        )
    began = time.perf_counter()
    models, epochs = independent_retrains(
        session, request, count, seed=seed, max_seconds=max_seconds
    )
    gap = l2_distance(session.run_view.final_params, retrain.params)
    if len(models) < 2 or gap == 0.0:
        return None
    relative = tuple(l2_distance(m, retrain.params) / gap for m in models)
    original = session.run_view.final_params
    toward = tuple(share_toward(m, retrain.params, original) for m in models)
    return DistanceBand(relative, time.perf_counter() - began, epochs, toward=toward)
