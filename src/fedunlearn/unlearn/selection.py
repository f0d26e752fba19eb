"""Selective storage shared by Crab and FedADP: which stored rounds and clients a method replays.

Both papers keep a share of each round's clients ranked by the cosine of their update with the
round's aggregate (Crab Eq. 2, FedADP Eq. 9) and a share of each window's (stage's) rounds. What
the two methods then do with a run is the same: on a run recorded live with their own policy the
selection is what the store holds (``stored_selection``); on a run recorded with ``all`` they
derive it with the live policy's own selector; the selection options a method may override are
resolved against the run's recorded ones (``selection_options``), and overriding a live
selection is refused (``refuse_overrides_of_live_selection``); the history kept is
``selection_bytes``. ``SelectiveReplay`` is the base class of both methods that does all of this
once; a subclass names its policy and the options it may override, and derives a selection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, get_args

import torch
from pydantic import BaseModel

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.history.policy import POLICIES
from fedunlearn.history.store import HistoryReader
from fedunlearn.unlearn.base import ParamsT, Unlearner
from fedunlearn.unlearn.context import MeteredHistory, UnlearnContext
from fedunlearn.unlearn.lineage import PayloadKind, Read, ReadLog

__all__ = [
    "Selection",
    "SelectiveReplay",
    "StoredRound",
    "cosine_scores",
    "count_floor",
    "count_half_up",
    "refuse_overrides_of_live_selection",
    "selection_bytes",
    "selection_options",
    "stored_selection",
    "top_clients",
]

_GUARD = 1e-9  # so that 0.7 * 20 counts 14, not 13


def count_half_up(n: int, ratio: float) -> int:
    """Return max(1, floor(ratio n + 0.5)), at most n."""
    return max(1, min(n, math.floor(ratio * n + 0.5 + _GUARD)))


def count_floor(n: int, ratio: float) -> int:
    """Return max(1, floor(ratio n)), at most n."""
    return max(1, min(n, math.floor(ratio * n + _GUARD)))


def cosine_scores(updates: Mapping[int, torch.Tensor], aggregate: torch.Tensor) -> dict[int, float]:
    """Return each client's cosine of its delta with the round's aggregate (float64; 0 if zero).

    Crab's contribution score (Eq. 2) and FedADP's layer-2 score (Eq. 9).
    """
    agg = aggregate.to(torch.float64)
    agg_norm = float(agg.norm())
    out = {}
    for cid, delta in updates.items():
        d = delta.to(torch.float64)
        denom = float(d.norm()) * agg_norm
        out[cid] = float(d @ agg) / denom if denom > 0 else 0.0
    return out


def top_clients(
    updates: Mapping[int, torch.Tensor], aggregate: torch.Tensor, count: int
) -> list[int]:
    """Return the ``count`` clients most aligned with the aggregate, ascending (ties: lower id)."""
    if not updates:
        return []
    scores = cosine_scores(updates, aggregate)
    ranked = sorted(scores, key=lambda c: (-scores[c], c))
    return sorted(ranked[:count])


@dataclass(frozen=True)
class StoredRound:
    """One stored round (FL round ``round``) and the clients whose updates were kept of it."""

    round: int
    clients: tuple[int, ...]


@dataclass(frozen=True)
class Selection:
    """A method's selection for one request: the stored rounds and how they were had.

    ``cached`` is True where the derived selection was read back from the run directory
    (``unlearn.derived_cache``) rather than derived again; a stored (live) selection is never
    cached. The selection travels with the request, so a method object holds no per-request state.
    """

    stored: list[StoredRound]
    cached: bool = False


def selection_options(
    params: BaseModel, run_selection: BaseModel, names: Sequence[str]
) -> dict[str, Any]:
    """Return the selection options: each method override, else the run's recorded value."""
    out = {}
    for name in names:
        override = getattr(params, name)
        out[name] = override if override is not None else getattr(run_selection, name)
    return out


