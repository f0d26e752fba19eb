"""Open a finished run once and run unlearning methods on it.

``UnlearnSession(run_dir)`` checks the run is complete, opens its history read-only, rebuilds
the federation from the run's config (same data, same poisoning, same seeds) and hands each method
a fresh metered ``UnlearnContext``, whose history logs every payload the method reads (the
result's ``lineage``, traced by ``Unlearner.unlearn``: :mod:`fedunlearn.unlearn.lineage`).
Requests are validated before any work: unknown client ids, forgetting every client, and a
method needing history the run did not record each raise one clear error, and nothing on disk
changes (the store is opened read-only).

The session is composed of two views (``fedunlearn.unlearn.views``): ``run_view`` (what the run
is: config, store, M_0 and M_T, the federation's public pieces) and ``evaluation`` (test set,
clean client data, reference sets, ``evaluate``); the judge and the verifier read those.

Fresh updates on a ``dp_sgd`` run: the session wraps the federation's local training
(``Federation.with_local_training``) with ``ClippedTraining`` at the run's clip norm; the
federation itself is not changed (docs/methods/fedadp.md, AD9 and AD22).

Progress: ``run(method, request, progress=callback)`` calls ``callback(metrics)`` after each
unlearning round the method evaluates (every built-in method evaluates each round it runs).
Verification (the receipt) is one layer up: ``fedunlearn.eval.Verifier(session, request)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import torch

from fedunlearn.config import RunConfig
from fedunlearn.errors import HistoryError
from fedunlearn.fl.clients import RunClients
from fedunlearn.fl.federation import Federation
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR, build_setup, load_run_config
from fedunlearn.unlearn.base import Unlearner, UnlearnRequest, UnlearnResult
from fedunlearn.unlearn.context import (
    CostMeter,
    Evaluator,
    MeteredHistory,
    PrivateClients,
    RemainingClients,
    TrainingInfo,
    UnlearnContext,
)
from fedunlearn.unlearn.views import EvaluationView, RunView

RoundProgress = Callable[[dict[str, float]], None]


class UnlearnSession:
    """A finished run, opened for unlearning: its two views and fresh metered contexts.

    Args:
        run_dir: Directory written by ``fedunlearn train``.
        evaluate: Evaluate the model after every unlearning round (for per-round plots).

    Attributes:
        run_view: What the run is (``RunView``, read-only).
        evaluation: How its models are judged (``EvaluationView``).
        federation: The run's in-process clients as its config builds them (unchanged by the
            session; a deployment builds its own ``Clients`` from their public pieces).
    """

    def __init__(self, run_dir: str | Path, *, evaluate: bool = True) -> None:
        run_dir = Path(run_dir)
        config = load_run_config(run_dir)
        store = HistoryStore.open(run_dir / HISTORY_DIR)
        try:
            last = store.last_round()
            planned = config.training.rounds
            if last != planned:
                raise HistoryError(
                    f"{run_dir} finished {last or 0} of {planned} rounds; complete it with "
                    f"'fedunlearn train {run_dir / 'config.yaml'} --out {run_dir} "
                    "--resume' before unlearning"
                )
            self._setup = build_setup(config)
            federation = self._setup.federation
            try:
                self._fresh = _fresh_training(federation, config, store, run_dir)
            except BaseException:
                self._setup.close()
                raise
        except BaseException:
            store.close()
            raise
        self._evaluate_rounds = evaluate
        self._aggregator = self._setup.aggregator
        self.run_view = RunView(
            run_dir=run_dir,
            config=config,
            store=store,
            initial_params=store.read_model(0),
            final_params=store.read_model(planned),
            fingerprint=hashlib.sha256(config.model_dump_json().encode()).hexdigest(),
            model=federation.model,
            spec=federation.spec,
            client_sizes=MappingProxyType(
                {c: federation.num_samples(c) for c in federation.client_ids}
            ),
            malicious=federation.malicious,
        )
        self.evaluation = EvaluationView(self._setup)
        self.federation: Federation = federation

    def _evaluator(self, progress: RoundProgress | None) -> Evaluator | None:
        if not self._evaluate_rounds:
            return None
        if progress is None:
            return self.evaluation.evaluate

        def evaluate(params: torch.Tensor) -> dict[str, float]:
            metrics = self.evaluation.evaluate(params)
            progress(metrics)
            return metrics

        return evaluate

    def context(
        self,
        request: UnlearnRequest,
        *,
        progress: RoundProgress | None = None,
        clients: RunClients | None = None,
    ) -> UnlearnContext:
        """Return a fresh metered context for one method run.

        Args:
            request: The clients to remove.
            progress: Called with the metrics of each unlearning round the method evaluates
                (only when the session evaluates rounds).
            clients: Where fresh client work goes instead of the in-process federation (e.g.
                Flower's ``FlowerClients``); the context restricts and meters them alike.
        """
        run = self.run_view
        run.check_request(request)
        meter = CostMeter()
        training = run.config.training
        return UnlearnContext(
            history=MeteredHistory(run.store, meter),
            clients=RemainingClients(clients or self._fresh, request.forget, meter),
            aggregator=self._aggregator,
            num_rounds=training.rounds,
            initial_params=run.initial_params,
            final_params=run.final_params,
            meter=meter,
            evaluate=self._evaluator(progress),
            training=TrainingInfo(training.participation, training.aggregator.name),
            recording=run.config.history,
            privacy=run.config.privacy,
            fingerprint=run.fingerprint,
            reference_provider=self.evaluation.reference_set,
            private_clients=self._private_clients(request.forget, meter),
        )

    def _private_clients(
        self, forget: frozenset[int], meter: CostMeter
    ) -> Callable[[Callable[[int], float]], PrivateClients] | None:
        """Return the builder of the remaining clients under the run's DP mechanism, or None.

        For a method that releases a DP model (FedADP's ``unlearn_dp``): the run's mechanism
        (``fedunlearn.privacy.reference``) at the budget ``epsilon_of`` gives, metered; None when
        training used no mechanism (no DP, or ``dp_scope: store_only``).
        """
        config = self.run_view.config
        if not (config.privacy.enabled and config.privacy.dp_scope == "train_and_store"):
            return None
        from fedunlearn.privacy.reference import mechanism_stats, with_run_mechanism

        store = self.run_view.store

        def build(epsilon_of: Callable[[int], float]) -> PrivateClients:
            fed = with_run_mechanism(
                self.federation,
                config.privacy,
                store.round_scalars,
                seed=config.seed,
                epsilon_of=epsilon_of,
            )
            if fed is None:  # unreachable: the mechanism ran in training (checked above)
                raise HistoryError("this run trained without a DP mechanism to re-run")
            return PrivateClients(
                RemainingClients(fed, forget, meter), lambda: mechanism_stats(fed), fed.close
            )

        return build

    def run(
        self,
        method: Unlearner,
        request: UnlearnRequest,
        *,
        progress: RoundProgress | None = None,
    ) -> UnlearnResult:
        """Validate the request, check the history, run ``method`` and return its result.

        Args:
            method: The unlearning method.
            request: The clients to remove.
            progress: Called with the metrics of each unlearning round (see ``context``).
        """
        context = self.context(request, progress=progress)
        return method.unlearn(request, context)

    def close(self) -> None:
        """Close the store and stop worker processes."""
        if self._fresh is not self._setup.federation:
            self._fresh.close()
        self._setup.close()
        self.run_view.store.close()

    def __enter__(self) -> UnlearnSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fresh_training(
    federation: Federation, config: RunConfig, store: HistoryStore, run_dir: Path
) -> Federation:
    """Return the clients fresh unlearning updates come from: on a ``dp_sgd`` run, clipped.

    The run's learning rate was chosen for steps of clipped per-example gradients; plain SGD
    at that rate can diverge (the DP-SGD CNN of reproductions/fedadp: lr 1.0). Fresh updates
    therefore use the run's optimiser without its noise (``ClippedTraining`` at the run's C,
    wrapped around ``federation``, which is not changed): no DP on fresh updates, as before
    (docs/methods/fedadp.md, AD9 and AD22). Other runs: ``federation`` itself.
    """
    privacy = config.privacy
    if not (privacy.enabled and privacy.mechanism == "dp_sgd"):
        return federation
    from fedunlearn.privacy.ledger import DP_SGD_SCALAR_KEYS
    from fedunlearn.privacy.local_training import ClippedTraining

    clip = store.round_scalars(1).get(DP_SGD_SCALAR_KEYS["clip_norm"])
    if clip is None:
        raise HistoryError(
            f"{run_dir} was trained with privacy.mechanism 'dp_sgd' but round 1 has no "
            f"'{DP_SGD_SCALAR_KEYS['clip_norm']}' scalar; its ledger is incomplete"
        )
    clipped = ClippedTraining(
        federation.model, federation.training_data, clip_norm=float(clip), device=federation.device
    )
    return federation.with_local_training(clipped)
