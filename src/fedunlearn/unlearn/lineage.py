"""What an unlearned model was computed from: the evidence "by construction" of a receipt.

A method's ``UnlearnContext`` logs every stored payload and model the method read and the model it
started from; ``Lineage`` is the summary the result carries (``UnlearnResult.lineage``) and the
receipt states. ``exact`` means the result cannot depend on the forgotten clients: no update of
theirs, and no aggregate or global model from their first aggregated round on, was read, and the
start model precedes that round (Retrain; Crab's participation rollback followed only by the
remaining clients' fresh training). ``approximate`` means it read something that carries their
influence (``reads`` says what), so removal must be shown by a check with power. A model audited
without a result (``fedunlearn audit --model`` of a foreign file) has no lineage (``None``).

How a lineage is traced (``ReadLog`` records, ``trace_lineage`` classifies):

- ``first_tainted_round`` f is the first round whose client records show a forgotten client's
  update *accepted* (aggregated); a rejected or missing upload does not taint the round.
- A read carries the forgotten clients' influence ("tainted") if it is: any stored update of a
  forgotten client (accepted or rejected: it is a function of their data); the aggregate or the
  global model of a round t >= f; or the stored update of a *remaining* client from a round
  t >= f. The last rule is conservative on purpose: an update of round t > f was trained from
  M_{t-1}, which holds the forgotten clients' updates; an update of round f itself was trained
  from the clean M_{f-1}, but an update can be computed with knowledge of the round's other
  uploads (the trim and Fang attacks craft theirs from the round's benign updates), and nothing
  here assumes otherwise.
- The start model is the stored global model the method declares with
  ``UnlearnContext.start_from(round)``, which reads it through the metered history (so the
  declaration is also a read, checked like any other). A method that declares none gets
  ``approximate``: its lineage cannot be shown.
- ``exact`` iff nothing tainted was read and the start model's round is below f (or the
  forgotten clients were never aggregated). Fresh local training by remaining clients reads
  nothing stored and does not taint; it starts from whatever the method built, whose lineage
  is the point of the log.
- Per-client records (who was sampled, statuses, sizes, norms, losses) and round scalars are
  run metadata, not payloads: they are not logged. Every built-in method that uses a
  forgotten client's recorded norm also reads stored payloads that classify it
  ``approximate`` (Crab's ``bounded`` rollback).

Deviations:
    [REC] ``tainted_reads`` lists at most ``MAX_LISTED`` entries per kind (the forgotten
    clients' own updates first); ``reason`` gives the totals, so a result's JSON stays small.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

__all__ = [
    "MAX_LISTED",
    "Lineage",
    "LineageKind",
    "Read",
    "ReadLog",
    "first_tainted_round",
    "nothing_to_forget",
    "trace_lineage",
]

LineageKind = Literal["exact", "approximate"]
PayloadKind = Literal["global", "aggregate", "update", "shard"]
MAX_LISTED = 20  # entries per kind in ``tainted_reads``


@dataclass(frozen=True)
class Lineage:
    """What a result depended on.

    Args:
        kind: ``exact`` (no read carries the forgotten clients' influence) or ``approximate``.
        start: The model the method started from, in words ("global model of round 7",
            "initial model M_0", "final model M_T").
        start_round: Its round (0 = M_0; None when it was not a stored global model).
        first_tainted_round: The first round in which any forgotten client was aggregated
            (None when none ever was): stored aggregates and global models from this round on
            carry their influence.
        tainted_reads: The reads that carry the forgotten clients' influence, as
            ``{"updates": [[round, client], ...], "aggregates": [round, ...],
            "models": [round, ...]}`` (empty lists when exact).
        reason: One sentence a user can read.
    """

    kind: LineageKind
    start: str
    start_round: int | None
    first_tainted_round: int | None
    tainted_reads: dict[str, list[Any]] = field(default_factory=dict)
    reason: str = ""

    @property
    def exact(self) -> bool:
        """Whether the result provably does not depend on the forgotten clients."""
        return self.kind == "exact"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "kind": self.kind,
            "start": self.start,
            "start_round": self.start_round,
            "first_tainted_round": self.first_tainted_round,
            "tainted_reads": {k: list(v) for k, v in self.tainted_reads.items()},
            "reason": self.reason,
        }


@dataclass(frozen=True, order=True)
class Read:
    """One stored payload a method read.

    Attributes:
        round: Its round (0 = M_0).
        kind: The store's payload kind: ``global`` (M_round), ``aggregate`` or ``update``.
        client_id: The client of an ``update``; None for models.
    """

    round: int
    kind: PayloadKind
    client_id: int | None = None


class ReadLog:
    """Every distinct stored payload a method read, in first-read order, and its start model.

    ``MeteredHistory`` records each read; ``UnlearnContext.start_from`` declares the start.
    """

    def __init__(self) -> None:
        self._reads: dict[Read, None] = {}  # ordered set
        self.start_round: int | None = None

    def record(self, kind: PayloadKind, round_: int, client_id: int | None = None) -> None:
        """Log that the payload ``(kind, round_, client_id)`` was read."""
        self._reads.setdefault(Read(int(round_), kind, client_id), None)

    def declare_start(self, round_: int) -> None:
        """Record the global model the method starts from (the first declaration counts)."""
        if self.start_round is None:
            self.start_round = int(round_)

    @property
    def reads(self) -> tuple[Read, ...]:
        """The distinct reads, in the order first made."""
        return tuple(self._reads)


def first_tainted_round(
    accepted: Iterable[tuple[int, Iterable[int]]], forget: Iterable[int]
) -> int | None:
    """Return the first round in which a client of ``forget`` was aggregated, or None.

    Args:
        accepted: ``(round, ids of the clients whose update was accepted)`` per round, in any
            order (the store's client records with status ``accepted``).
        forget: The clients being forgotten.
    """
    gone = set(forget)
    rounds = [t for t, ids in accepted if gone & set(ids)]
    return min(rounds) if rounds else None


def _ids(clients: Iterable[int], samples: Mapping[int, Collection[int]] | None = None) -> str:
    ids = sorted(clients)
    parts = [f"client{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"] if ids else []
    for client, sample_ids in sorted((samples or {}).items()):
        n = len(sample_ids)
        parts.append(f"{n} sample{'s' if n > 1 else ''} of client {client}")
    return " and ".join(parts) or "nothing"


def _model_name(round_: int, num_rounds: int) -> str:
    if round_ == 0:
        return "initial model M_0"
    if round_ == num_rounds:
        return f"final model M_{num_rounds}"
    return f"global model M_{round_} (after round {round_})"


def nothing_to_forget(num_rounds: int) -> Lineage:
    """Return the lineage of a request that forgets nobody (the final model, unchanged)."""
    return Lineage(
        kind="exact",
        start=_model_name(num_rounds, num_rounds),
        start_round=num_rounds,
        first_tainted_round=None,
        tainted_reads={"updates": [], "aggregates": [], "models": []},
        reason="no client is forgotten: the final model is returned unchanged",
    )


def _tainted(
    read: Read,
    forget: frozenset[int],
    first: int | None,
    shard_first: Mapping[int, int | None] | None = None,
    shard_of: Mapping[int, int] | None = None,
) -> bool:
    if read.kind == "update" and read.client_id in forget:
        return True
    if shard_first is not None and read.kind in ("update", "shard"):
        # a sharded run: a shard's models and its clients' updates carry only its own clients
        # an update's read names its client (client_id is None for models only)
        client = cast(int, read.client_id)
        shard = client if read.kind == "shard" else (shard_of or {}).get(client)
        since = shard_first.get(shard) if shard is not None else first
        return since is not None and read.round >= since
    return first is not None and read.round >= first


def trace_lineage(
    log: ReadLog,
    forget: Iterable[int],
    first_tainted: int | None,
    num_rounds: int,
    *,
    returned: Sequence[Read] = (),
    samples: Mapping[int, Collection[int]] | None = None,
    shard_first: Mapping[int, int | None] | None = None,
    shard_of: Mapping[int, int] | None = None,
) -> Lineage:
    """Classify what a method read (see the module docstring for the rules).

    Args:
        log: The method's reads and declared start.
        forget: The clients being forgotten (non-empty).
        first_tainted: ``first_tainted_round`` of the run for ``forget``.
        num_rounds: T, the run's rounds (names M_T "final").
        returned: Payloads the result is bitwise equal to without having read them (the
            context's final model returned as is); classified like reads.
        samples: Client -> sample ids deleted (a sample-level request): ``first_tainted`` is
            then the first round that used one of them; named in the reason.
        shard_first: A sharded run: shard -> the first round its clients' forgotten data was
            aggregated in (None: never). A shard's models and its clients' updates are tainted
            from that round on only; the run's combined models from ``first_tainted`` on.
        shard_of: A sharded run: client -> its shard.

    Returns:
        The ``Lineage``: ``exact`` or ``approximate`` with the tainted reads (at most
        ``MAX_LISTED`` per kind) and a sentence saying why.
    """
    gone = frozenset(forget)
    who = _ids(gone, samples)
    tainted = [
        r
        for r in (*log.reads, *returned)
        if _tainted(r, gone, first_tainted, shard_first, shard_of)
    ]
    own = sorted(r for r in tainted if r.kind == "update" and r.client_id in gone)
    others = sorted(r for r in tainted if r.kind == "update" and r.client_id not in gone)
    aggregates = sorted({r.round for r in tainted if r.kind == "aggregate"})
    models = sorted({r.round for r in tainted if r.kind in ("global", "shard")})
    updates = [*own, *others]
    listed: dict[str, list[Any]] = {
        "updates": [[r.round, r.client_id] for r in updates[:MAX_LISTED]],
        "aggregates": aggregates[:MAX_LISTED],
        "models": models[:MAX_LISTED],
    }
    truncated = max(len(updates), len(aggregates), len(models)) > MAX_LISTED
    start_round = log.start_round
    start = "not declared" if start_round is None else _model_name(start_round, num_rounds)
    since = (
        f"first aggregated in round {first_tainted}"
        if first_tainted is not None
        else "never aggregated"
    )
    plural = len(gone) > 1 or bool(samples)
    problems: list[str] = []
    if tainted:
        parts = [
            (len(own), f"update of {who}", f"updates of {who}"),
            (len(others), "update of a remaining client", "updates of remaining clients"),
            (len(aggregates), "aggregate", "aggregates"),
            (len(models), "global model", "global models"),
        ]
        said = [f"{n} {one if n == 1 else many}" for n, one, many in parts if n]
        problems.append(
            "read stored payloads that carry their influence: "
            + ", ".join(said)
            + (f" (the first {MAX_LISTED} of each kind are listed)" if truncated else "")
        )
    if start_round is None:
        problems.append(
            "did not declare the model it started from (UnlearnContext.start_from), so what it "
            "was computed from cannot be shown"
        )
    elif first_tainted is not None and start_round >= first_tainted:
        problems.append(f"started from the {start}, which holds their updates")
    if problems:
        return Lineage(
            kind="approximate",
            start=start,
            start_round=start_round,
            first_tainted_round=first_tainted,
            tainted_reads=listed,
            reason=f"{who} ({since}): the method "
            + "; it ".join(problems)
            + ". Removal must be shown by a check with power.",
        )
    if first_tainted is None:
        reason = (
            f"{who} {'were' if plural else 'was'} never aggregated and the method read "
            "no update of theirs: the result cannot depend on them"
        )
    else:
        reason = (
            f"the method started from the {start}, before round {first_tainted} (the first "
            f"round {who} {'were' if plural else 'was'} aggregated in), and read no "
            f"update of theirs and no update, aggregate or global model from round "
            f"{first_tainted} on"
        )
    return Lineage(
        kind="exact",
        start=start,
        start_round=start_round,
        first_tainted_round=first_tainted,
        tainted_reads=listed,
        reason=reason,
    )
