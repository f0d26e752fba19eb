"""A finished run seen two ways: what it is (``RunView``) and how its models are judged.

``RunView`` is read-only: the run's config, its history store (opened read-only), the initial
and final global models, the federation's public pieces (client ids and sizes, the attackers,
the model template and local training spec) and the config's fingerprint. It validates a
request against the run (``check_request``).

``EvaluationView`` holds what judging a model of the run needs and an unlearning method must not
see: the test set, the backdoor trigger, the clients' clean (pre-poisoning) data, the seeded
reference sets, the clients' participation markers and ``evaluate`` (test accuracy, loss,
backdoor ASR).

``fedunlearn.unlearn.session.UnlearnSession`` opens a run and builds both; the judge and the
verifier (``fedunlearn.eval``) read them and nothing else.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedunlearn.config import RunConfig, backdoor_target
from fedunlearn.errors import ConfigError, UnknownClientError
from fedunlearn.fl.attacks import BackdoorTrigger
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.markers import Marker
from fedunlearn.fl.records import ClientData
from fedunlearn.history.store import HistoryStore
from fedunlearn.models import set_flat_params
from fedunlearn.runs import Setup, reference_set
from fedunlearn.unlearn.base import UnlearnRequest

__all__ = ["ClientSideEvaluation", "EvaluationView", "ModuleEvaluator", "RunView", "module_with"]


@dataclass(frozen=True)
class RunView:
    """What a finished run is (read-only).

    Attributes:
        run_dir: The run directory.
        config: The run's config.
        store: Its history store, opened read-only.
        initial_params: M_0.
        final_params: M_T.
        fingerprint: SHA-256 of the config (cache keys).
        model: The model template (its structure; evaluate flat vectors with it).
        spec: The run's local training hyperparameters.
        client_sizes: Client id -> n_c, for every client of the run (read-only mapping).
        malicious: The attacking clients (the ground truth a detector would name).
        num_rounds: The run's last round now (the store's: after ``apply`` or
            ``train --continue`` it differs from ``config.training.rounds``).
        generation: How many unlearning results were applied to the run (docs/lifecycle.md).
        forgotten: Every client an applied result or ``forget`` removed earlier: each later
            request forgets them too.
        applied: The clients an applied result removed (their influence left the run's
            model already; a request naming only them has nothing new to forget).
        clean_from_round: 0, or the round a model-only apply appended (the rounds before it
            carry the earlier clients' influence).
    """

    run_dir: Path
    config: RunConfig
    store: HistoryStore
    initial_params: torch.Tensor
    final_params: torch.Tensor
    fingerprint: str
    model: nn.Module
    spec: LocalTrainingSpec
    client_sizes: Mapping[int, int]
    malicious: frozenset[int]
    num_rounds: int = 0
    generation: int = 0
    forgotten: frozenset[int] = frozenset()
    clean_from_round: int = 0
    applied: frozenset[int] = frozenset()

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Every client of the run, sorted."""
        return tuple(sorted(self.client_sizes))

    def check_request(self, request: UnlearnRequest) -> None:
        """Raise a clear error if the request names unknown clients or every client."""
        ids = self.client_ids
        unknown = sorted(request.forget - set(ids))
        if unknown:
            raise UnknownClientError(
                f"client(s) {', '.join(map(str, unknown))} not in this run "
                f"(client ids {ids[0]}..{ids[-1]}); nothing was changed"
            )
        if request.forget >= set(ids):
            raise ConfigError(
                f"cannot forget every client ({len(ids)} of {len(ids)}): nothing would remain "
                "to train on; retrain from scratch with new clients instead"
            )


#: A user's evaluation: the run's module holding the model to judge (eval mode) -> metrics.
ModuleEvaluator = Callable[[nn.Module], dict[str, float]]


def module_with(template: nn.Module, params: torch.Tensor) -> nn.Module:
    """Return a copy of ``template`` holding the flat ``params`` (parameters and buffers), eval."""
    return set_flat_params(copy.deepcopy(template).cpu(), params.detach().cpu()).eval()


class EvaluationView:
    """How models of a run are judged: test set, trigger, clean client data, reference sets.

    Args:
        setup: The run's setup (``fedunlearn.runs.build_setup``); only read.
        evaluator: Extra metrics of a model (``evaluator(module)``), added to the built-in
            ones.
    """

    def __init__(self, setup: Setup, *, evaluator: ModuleEvaluator | None = None) -> None:
        self._setup = setup
        self._references: dict[int, ClientData] = {}
        self._evaluator = evaluator

    @property
    def model(self) -> nn.Module:
        """The model template."""
        return self._setup.model

    @property
    def x_test(self) -> torch.Tensor:
        """Test inputs."""
        return self._setup.x_test

    @property
    def y_test(self) -> torch.Tensor:
        """Test labels."""
        return self._setup.y_test

    @property
    def trigger(self) -> BackdoorTrigger | None:
        """The backdoor trigger of a backdoor run, else None."""
        return self._setup.trigger

    @property
    def target_label(self) -> int:
        """The label a backdoor or targeted attack aims at."""
        return backdoor_target(self._setup.config.attack)

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Return test accuracy, test loss and (with a backdoor attack) the backdoor ASR."""
        metrics = self._setup.evaluate(params)
        if self._evaluator is not None:
            metrics.update(self._evaluator(module_with(self._setup.model, params)))
        return metrics

    def held_out(self, client_id: int) -> ClientData | None:
        """Return the client's held-out set where the user's data gives one, else None."""
        pair = self._setup.held_out.get(client_id)
        return None if pair is None else ClientData(*pair)

    @property
    def markers(self) -> Mapping[int, Marker]:
        """Client -> its participation marker (``verification.markers``; empty without).

        A client's secret: in a deployment only the client holds it and probes for it.
        """
        return dict(self._setup.markers)

    def clean_data(self, client_id: int) -> ClientData:
        """Return a client's training data before poisoning (true labels, no trigger)."""
        return self._setup.clean_data(client_id)

    def reference_set(self, size: int) -> ClientData:
        """Return the run's seeded clean reference subsample of ``size`` samples (cached)."""
        if size not in self._references:
            self._references[size] = reference_set(self._setup, size)
        return self._references[size]


class ClientSideEvaluation(EvaluationView):
    """Judging a run whose clients keep their data: only the user's ``evaluator`` runs here.

    What needs the clients' data on the server (test set, clean client data, reference sets)
    raises ``ConfigError`` naming why; checks that need it say they cannot run.

    Args:
        model: The run's module (its structure).
        config: The run's config.
        evaluator: ``evaluator(module) -> metrics``; None: models are not evaluated ({}).
    """

    def __init__(
        self, model: nn.Module, config: RunConfig, *, evaluator: ModuleEvaluator | None = None
    ) -> None:
        self._model = model
        self._config = config
        self._evaluator = evaluator
        self._references = {}

    def _absent(self, what: str) -> ConfigError:
        return ConfigError(
            f"{what} is not available: this run's data stays on its clients (the server never "
            "loaded it); evaluate through the evaluator given to UnlearnSession or on the clients"
        )

    @property
    def model(self) -> nn.Module:
        """The model template."""
        return self._model

    @property
    def x_test(self) -> torch.Tensor:
        """Not available (raises ``ConfigError``)."""
        raise self._absent("the test set")

    @property
    def y_test(self) -> torch.Tensor:
        """Not available (raises ``ConfigError``)."""
        raise self._absent("the test set")

    @property
    def trigger(self) -> BackdoorTrigger | None:
        """None: no trigger is known on the server."""
        return None

    @property
    def target_label(self) -> int:
        """The label a backdoor or targeted attack aims at."""
        return backdoor_target(self._config.attack)

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Return the evaluator's metrics of ``params`` ({} without an evaluator)."""
        if self._evaluator is None:
            return {}
        return dict(self._evaluator(module_with(self._model, params)))

    def held_out(self, client_id: int) -> ClientData | None:
        """None: held-out sets stay on the clients."""
        return None

    def clean_data(self, client_id: int) -> ClientData:
        """Not available (raises ``ConfigError``)."""
        raise self._absent(f"client {client_id}'s data")

    def reference_set(self, size: int) -> ClientData:
        """Not available (raises ``ConfigError``)."""
        raise self._absent("a reference set of the clients' data")