def refuse_overrides_of_live_selection(
    method: str, section: str, wanted: Mapping[str, Any], run_selection: BaseModel
) -> None:
    """Refuse selection options that differ from what a live-selection run stored.

    A run recorded with a selective policy (Crab's, FedADP's) stored only its own selection; a
    different one can be derived only from a run recorded with ``history.policy: all``.

    Raises:
        UnsupportedHistoryError: naming the differing options and the way out.
    """
    differ = {k: v for k, v in wanted.items() if v != getattr(run_selection, k)}
    if differ:
        raise UnsupportedHistoryError(
            f"{method} with {differ} needs a different selection than this run stored "
            f"(history.{section} {run_selection.model_dump()}); drop the overrides, or use a "
            "run recorded with history.policy=all to derive any selection."
        )


def stored_selection(history: HistoryReader, num_rounds: int) -> list[StoredRound]:
    """Return the rounds of a live-selection run that store updates, with the stored clients."""
    out = []
    for t in range(1, num_rounds + 1):
        kept = tuple(
            r.client_id for r in history.client_records(t) if r.status == "accepted" and r.stored
        )
        if kept:
            out.append(StoredRound(t, kept))
    return out


def selection_bytes(stored: Sequence[StoredRound], num_params: int) -> int:
    """Bytes a selection keeps: M_0, the global model of each stored round and its updates."""
    return (1 + len(stored) + sum(len(s.clients) for s in stored)) * num_params * 4


class SelectiveReplay(Unlearner[ParamsT]):
    """Base of the methods that replay a selective storage (Crab, FedADP).

    A subclass sets ``policy`` (the name of its recording policy, whose options are the run's
    ``history.<policy>`` section), ``overrides`` (the selection options its params may override on
    an ``all`` run) and implements ``derive_selection`` (the live policy's selector run over the
    stored rounds of an ``all`` run). ``selection`` returns the stored selection of a live run or
    the derived one; ``check_history`` refuses overrides of a live selection; the selection is
    cached per run for ``history_bytes_needed``.
    """

    policy: ClassVar[str]
    overrides: ClassVar[tuple[str, ...]]
    #: the selector's log entries (a dataclass with ``rounds``, ``scores``, ``closed``, ``kept``)
    log_type: ClassVar[type]

    def __init__(self, params: ParamsT | dict[str, Any] | None = None) -> None:
        super().__init__(params)
        self._cache: dict[str, list[StoredRound]] = {}

    def selection_options(self, context: UnlearnContext) -> dict[str, Any]:
        """The effective selection options: each override, else the run's recorded value."""
        return selection_options(self.params, self.recorded_options(context), self.overrides)

    def recorded_options(self, context: UnlearnContext) -> BaseModel:
        """The run's ``history.<policy>`` options (the policy's defaults when not recorded)."""
        return context.recording.options(self.policy, POLICIES.get(self.policy).options_type)

    def check_history(self, context: UnlearnContext) -> None:
        """Also refuse selection overrides on a run whose selection was made live."""
        super().check_history(context)
        if context.history.policy == self.policy:
            refuse_overrides_of_live_selection(
                self.name,
                self.policy,
                self.selection_options(context),
                self.recorded_options(context),
            )
        else:
            self.check_derivable(context)

    def check_derivable(self, context: UnlearnContext) -> None:  # noqa: B027 - optional hook
        """Raise ``UnsupportedHistoryError`` if the selection cannot be derived from this run."""

    def derive_selection(self, context: UnlearnContext, log: list[Any]) -> list[StoredRound]:
        """Return the selection of an ``all`` run; append the selector's windows/stages to log."""
        raise NotImplementedError

    def selection(self, context: UnlearnContext, log: list[Any] | None = None) -> Selection:
        """Return the stored rounds with their kept clients (stored live, or derived)."""
        if context.history.policy == self.policy:
            selected = Selection(stored_selection(context.history, context.num_rounds))
        else:
            selected = self._derived(context, log if log is not None else [])
        if context.fingerprint:
            self._cache[context.fingerprint + context.history.policy] = selected.stored
        return selected

    def _derived(self, context: UnlearnContext, log: list[Any]) -> Selection:
        """``derive_selection``, or what an earlier request derived on this history.

        ``context.derived_cache`` (``unlearn.derived_cache``) keeps the selection, the
        selector's log and the payloads the derivation read; read back, those reads are logged
        again (the lineage is the same), their bytes are not counted (nothing was read).
        ``Selection.cached`` says which happened.
        """
        cache = context.derived_cache
        options = {k: _jsonable(v) for k, v in self.selection_options(context).items()}
        body = cache.get(self.policy, options) if cache is not None else None
        kept = _from_cache(body, self.log_type) if body is not None else None
        if kept is not None:
            stored, entries, cached_reads = kept
            reads = context.read_log
            if reads is not None:
                for read in cached_reads:
                    reads.record(read.kind, read.round, read.client_id)
                # whatever the file lists, every derivation reads each global model and
                # aggregate (a forgotten client's round taints them), so an edited list that
                # drops reads can never turn the lineage exact
                for t in range(context.num_rounds + 1):
                    reads.record("global", t)
                    if t:
                        reads.record("aggregate", t)
            log.extend(entries)
            return Selection(stored, cached=True)
        start = len(log)
        history = context.history
        if cache is None or not isinstance(history, MeteredHistory):
            return Selection(self.derive_selection(context, log))
        outer, history.log = history.log, ReadLog()  # what the derivation alone reads
        try:
            stored = self.derive_selection(context, log)
        finally:
            payloads, history.log = history.log.reads, outer
            for read in payloads:
                outer.record(read.kind, read.round, read.client_id)
        cache.put(self.policy, options, _to_cache(stored, log[start:], payloads))
        return Selection(stored)

    def replay_selection(self, context: UnlearnContext, log: list[Any]) -> Selection:
        """``selection``, refusing a run where it holds no stored round with client updates."""
        selected = self.selection(context, log)
        if not selected.stored:
            raise UnsupportedHistoryError(
                f"{self.name} found no stored round with client updates in this run; record it "
                f"with history.policy={self.policy} or all."
            )
        return selected

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """M_0, the global model of each stored round and the stored updates."""
        stored = self._cache.get(context.fingerprint + context.history.policy)
        if stored is None or not context.fingerprint:
            stored = self.selection(context).stored
        return selection_bytes(stored, context.clients.num_params)


