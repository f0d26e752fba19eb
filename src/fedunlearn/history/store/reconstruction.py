"""Which deleted updates the store still gives away, and what ``forget()`` drops so none can be.

The store keeps, per round t, the global model M_t, the aggregate A_t and the clients' updates
Δ_{c,t}, tied by ``M_t = M_{t-1} + A_t`` (``fedunlearn.fl.engine``) and, under FedAvg,
``A_t = Σ_c (n_c / Σ n) Δ_{c,t}`` over the round's accepted clients (``fl.aggregators.fedavg``).
Deleting Δ_{c,t} alone is not a deletion: if A_t is stored, or M_t and M_{t-1} are, and every
other accepted client's update of round t is stored, then

    Δ_{c,t} = (A_t · Σ n − Σ_{j≠c} n_j Δ_{j,t}) / n_c

(relative error ~1e-7 in float32). ``reconstructible_updates`` runs this attack on what the
store keeps: it closes the set of known models and aggregates under the two relations (a model
follows from a neighbour and the aggregate between them; an aggregate from its two models, or
from all its round's updates), then lists every deleted update of the forgotten clients that is
the only unknown term of a known aggregate. ``rebuild_update`` carries the attack out.

What ``forget()`` drops (``models_to_drop``): for each forgotten client with aggregated rounds
t_1 < ... < t_k, the aggregates A_{t_i} and the global models M_s for t_1 <= s <= t_k - 1
(never M_0, the start of every retraining, nor M_T, the run's model). Then no model in that span
can be derived (each path to it crosses an aggregated round whose aggregate is unknown), so no
A_{t_i} is known and no single Δ_{c,t_i} can be rebuilt. What stays known is the sum
M_{t_k} − M_{t_1 − 1} = Σ_t A_t, i.e. the client's weighted updates summed over its rounds:
that is its influence on the served model M_T, which only unlearning (and ``apply``, making an
unlearned model the run's model) removes. A client aggregated in a single round is the limit
case: with M_0 and M_T kept and the other rounds' updates stored, that sum *is* its update, so
``reconstructible_updates`` still lists it after ``forget()``; the receipt says so.

Robust aggregators: the closure is the same (the rule is deterministic), but the rebuild is not
exact. With the coordinate median, A_t and the other updates give Δ_{c,t} exactly in the
coordinates where it is the median (about 1/K of them) and bound it in the rest; trimmed mean
likewise in the coordinates where it is not trimmed. ``reconstructible_updates`` lists FedAvg
rounds only; ``forget()`` drops the same models whatever the aggregator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fedunlearn.errors import HistoryError
from fedunlearn.history.store.metadata import RunMeta, run_meta_of

__all__ = ["models_to_drop", "rebuild_update", "reconstructible_updates"]

_ACCEPTED = "accepted"


def _aggregator(meta: RunMeta) -> str:
    return str((meta.training.get("aggregator") or {}).get("name", "fedavg"))


def _updates_are_aggregated(meta: RunMeta) -> bool:
    """Whether the stored updates are the ones aggregated (not noised for storage only)."""
    privacy = meta.privacy
    return not (privacy.get("enabled") and privacy.get("dp_scope") == "store_only")


def _rounds(store: Any) -> dict[int, list[Any]]:
    """Round -> its client records (stored flags filled in), rounds 1..T."""
    return {r: store.client_records(r) for r in store.rounds() if r > 0}


def aggregated_rounds(records: dict[int, list[Any]], client_id: int) -> list[int]:
    """Return the rounds in which ``client_id``'s update was aggregated (accepted), ascending."""
    return sorted(
        r
        for r, recs in records.items()
        if any(c.client_id == client_id and c.status == _ACCEPTED for c in recs)
    )


def models_to_drop(store: Any, client_ids: Iterable[int]) -> list[tuple[int, str]]:
    """Return the stored ``(round, kind)`` models ``forget(client_ids)`` must drop (see above).

    Args:
        store: A ``HistoryStore``.
        client_ids: The clients being forgotten (with those forgotten before).
    """
    records = _rounds(store)
    last = max(records, default=0)
    stored = store.stored_models()
    drop: set[tuple[int, str]] = set()
    for cid in set(client_ids):
        rounds = aggregated_rounds(records, cid)
        if not rounds:
            continue
        drop.update((t, "aggregate") for t in rounds)
        drop.update((s, "global") for s in range(max(rounds[0], 1), min(rounds[-1], last)))
    return sorted(drop & stored)


def _known(store: Any, records: dict[int, list[Any]]) -> tuple[set[int], set[int]]:
    """Return the rounds whose global model and whose aggregate follow from the store."""
    stored = store.stored_models()
    models = {r for r, kind in stored if kind == "global"}
    aggregates = {r for r, kind in stored if kind == "aggregate"}
    if _updates_are_aggregated(run_meta_of(store)):
        for r, recs in records.items():
            accepted = [c for c in recs if c.status == _ACCEPTED]
            if all(c.stored for c in accepted):  # none accepted: the aggregate is zero
                aggregates.add(r)
    changed = True
    while changed:
        changed = False
        for t in records:
            before = (len(models), len(aggregates))
            if t - 1 in models and t in models:
                aggregates.add(t)
            if t in aggregates and (t - 1 in models) != (t in models):
                models.update((t - 1, t))
            changed = changed or before != (len(models), len(aggregates))
    return models, aggregates


