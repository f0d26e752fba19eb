"""Open a finished run once and run unlearning methods on it.

``UnlearnSession(run_dir)`` checks the run is complete, opens its history read-only, rebuilds
the federation from the run's config (same data, same poisoning, same seeds) and hands each method
a fresh metered ``UnlearnContext``, whose history logs every payload the method reads (the
result's ``lineage``, traced by ``Unlearner.unlearn``: :mod:`fedunlearn.unlearn.lineage`).
Requests are validated before any work: unknown client ids, forgetting every client, and a
method needing history the run did not record each raise one clear error, and nothing on disk
changes (the store is opened read-only).

Runs on user components (``model.factory``, ``data.source``, or a factory and data passed to
``train_run``): pass the same objects again (``UnlearnSession(run, model=make_net,
data=my_data)``; a config naming them rebuilds them by itself); a component that changed since
training is warned about in one line (``fedunlearn.runs.components``). A run whose clients keep
their data (the store's ``components.data.server_side`` is false: nothing to rebuild on the
server) opens without a federation: the model comes from ``model=`` (or the config) at the
recorded input shape and class count, evaluation from ``evaluator=``, and fresh client work from
the ``clients=`` given to ``context``/``run``.

The session is composed of two views (``fedunlearn.unlearn.views``): ``run_view`` (what the run
is: config, store, M_0 and M_T, the federation's public pieces) and ``evaluation`` (test set,
clean client data, reference sets, ``evaluate``); the judge and the verifier read those.

Fresh updates on a ``dp_sgd`` run: the session wraps the federation's local training
(``Federation.with_local_training``) with ``ClippedTraining`` at the run's clip norm; the
federation itself is not changed (docs/methods/fedadp.md, AD9 and AD22).

A living run (docs/lifecycle.md): the session opens the run as it is now: its last round is the
store's (after ``apply`` or ``train --continue`` it differs from ``config.training.rounds``),
its final model the store's last one, and every client an earlier request or ``forget`` removed
(``run_view.forgotten``) is forgotten again by every request (``cumulative``), never asked to
train and never counted as remaining.

Progress: ``run(method, request, progress=callback)`` calls ``callback(metrics)`` after each
unlearning round the method evaluates (every built-in method evaluates each round it runs).
Verification (the receipt) is one layer up: ``fedunlearn.eval.Verifier(session, request)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from fedunlearn import __version__
from fedunlearn.config import RunConfig
from fedunlearn.data import FederatedData
from fedunlearn.errors import ConfigError, FedUnlearnError, HistoryError
from fedunlearn.fl.clients import RunClients
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.sampling import batches_use
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.fl.threads import run_threads
from fedunlearn.history.store import HistoryStore
from fedunlearn.models.registry import ModelFactory
from fedunlearn.runs import HISTORY_DIR, build_setup, load_run_config, run_fingerprint
from fedunlearn.runs.components import warn_changed_components
from fedunlearn.runs.rundir import DERIVED_CACHE_DIR
from fedunlearn.runs.setup import (
    Setup,
    aggregator_of,
    sampler_of,
    shard_plan,
    shard_samplers,
    training_spec,
    with_recorded_executor,
)
from fedunlearn.runs.user import model_from_record
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
from fedunlearn.unlearn.derived_cache import DerivedCache
from fedunlearn.unlearn.views import (
    ClientSideEvaluation,
    EvaluationView,
    ModuleEvaluator,
    RunView,
)

RoundProgress = Callable[[dict[str, float]], None]


class UnlearnSession:
    """A finished run, opened for unlearning: its two views and fresh metered contexts.

    Args:
        run_dir: Directory written by ``fedunlearn train``.
        evaluate: Evaluate the model after every unlearning round (for per-round plots).
        model: The model factory the run was trained with, when it was passed to ``train_run``
            as an object (a run whose config names ``model.factory`` rebuilds it by itself).
        data: The federation's data (``fedunlearn.data.FederatedData`` or the plain mapping)
            the run was trained on, when it was passed to ``train_run`` as an object.
        evaluator: ``evaluator(module) -> {metric: value}``, called with the run's module
            holding a model to judge (eval mode). On a run whose data stays on the clients
            (recorded ``components.data.server_side: false``, e.g. a Flower app's own
            clients) it is the only evaluation; on other runs its metrics are added to the
            built-in ones.
        derived_cache: Let methods keep what they derive from the run alone in the run
            directory and read it back (``unlearn.derived_cache``; Crab's and FedADP's selection
            of an ``all`` run). False: derive everything, write nothing (an auditor's replay).

    Attributes:
        run_view: What the run is (``RunView``, read-only).
        evaluation: How its models are judged (``EvaluationView``).
        federation: The run's in-process clients as its config builds them (unchanged by the
            session; a deployment builds its own ``Clients`` from their public pieces).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        evaluate: bool = True,
        model: ModelFactory | None = None,
        data: FederatedData | Mapping[str, Any] | None = None,
        evaluator: ModuleEvaluator | None = None,
        derived_cache: bool = True,
    ) -> None:
        self._use_derived_cache = derived_cache
        # the run's own thread count for the session's life: results, figures and replays
        # are bit-identical to the run's whatever this process's default (fl/threads.py)
        self._threads = ExitStack()
        try:
            self._open(run_dir, evaluate, model, data, evaluator)
        except BaseException:
            self._threads.close()
            raise

    def _open(
        self,
        run_dir: str | Path,
        evaluate: bool,
        model: ModelFactory | None,
        data: FederatedData | Mapping[str, Any] | None,
        evaluator: ModuleEvaluator | None,
    ) -> None:
        run_dir = Path(run_dir)
        config = load_run_config(run_dir)
        store = HistoryStore.open(run_dir / HISTORY_DIR)
        meta = store.run_meta
        self._threads.enter_context(
            run_threads(meta.torch_threads, purpose="unlearning on this run")
        )
        recorded = meta.components
        if _data_on_clients(recorded) and data is None:
            try:
                self._open_without_data(run_dir, config, store, model, evaluator, evaluate)
            except BaseException:
                store.close()
                raise
            return
        try:
            last = store.last_round()
            planned = meta.planned_rounds(config.training.rounds)
            if last != planned:
                how = (
                    f"'fedunlearn train --continue {run_dir}'"
                    if meta.continuation
                    else f"'fedunlearn train {run_dir / 'config.yaml'} --out {run_dir} --resume'"
                )
                raise HistoryError(
                    f"{run_dir} finished {last or 0} of {planned} rounds; complete it with "
                    f"{how} before unlearning"
                )
            generation = store.generation()
            _check_given(recorded, config, model, data, run_dir)
            pinned = with_recorded_executor(config, meta.executor, meta.device)
            self._setup: Setup | None = build_setup(pinned, model=model, data=data)
            warn_changed_components(recorded, self._setup.components, str(run_dir))
            federation = self._setup.federation
            gone = store.forgotten_samples()
            if gone:  # the run's data now: without the samples applied results deleted
                federation = federation.without_samples(gone)
                self._setup.federation.close()
                self._setup.federation = federation
            try:
                self._fresh: Federation | None = _fresh_training(federation, config, store, run_dir)
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
            final_params=store.read_model(planned),  # the store's last round (lifecycle)
            fingerprint=run_fingerprint(config, generation, planned),
            model=federation.model,
            spec=federation.spec,
            client_sizes=MappingProxyType(
                {c: federation.num_samples(c) for c in federation.client_ids}
            ),
            malicious=federation.malicious,
            num_rounds=planned,
            generation=generation,
            forgotten=store.forgotten_clients(),
            clean_from_round=store.clean_from_round(),
            applied=store.applied_clients(),
        )
        self.evaluation = EvaluationView(self._setup, evaluator=evaluator)
        self.federation: Federation | None = federation
        self._reduced: dict[tuple[tuple[int, tuple[int, ...]], ...], Federation] = {}
        self._clip_norms: dict[Any, float] = {}
        self._data_version = store.data_version()

    def _open_without_data(
        self,
        run_dir: Path,
        config: RunConfig,
        store: HistoryStore,
        model: ModelFactory | None,
        evaluator: ModuleEvaluator | None,
        evaluate: bool,
    ) -> None:
        """Open a run whose clients keep their data: no federation, evaluation by the user."""
        meta = store.run_meta
        recorded = meta.components or {}
        net, record = model_from_record(config, recorded, model)
        warn_changed_components(
            {"model": recorded["model"]} if "model" in recorded else {},
            {"model": record},
            str(run_dir),
        )
        planned = meta.planned_rounds(config.training.rounds)
        last = store.last_round()
        if last != planned:
            raise HistoryError(f"{run_dir} finished {last or 0} of {planned} rounds")
        generation = store.generation()
        self._setup = None
        self._fresh = None
        self._evaluate_rounds = evaluate
        self._aggregator = aggregator_of(config)
        sizes = meta.sizes()
        self.run_view = RunView(
            run_dir=run_dir,
            config=config,
            store=store,
            initial_params=store.read_model(0),
            final_params=store.read_model(planned),
            fingerprint=run_fingerprint(config, generation, planned),
            model=net,
            spec=training_spec(config),
            client_sizes=MappingProxyType(sizes),
            malicious=frozenset(meta.malicious),
            num_rounds=planned,
            generation=generation,
            forgotten=store.forgotten_clients(),
            clean_from_round=store.clean_from_round(),
            applied=store.applied_clients(),
        )
        self.evaluation = ClientSideEvaluation(net, config, evaluator=evaluator)
        self.federation = None
        self._reduced = {}
        self._clip_norms = {}
        self._data_version = store.data_version()

    def _evaluator(self, progress: RoundProgress | None, meter: CostMeter) -> Evaluator | None:
        """The per-round evaluation, timed apart from the method (``evaluation_seconds``)."""
        if not self._evaluate_rounds:
            return None

        def evaluate(params: torch.Tensor) -> dict[str, float]:
            with meter.timed("evaluation_seconds"):
                metrics = self.evaluation.evaluate(params)
                if progress is not None:
                    progress(metrics)
            return metrics

        return evaluate

    def cumulative(self, request: UnlearnRequest) -> UnlearnRequest:
        """Return ``request`` forgetting also every client removed earlier in this run.

        Earlier: an applied result's clients and ``forget``-ed ones (whose influence, until a
        result is applied, is still in the model: this request removes it).

        Raises:
            ConfigError: Every client ``request`` names was removed by an applied result
                (nothing new to forget).
        """
        earlier, applied = self.run_view.forgotten, self.run_view.applied
        if not request.forget:  # no client: the current model, as on any run (or samples)
            return request
        if request.forget <= applied:
            raise ConfigError(
                f"client(s) {sorted(request.forget)} were forgotten by an applied result earlier "
                f"in this run (forgotten: {sorted(applied)}); nothing new to forget"
            )
        if earlier <= request.forget:
            return request
        return request.with_forget(request.forget | earlier)

    def request_summary(self, request: UnlearnRequest) -> dict[str, object]:
        """Return ``{forget, new, earlier, kind}`` of a (cumulative) request, JSON-ready.

        ``earlier``: removed by an applied result before; ``new``: the rest of ``forget``.
        """
        earlier = self.run_view.applied & request.forget
        summary: dict[str, object] = {
            "forget": sorted(request.forget),
            "new": sorted(request.forget - earlier),
            "earlier": sorted(earlier),
            "kind": request.kind,
        }
        if request.samples:
            summary["samples"] = {str(c): list(ids) for c, ids in request.samples}
        return summary

    @property
    def components(self) -> dict[str, dict[str, Any]]:
        """The user components (model, data) this session was built with, as ``Setup`` records.

        Empty for built-in ones and for a session opened without the data (its clients hold
        it). What the run recorded when it trained is ``run_view.store.run_meta.components``.
        """
        return {} if self._setup is None else dict(self._setup.components)

    def identity(self) -> dict[str, object]:
        """Return what names the run as it is now (``fedunlearn apply`` checks it).

        ``{"fingerprint", "generation", "last_round", "model_sha256", "chain"}``: the last
        model's SHA-256 and the head of the committed history (``{"seq", "head"}``; None for a
        run written before it: ``history.store.chain``), which ``fedunlearn check-receipt``
        finds in the run's chain.
        """
        from fedunlearn.history.result_file import tensor_sha256

        run = self.run_view
        head = run.store.chain_head()
        return {
            "fingerprint": run.fingerprint,
            "generation": run.generation,
            "last_round": run.num_rounds,
            "model_sha256": tensor_sha256(run.final_params),
            "chain": None if head is None else head.to_dict(),
        }

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
        request = self.cumulative(request)
        run.check_request(request)
        if clients is None and self._fresh is None:
            raise ConfigError(
                f"{run.run_dir}: the clients keep this run's data, so fresh client work needs "
                "them: pass clients= (e.g. the Flower app's clients) to context() or run()"
            )
        meter = CostMeter()
        fresh: RunClients | None = clients or self._fresh
        if request.samples:
            fresh = self._without_samples(request, clients)
        assert fresh is not None
        if isinstance(fresh, Federation):
            fresh.start()  # setup, not the method's work: before the method's clock starts
        return UnlearnContext(
            history=MeteredHistory(run.store, meter),
            # never a client forgotten earlier, even for a request that forgets nobody
            clients=RemainingClients(fresh, request.forget | run.forgotten, meter),
            aggregator=self._aggregator,
            num_rounds=run.num_rounds,
            initial_params=run.initial_params,
            final_model=run.final_params,
            meter=meter,
            evaluate=self._evaluator(progress, meter),
            training=_training_info(run.config),
            recording=run.config.history,
            privacy=run.config.privacy,
            fingerprint=run.fingerprint,
            reference_provider=self.evaluation.reference_set,
            private_clients=self._private_clients(request, meter)
            if self.federation is not None
            else None,
            release_clip_norm=(lambda: self.release_clip_norm(request))
            if self.federation is not None
            else None,
            first_sample_use=self._first_sample_use if self.federation is not None else None,
            derived_cache=self._derived_cache(),
        )

    def _derived_cache(self) -> DerivedCache | None:
        """The run directory's cache of derived results, scoped to this history (None: no chain).

        Scoped by the run's fingerprint, its committed chain's head and this package's version,
        so any commit (apply, forget, continuation) or upgrade leaves earlier files stale
        (``unlearn.derived_cache``). None with ``derived_cache=False``: an auditor's replay
        derives everything from the committed history and writes nothing.
        """
        run = self.run_view
        head = run.store.chain_head()
        if head is None or not self._use_derived_cache:
            return None
        scope = f"{__version__}:{run.fingerprint}:{head.seq}:{head.link}"
        return DerivedCache(run.run_dir / DERIVED_CACHE_DIR, scope)

    def _without_samples(self, request: UnlearnRequest, clients: RunClients | None) -> Federation:
        """Return the run's fresh-training clients with the request's samples deleted.

        Raises:
            ConfigError: the clients keep their data (Flower), or a listed client or sample is
                not in the run, is forgotten by the request, or would be left with no sample
                (or, under TV-stable sampling, fewer than one mini-batch).
        """
        if clients is not None or self._fresh is None or self.federation is None:
            raise ConfigError(
                "sample-level deletion needs the clients' data in this process; a run whose "
                "clients keep their data cannot serve it yet"
            )
        fed = self.federation
        steps = self.run_view.spec.steps
        for client, ids in request.samples:
            fed.check_clients([client])
            if client in request.forget:
                raise ConfigError(
                    f"client {client} is forgotten entirely by this request; drop its samples "
                    "from --forget-samples"
                )
            present = set(fed.client_data[client].sample_ids().tolist())
            unknown = sorted(set(ids) - present)
            if unknown:
                shown = ", ".join(map(str, unknown[:10]))
                gone = sorted(self.run_view.store.forgotten_samples().get(client, ()))
                earlier = f"; {len(gone)} deleted earlier" if gone else ""
                raise ConfigError(
                    f"client {client} holds no sample with id(s) {shown} (it holds "
                    f"{len(present)} samples, ids {min(present)}..{max(present)} as the run "
                    f"built its data{earlier}); nothing was changed"
                )
            left = len(present) - len(ids)
            if left < 1 or (steps is not None and left < self.run_view.spec.batch_size):
                raise ConfigError(
                    f"deleting {len(ids)} samples of client {client} leaves {left}, fewer than "
                    "its local training needs (one mini-batch); forget the client instead "
                    f"(--forget {client})"
                )
        key = request.samples
        if key not in self._reduced:
            source = self._fresh
            self._reduced[key] = source.without_samples(request.sample_map)
        return self._reduced[key]

    def _first_sample_use(self, client: int, sample_ids: frozenset[int]) -> int | None:
        """Return the first round whose local training of ``client`` drew one of ``sample_ids``.

        The client's own computation (it alone knows its batches, docs/deletion_ready.md): for
        each round whose records hold the client, it regenerates that round's mini-batches from
        the run's seeds (``fl.sampling.batches_use``); in epoch mode every participation uses
        every sample.
        """
        assert self.federation is not None
        fed, store, spec = self.federation, self.run_view.store, self.run_view.spec
        ids = fed.client_data[client].sample_ids().numpy()
        for t in range(1, self.run_view.num_rounds + 1):
            if any(r.client_id == client for r in store.client_records(t)) and batches_use(
                derive_seed(fed.seed, "client", t, client, 0),
                ids,
                sample_ids,
                spec.batch_size,
                spec.steps,
            ):
                return t
        return None

    def release_clip_norm(self, request: UnlearnRequest) -> float | None:
        """The clip norm of a DP release for ``request`` (None on a run without DP).

        The configured number; for ``clip_norm: auto`` the rule recomputed at M_0 over the
        clients and data the request leaves (``fedunlearn.runs.train.resolve_clip_norm``): the
        run's own read the forgotten clients' data (issue 40). Cached per request.
        """
        cfg = self.run_view.config.privacy
        if not cfg.enabled:
            return None
        if cfg.clip_norm != "auto":
            return float(cfg.clip_norm)
        from fedunlearn.runs.train import resolve_clip_norm

        request = self.cumulative(request)
        key = (request.forget, request.samples)
        if key not in self._clip_norms:
            source = self._release_federation(request)
            try:
                self._clip_norms[key] = resolve_clip_norm(
                    cfg,
                    source,
                    self._aggregator,
                    self.run_view.initial_params,
                    [c for c in source.client_ids if c not in request.forget],
                )
            finally:
                if source is not self.federation:
                    source.close()
        return self._clip_norms[key]

    def _release_federation(self, request: UnlearnRequest) -> Federation:
        """The run's clients with the request's samples deleted (the caller closes a new one)."""
        assert self.federation is not None
        if not request.samples:
            return self.federation
        return self.federation.without_samples(request.sample_map)

    def _private_clients(
        self, request: UnlearnRequest, meter: CostMeter
    ) -> Callable[..., PrivateClients] | None:
        """Return the builder of the remaining clients under the run's DP mechanism, or None.

        For a method that releases a DP model (DP Retrain, FedADP's ``unlearn_dp``): the run's
        mechanism (``fedunlearn.privacy.reference``) at the budget ``epsilon_of`` (default
        ε_max every round), at ``release_clip_norm`` and with the caller's ``noise_salt``,
        on the data the request leaves, metered; None when training used no mechanism (no DP,
        or ``dp_scope: store_only``).
        """
        config = self.run_view.config
        if not (config.privacy.enabled and config.privacy.dp_scope == "train_and_store"):
            return None
        from fedunlearn.privacy.reference import mechanism_stats, with_run_mechanism

        store = self.run_view.store

        def build(epsilon_of: Callable[[int], float] | None, noise_salt: int = 0) -> PrivateClients:
            source = self._release_federation(request)
            fed = with_run_mechanism(
                source,
                config.privacy,
                store.round_scalars,
                seed=config.seed,
                epsilon_of=epsilon_of,
                clip_norm=self.release_clip_norm(request),
                noise_salt=noise_salt,
            )
            if fed is None:  # unreachable: the mechanism ran in training (checked above)
                raise HistoryError("this run trained without a DP mechanism to re-run")

            def close() -> None:
                fed.close()
                if source is not self.federation:
                    source.close()

            return PrivateClients(
                RemainingClients(fed, request.forget, meter), lambda: mechanism_stats(fed), close
            )

        return build

    def run(
        self,
        method: Unlearner,
        request: UnlearnRequest,
        *,
        progress: RoundProgress | None = None,
        clients: RunClients | None = None,
    ) -> UnlearnResult:
        """Validate the request, check the history, run ``method`` and return its result.

        Args:
            method: The unlearning method.
            request: The clients to remove.
            progress: Called with the metrics of each unlearning round (see ``context``).
            clients: Where fresh client work goes (see ``context``).
        """
        request = self.cumulative(request)
        context = self.context(request, progress=progress, clients=clients)
        try:
            result = method.unlearn(request, context)
        except FedUnlearnError:
            self.check_unchanged()  # a concurrent writer explains a failed read better
            raise
        self.check_unchanged()
        return result

    def check_unchanged(self) -> None:
        """Refuse to go on if another process committed to the run since the session opened.

        The session reads the store statement by statement; an ``apply`` (which replaces the
        rounds), a ``forget`` or a continuation committed meanwhile makes what it read mix two
        states of the run.

        Raises:
            HistoryError: The run changed; nothing was written.
        """
        if self.run_view.store.data_version() != self._data_version:
            raise HistoryError(
                f"{self.run_view.run_dir}: another process wrote the run while it was read "
                "(an apply, forget or train --continue committed); what was read may mix two "
                "states of the run, so nothing was written. Run the command again"
            )

    def close(self) -> None:
        """Close the store and stop worker processes."""
        for reduced in self._reduced.values():
            reduced.close()
        if self._setup is not None:
            if self._fresh is not self._setup.federation and self._fresh is not None:
                self._fresh.close()
            self._setup.close()
        self.run_view.store.close()
        self._threads.close()

    def __enter__(self) -> UnlearnSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _data_on_clients(recorded: Mapping[str, Any] | None) -> bool:
    """Whether the run recorded that its clients keep their data (no server-side data)."""
    data = (recorded or {}).get("data") or {}
    return data.get("server_side") is False


