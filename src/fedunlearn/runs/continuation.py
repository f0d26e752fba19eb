"""Train a living run further (``fedunlearn train --continue``).

``continue_run(run_dir, to_round=T)`` trains the run to round T (``continue_run(run_dir,
rounds)``: ``rounds`` more) from the run's current model (after an apply: the applied one), with
the run's recording policy, never asking a forgotten client
(``HistoryStore.forgotten_clients``). The target round is committed before the first new round,
so re-running after a kill -9 resumes to that target and gives the uninterrupted run's models
bit for bit (every random choice derives from (seed, round, client): ``fedunlearn.runs.train``);
``--to-round T`` re-run once the run is at T does nothing (but rewrite the files derived from
the store), so it is the form to re-run blindly; ``--rounds N`` re-run after it finished adds N
more. Like ``apply``, a full disk after the store committed leaves the earlier derived files
whole and says how to finish (``rebuild_run_files``). The rounds are trained by the assembly
training uses (``fedunlearn.runs.rounds.train_recorded``). The run's recording policy goes on: a
deferred one (Crab's windows, FedADP's stages) opens its first window at the continuation's
start round. A DP run goes on under its mechanism at its stored clip norm and the ledger
(``privacy.json``) gains the new rounds. Once a client is forgotten, nothing a continuation
decides reads its data: the server loss (``clients_loss``), Crab's reference set and FedADP's
stage start are measured over the clients never forgotten, the DP budget schedule restarts at
ε_0 at the first continuation after the forgetting (``_budget_restart``) and a ``clip_norm:
auto`` is recomputed over the remaining clients (``_continued_clip_norm``); with nobody
forgotten a continuation equals the same run trained longer, bit for bit.

The clients that train a continuation are the run's in-process federation, or any
``RunClients`` the caller builds from it (``clients=``: the Flower ServerApp's clients over its
Grid, ``integrations/flower/server_app.py``), with the recorder it pairs with (``recorder=``);
the checks, the committed target and the sampling are the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedunlearn.config import RunConfig
from fedunlearn.config.training import MAX_ROUNDS
from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.fl.clients import RunClients
from fedunlearn.fl.engine import RoundObserver
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.fl.threads import run_threads
from fedunlearn.history.policy import DeferredPolicy, HistoryRecorder, RecordingPolicy, build_policy
from fedunlearn.history.store import HistoryStore
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.runs.rounds import (
    RecorderFactory,
    clients_loss_samples,
    policy_env,
    recorded_setup,
    train_recorded,
)
from fedunlearn.runs.run_files import rewrite_files, store_dir
from fedunlearn.runs.rundir import load_run_config, stored_clip_norm
from fedunlearn.runs.setup import Setup, clients_loss
from fedunlearn.runs.train import resolve_clip_norm, wrap_privacy

__all__ = ["BUDGET_RESTART_KEY", "ClientsFactory", "continue_run", "continue_target"]

#: Builds the clients that train a continuation from the run's federation.
ClientsFactory = Callable[[Federation], RunClients]


def _pending(store: HistoryStore) -> dict[str, int] | None:
    """The recorded continuation that has not reached its target, or None."""
    cont = store.run_meta.continuation
    if cont and cont.target > (store.last_round() or 0):
        return cont.to_dict()
    return None


#: Store meta key of the budget schedule's restart point (see ``_budget_restart``).
BUDGET_RESTART_KEY = "budget_restart"


def _budget_restart(
    store: HistoryStore,
    forgotten: frozenset[int],
    start: int,
    first: Mapping[str, float],
) -> dict[str, Any] | None:
    """Where the DP budget schedule restarts, so no forgotten client's data chooses ε_t.

    The schedule (Eq. 4) chains the server loss of every round; rounds trained before a client
    was forgotten measured it on that client's data too, and a round an apply put in has none.
    So once a client is forgotten, a continuation restarts the schedule at its start round s:
    round s + 1 runs at ε_0 and Eq. 4 follows the losses measured since, over the clients never
    forgotten. Recorded in the store with the forgotten set; a later continuation with the same
    set reads the same chain (a run continued twice equals one continued once, and a re-run
    after a kill resumes it). None when nobody was forgotten: the chain goes on from round 0.
    """
    if not forgotten or CLIENTS_LOSS_KEY not in first:
        return None
    recorded = store.run_meta.budget_restart
    if recorded and recorded.get("forgotten") == sorted(forgotten):
        return dict(recorded)
    return {"round": start, "forgotten": sorted(forgotten), "loss": first[CLIENTS_LOSS_KEY]}


def _continued_clip_norm(
    config: RunConfig, setup: Setup, store: HistoryStore, remaining: Sequence[int]
) -> float | None:
    """The clip norm of continued DP rounds (None without DP: ``wrap_privacy`` ignores it).

    The stored one while nobody was forgotten (a continuation equals the run trained longer);
    an ``auto`` one recomputed at M_0 over the remaining clients and data once a client or a
    sample was forgotten, so no forgotten data chooses it (``resolve_clip_norm``).
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None
    forgotten = store.forgotten_clients() or store.forgotten_samples()
    if cfg.clip_norm != "auto" or not forgotten:
        return stored_clip_norm(store)
    return resolve_clip_norm(
        cfg, setup.federation, setup.aggregator, store.read_model(0), remaining
    )