# ----- the derived selection, kept for the next request (unlearn.derived_cache) -------------


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, bool | int | float | str | type(None)) else str(value)


def _to_cache(
    stored: Sequence[StoredRound], entries: Sequence[Any], reads: Sequence[Read]
) -> dict[str, Any]:
    def entry(e: Any) -> dict[str, Any]:
        out = {f.name: getattr(e, f.name) for f in fields(e)}
        out["kept"] = [[int(t), [int(c) for c in ids]] for t, ids in sorted(e.kept.items())]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    return {
        "stored": [[s.round, list(s.clients)] for s in stored],
        "log": [entry(e) for e in entries],
        "reads": [[r.kind, r.round, r.client_id] for r in reads],
    }


def _from_cache(
    body: Mapping[str, Any], log_type: type
) -> tuple[list[StoredRound], list[Any], list[Read]] | None:
    """The cached selection, log entries and reads; None when the body does not read back."""
    try:
        stored = [StoredRound(int(t), tuple(int(c) for c in ids)) for t, ids in body["stored"]]
        entries = []
        for raw in body["log"]:
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
            values["kept"] = {int(t): tuple(int(c) for c in ids) for t, ids in raw["kept"]}
            entries.append(log_type(**values))
        reads = [Read(int(r), kind, None if c is None else int(c)) for kind, r, c in body["reads"]]
    except (KeyError, TypeError, ValueError):
        return None
    if any(r.kind not in get_args(PayloadKind) for r in reads):
        return None
    return stored, entries, reads