def _check_given(
    recorded: Mapping[str, Any] | None,
    config: RunConfig,
    model: ModelFactory | None,
    data: FederatedData | Mapping[str, Any] | None,
    run_dir: Path,
) -> None:
    """Refuse to rebuild a run whose model or data was passed to ``train_run`` as an object."""
    recorded = recorded or {}
    for key, given, named, kwarg in (
        ("model", model, config.model.factory, "model"),
        ("data", data, config.data.source, "data"),
    ):
        entry = recorded.get(key)
        if entry is not None and given is None and named is None:
            raise ConfigError(
                f"{run_dir} was trained with {key} {entry.get('path') or 'passed as an object'}"
                f" given to train_run; pass it again: UnlearnSession({str(run_dir)!r}, "
                f"{kwarg}=...)"
            )


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
    from fedunlearn.privacy.local_training import ClippedTraining
    from fedunlearn.runs.rundir import stored_clip_norm

    clip = stored_clip_norm(store)  # round 1's, or the ledger's once a trajectory replaced it
    if clip is None:
        raise HistoryError(
            f"{run_dir} was trained with privacy.mechanism 'dp_sgd' but no round of its ledger "
            "has a 'dp_clip_norm' scalar; its ledger is incomplete"
        )
    clipped = ClippedTraining(
        federation.model, federation.training_data, clip_norm=float(clip), device=federation.device
    )
    return federation.with_local_training(clipped)


def _training_info(config: RunConfig) -> TrainingInfo:
    """Return what a method may know of how the run trained (sampling, shards, rule)."""
    training = config.training
    tv = training.sampling == "tv_stable"
    plan = shard_plan(config)
    return TrainingInfo(
        training.participation,
        training.aggregator.name,
        sampler_of(config) if tv and plan is None else None,
        plan,
        shard_samplers(config, plan) if tv and plan is not None else {},
    )