def _without_forgotten_samples(setup: Setup, store: HistoryStore) -> Setup:
    """Return ``setup`` training on the data without the samples applied results deleted."""
    gone = store.forgotten_samples()
    if not gone:
        return setup
    reduced = setup.federation.without_samples(gone)
    setup.federation.close()
    return replace(setup, federation=reduced)


def continue_target(run_dir: str | Path, rounds: int | None, *, to_round: int | None = None) -> int:
    """Return the round ``continue_run(run_dir, rounds, to_round=...)`` trains to (0 if unknown)."""
    try:
        with HistoryStore.open(store_dir(Path(run_dir))) as store:
            pending = _pending(store)
            if pending:
                return pending["target"]
            return to_round if to_round is not None else (store.last_round() or 0) + (rounds or 0)
    except HistoryError:
        return 0


def _continuation(
    run_dir: Path,
    store: HistoryStore,
    config: RunConfig,
    rounds: int | None,
    to_round: int | None,
) -> tuple[int, int, int | None]:
    """Resolve a continuation request: ``(target, start, resumed_from_round)``.

    A recorded (committed) continuation that has not reached its target is resumed; otherwise
    ``to_round`` or ``last + rounds`` is the target. ``target == start`` (the run is at
    ``to_round`` already) means nothing to train.
    """
    last = store.last_round() or 0
    pending = _pending(store)
    if pending is not None:
        if (rounds is not None and rounds != pending["rounds"]) or (
            to_round is not None and to_round != pending["target"]
        ):
            raise ConfigError(
                f"{run_dir}: an interrupted --continue of {pending['rounds']} rounds (to "
                f"round {pending['target']}) is recorded; re-run it with --to-round "
                f"{pending['target']} (or --rounds {pending['rounds']}, or neither) to finish it "
                "first; nothing was changed"
            )
        return pending["target"], pending["from"], last
    wanted = store.run_meta.planned_rounds(config.training.rounds)
    if last != wanted:
        raise ConfigError(
            f"{run_dir} finished {last} of {wanted} rounds; complete it with "
            f"'fedunlearn train {run_dir / 'config.yaml'} --out {run_dir} --resume' "
            "before continuing"
        )
    if to_round is not None:
        if to_round < last:
            raise ConfigError(
                f"{run_dir} is at round {last}, past --to-round {to_round}; nothing was changed"
            )
        return _bounded(to_round, "--to-round", run_dir), last, None
    if rounds is None:
        raise ConfigError(
            f"{run_dir}: nothing to finish; give --to-round T (or --rounds N) to continue"
        )
    return _bounded(last + rounds, f"--rounds {rounds}: round", run_dir), last, None


def _bounded(target: int, what: str, run_dir: Path) -> int:
    """Refuse a target past ``training.rounds``' bound, which a config cannot name either."""
    if target > MAX_ROUNDS:
        raise ConfigError(
            f"{what} {target:,} is past {MAX_ROUNDS:,}, the most rounds a run may have "
            f"(training.rounds' bound); nothing was changed in {run_dir}"
        )
    return target


