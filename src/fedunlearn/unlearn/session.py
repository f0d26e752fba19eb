"""Open a finished run once and run unlearning methods on it.

``UnlearnSession(run_dir)`` checks the run is complete, opens its history read-only, rebuilds
the federation from the run's config (same data, same poisoning, same seeds) and hands each method
a fresh metered ``UnlearnContext``. Requests are validated before any work: unknown client ids,
forgetting every client, and a method needing history the run did not record each raise one
clear error, and nothing on disk changes (the store is opened read-only).

Progress: ``run(method, request, progress=callback)`` calls ``callback(metrics)`` after each
unlearning round the method evaluates (every built-in method evaluates each round it runs).
Verification (the receipt) is one layer up: ``fedunlearn.eval.Verifier(session, request)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch

from fedunlearn.errors import ConfigError, HistoryError, UnknownClientError
from fedunlearn.fl.records import ClientData
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR, Setup, build_setup, load_run_config, reference_set
from fedunlearn.unlearn.base import Unlearner, UnlearnRequest, UnlearnResult
from fedunlearn.unlearn.context import (
    CostMeter,
    Evaluator,
    MeteredHistory,
    RemainingClients,
    TrainingInfo,
    UnlearnContext,
)

RoundProgress = Callable[[dict[str, float]], None]


class UnlearnSession:
    """A finished run, opened for unlearning.

    Args:
        run_dir: Directory written by ``fedunlearn train``.
        evaluate: Evaluate the model after every unlearning round (for per-round plots).
    """

    def __init__(self, run_dir: str | Path, *, evaluate: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.config = load_run_config(self.run_dir)
        self.store = HistoryStore.open(self.run_dir / HISTORY_DIR)
        try:
            last = self.store.last_round()
            planned = self.config.training.rounds
            if last != planned:
                raise HistoryError(
                    f"{self.run_dir} finished {last or 0} of {planned} rounds; complete it with "
                    f"'fedunlearn train {self.run_dir / 'config.yaml'} --out {self.run_dir} "
                    "--resume' before unlearning"
                )
            self.setup: Setup = build_setup(self.config)
            self._clip_like_training()
        except BaseException:
            self.store.close()
            raise
        self.evaluate = evaluate
        self.final_params = self.store.read_model(planned)
        self.initial_params = self.store.read_model(0)
        self._references: dict[int, ClientData] = {}
        self.fingerprint = hashlib.sha256(self.config.model_dump_json().encode()).hexdigest()

    def _clip_like_training(self) -> None:
        """On a ``dp_sgd`` run, fresh local training clips per example like training did.

        The run's learning rate was chosen for steps of clipped per-example gradients; plain SGD
        at that rate can diverge (the DP-SGD CNN of reproductions/fedadp: lr 1.0). Fresh updates
        therefore use the run's optimiser without its noise (``ClippedTraining`` at the run's
        C): no DP on fresh updates, as before (docs/methods/fedadp.md, AD9 and AD22).
        """
        privacy = self.config.privacy
        if not (privacy.enabled and privacy.mechanism == "dp_sgd"):
            return
        from fedunlearn.privacy.ledger import DP_SGD_SCALAR_KEYS
        from fedunlearn.privacy.local_training import ClippedTraining

        clip = self.store.round_scalars(1).get(DP_SGD_SCALAR_KEYS["clip_norm"])
        if clip is None:
            raise HistoryError(
                f"{self.run_dir} was trained with privacy.mechanism 'dp_sgd' but round 1 has no "
                f"'{DP_SGD_SCALAR_KEYS['clip_norm']}' scalar; its ledger is incomplete"
            )
        fed = self.setup.federation
        fed.local_training = ClippedTraining(
            fed.model, fed.training_data, clip_norm=float(clip), device=getattr(fed, "device", None)
        )

    def reference_set(self, size: int) -> ClientData:
        """Return the run's seeded clean reference subsample of ``size`` samples (cached)."""
        if size not in self._references:
            self._references[size] = reference_set(self.setup, size)
        return self._references[size]

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Every client of the run."""
        return self.setup.federation.client_ids

    @property
    def malicious(self) -> frozenset[int]:
        """The run's attacking clients (the ground truth a detector would name)."""
        return self.setup.federation.malicious

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

    def _evaluator(self, progress: RoundProgress | None) -> Evaluator | None:
        if not self.evaluate:
            return None
        if progress is None:
            return self.setup.evaluate

        def evaluate(params: torch.Tensor) -> dict[str, float]:
            metrics = self.setup.evaluate(params)
            progress(metrics)
            return metrics

        return evaluate

    def context(
        self, request: UnlearnRequest, *, progress: RoundProgress | None = None
    ) -> UnlearnContext:
        """Return a fresh metered context for one method run.

        Args:
            request: The clients to remove.
            progress: Called with the metrics of each unlearning round the method evaluates
                (only when the session evaluates rounds).
        """
        self.check_request(request)
        meter = CostMeter()
        training = self.config.training
        return UnlearnContext(
            history=MeteredHistory(self.store, meter),
            clients=RemainingClients(self.setup.federation, request.forget, meter),
            aggregator=self.setup.aggregator,
            num_rounds=training.rounds,
            initial_params=self.initial_params,
            final_params=self.final_params,
            meter=meter,
            evaluate=self._evaluator(progress),
            training=TrainingInfo(training.participation, training.aggregator.name),
            recording=self.config.history,
            privacy=self.config.privacy,
            fingerprint=self.fingerprint,
            reference_provider=self.reference_set,
        )

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
        self.setup.close()
        self.store.close()

    def __enter__(self) -> UnlearnSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