def reconstructible_updates(store: Any, forget: Iterable[int]) -> list[list[int]]:
    """Return ``[round, client]`` of every deleted update of ``forget`` the store can rebuild.

    An update is rebuildable when its round's aggregate is known (stored, or derived from
    stored models and updates: see the module docstring), every other client aggregated in
    the round has its update stored, and the rule is FedAvg. Updates still stored are not
    listed (they are not deleted).

    Args:
        store: A ``HistoryStore`` (read-only is enough).
        forget: The forgotten client ids.
    """
    meta = run_meta_of(store)
    if _aggregator(meta) != "fedavg" or not _updates_are_aggregated(meta):
        return []
    records = _rounds(store)
    _, aggregates = _known(store, records)
    wanted = set(forget)
    out: list[list[int]] = []
    for r in sorted(aggregates):
        accepted = [c for c in records.get(r, ()) if c.status == _ACCEPTED]
        missing = [c.client_id for c in accepted if not c.stored]
        if len(missing) == 1 and missing[0] in wanted:
            out.append([r, missing[0]])
    return out


def _direct_aggregate(store: Any, round: int) -> torch.Tensor | None:
    """Return A_round if stored or computable from all its updates (FedAvg), else None."""
    if (round, "aggregate") in store.stored_models():
        stored: torch.Tensor = store.read_model(round, "aggregate").to(torch.float64)
        return stored
    if not _updates_are_aggregated(run_meta_of(store)):
        return None
    accepted = [c for c in store.client_records(round) if c.status == _ACCEPTED]
    if not all(c.stored for c in accepted):
        return None
    out = torch.zeros_like(store.read_model(0), dtype=torch.float64)
    total = float(sum(c.num_samples for c in accepted))
    for c in accepted:
        out += (c.num_samples / total) * store.read_update(round, c.client_id).to(torch.float64)
    return out


def _model(store: Any, round: int) -> torch.Tensor:
    """Return M_round: stored, or walked to from a stored model through direct aggregates.

    An aggregate derived from two models never helps to derive a third, so the walks that
    ``_known`` allows are exactly these.
    """
    stored = sorted(r for r, kind in store.stored_models() if kind == "global")
    if round in stored:
        model: torch.Tensor = store.read_model(round).to(torch.float64)
        return model
    below = [(s, range(s + 1, round + 1), 1.0) for s in reversed(stored) if s < round]
    above = [(s, range(round + 1, s + 1), -1.0) for s in stored if s > round]
    for start, steps, sign in below + above:
        model = store.read_model(start).to(torch.float64)
        for t in steps:  # one aggregate in memory at a time
            step = _direct_aggregate(store, t)
            if step is None:
                break
            model += sign * step
        else:
            return model
    raise HistoryError(f"the global model of round {round} cannot be derived from the store")


def rebuild_update(store: Any, round: int, client_id: int) -> torch.Tensor:
    """Rebuild a deleted FedAvg update from the round's aggregate and the other updates.

    Raises:
        HistoryError: The round's aggregate or another client's update is not available
            (``reconstructible_updates`` does not list the pair).
    """
    meta = run_meta_of(store)
    rule = _aggregator(meta)
    if rule != "fedavg" or not _updates_are_aggregated(meta):
        raise HistoryError(
            f"this run aggregated with '{rule}' (or stored DP-noised copies of the updates): "
            "the exact rebuild needs FedAvg of the stored updates; see the module docstring"
        )
    records = _rounds(store)
    _, aggregates = _known(store, records)
    if round not in aggregates:
        raise HistoryError(
            f"round {round}: neither its aggregate nor the models around it can be derived "
            f"from the store, so client {client_id}'s update cannot be rebuilt"
        )
    accepted = [c for c in records.get(round, ()) if c.status == _ACCEPTED]
    mine = [c for c in accepted if c.client_id == client_id]
    others = [c for c in accepted if c.client_id != client_id]
    if not mine or not all(c.stored for c in others):
        raise HistoryError(
            f"round {round}: client {client_id} was not aggregated there, or another client's "
            "update is not stored, so its update cannot be rebuilt"
        )
    if (round, "aggregate") in store.stored_models():
        aggregate = store.read_model(round, "aggregate").to(torch.float64)
    else:  # known from the two models around it (_known)
        aggregate = _model(store, round) - _model(store, round - 1)
    total = float(sum(c.num_samples for c in accepted))
    rest: torch.Tensor = aggregate * total
    for c in others:
        rest = rest - c.num_samples * store.read_update(round, c.client_id).to(torch.float64)
    update: torch.Tensor = (rest / mine[0].num_samples).to(torch.float32)
    return update