def continue_run(
    run_dir: str | Path,
    rounds: int | None = None,
    *,
    to_round: int | None = None,
    observers: Sequence[RoundObserver] = (),
    clients: ClientsFactory | None = None,
    recorder: RecorderFactory = HistoryRecorder,
) -> dict[str, Any]:
    """Train the run further from its current model, with history recording.

    ``to_round`` is safe to re-run: it trains to that round, resumes an interrupted
    continuation to it, and once the run is there does nothing but rewrite the files derived
    from the store (``already_done``). ``rounds`` adds rounds to the run as it is now: re-run
    after it finished, it adds them again (while unfinished, it resumes).

    Args:
        run_dir: A finished (or applied) run directory.
        rounds: How many rounds to add (>= 1); None with ``to_round`` None finishes an
            interrupted continuation.
        to_round: The round to train to (>= the run's last round).
        observers: Extra round observers (e.g. a progress bar).
        clients: Builds the clients that train from the run's federation (default: the
            federation itself, in-process); a forgotten client is never sampled either way.
        recorder: Builds the observer that records each round into the store from the store
            and the run's recording policy (default ``HistoryRecorder``).

    Returns:
        ``{"from_round", "target", "resumed_from_round", "forgotten_clients",
        "final_metrics", "wall_seconds", "already_done"}``.

    Raises:
        ConfigError: ``rounds`` < 1, both ``rounds`` and ``to_round``, ``to_round`` behind the
            run, an interrupted continuation to another target is recorded, or the run is
            unfinished.
        HistoryError: Not a run directory, or another process writes it.
    """
    started = time.perf_counter()
    run_dir = Path(run_dir)
    _check_request(rounds, to_round)
    config = load_run_config(run_dir)
    with HistoryStore.open(store_dir(run_dir), writable=True) as store:
        target, start, resumed = _continuation(run_dir, store, config, rounds, to_round)
        last = store.last_round() or 0
        if target == last:  # at the target already: a re-run after it finished
            rewrite_files(run_dir, config, store, f"{run_dir} is at round {target}")
            return _outcome(store, last, target, None, started, already_done=True)
        forgotten = store.forgotten_clients()
        with run_threads(store.run_meta.torch_threads, purpose="the continuation"):
            setup = _without_forgotten_samples(recorded_setup(config, store, run_dir), store)
            remaining = [c for c in setup.federation.client_ids if c not in forgotten]
            private = setup
            try:
                # DP: the run's mechanism at its clip norm; an 'auto' one is recomputed over
                # the remaining clients once one was forgotten (the stored one read its data).
                # After an applied trajectory round numbers repeat (L < T): the generation's
                # own noise and batches, never the draws an earlier upload of that round used
                privacy, private = wrap_privacy(
                    config,
                    setup,
                    _continued_clip_norm(config, setup, store, remaining),
                    noise_salt=store.generation(),
                )
                policy, restart = _continued_policy(
                    config, store, private, privacy, remaining, start, target
                )
                # a deferred policy re-runs the rounds after the last window it closed since
                # the continuation's start (bit-identical)
                train_recorded(
                    run_dir,
                    config,
                    private,
                    store,
                    privacy,
                    policy,
                    target=target,
                    started=started,
                    observers=observers,
                    clients=remaining,
                    trainers=None if clients is None else clients(private.federation),
                    recorder=recorder,
                    restart=None if restart is None else (restart["round"], restart["loss"]),
                )
                rewrite_files(run_dir, config, store, f"rounds {start + 1}..{target} were trained")
            finally:
                if private is not setup:
                    private.close()
                setup.close()
        return _outcome(store, start, target, resumed, started, already_done=False)


def _check_request(rounds: int | None, to_round: int | None) -> None:
    """Refuse ``rounds`` and ``to_round`` together, or either below 1."""
    if rounds is not None and to_round is not None:
        raise ConfigError("give --rounds N (rounds to add) or --to-round T, not both")
    if rounds is not None and rounds < 1:
        raise ConfigError(f"--rounds must be >= 1; got {rounds}")
    if to_round is not None and to_round < 1:
        raise ConfigError(f"--to-round must be >= 1; got {to_round}")


def _continued_policy(
    config: RunConfig,
    store: HistoryStore,
    setup: Setup,
    privacy: PrivateTraining | None,
    remaining: Sequence[int],
    start: int,
    target: int,
) -> tuple[RecordingPolicy | DeferredPolicy, dict[str, Any] | None]:
    """The continuation's recording policy and budget restart; the target committed first.

    The policy sees the clients never forgotten only (reference set, server loss at the start
    round). Before the first new round the target (and the restart point) is committed to the
    store, so a re-run after a kill finds it and resumes to it.
    """
    samples = clients_loss_samples(config, privacy)
    first = (
        {}
        if samples is None
        else {CLIENTS_LOSS_KEY: clients_loss(setup, store.read_model(start), samples, remaining)}
    )
    restart = _budget_restart(store, store.forgotten_clients(), start, first)
    env = replace(
        policy_env(setup, privacy, remaining),
        final_round=target,
        first_round=start,
        first_scalars=first,
    )
    policy = build_policy(config.history, env)
    if _pending(store) is None:  # the target first: a re-run after a kill finds it
        store.update_meta(
            {
                "continuation": {"from": start, "rounds": target - start, "target": target},
                "rounds_target": target,
                **({BUDGET_RESTART_KEY: restart} if restart else {}),
            }
        )
    return policy, restart


def _outcome(
    store: HistoryStore,
    start: int,
    target: int,
    resumed: int | None,
    started: float,
    *,
    already_done: bool,
) -> dict[str, Any]:
    """What ``continue_run`` returns."""
    return {
        "from_round": start,
        "target": target,
        "resumed_from_round": resumed,
        "forgotten_clients": sorted(store.forgotten_clients()),
        "final_metrics": store.round_scalars(target),
        "wall_seconds": time.perf_counter() - started,
        "already_done": already_done,
    }
