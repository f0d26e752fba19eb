"""One round of a user's Flower app as ``Recording`` keeps it: its replies sorted, then written.

``AppRound`` collects what a round showed (the accepted replies, the rejected and missing
clients with their reasons, the metrics); ``sort_replies`` sorts a round's train replies into
it (``app_protocol.check_reply``: the good ones are what the strategy aggregates); and
``write_round`` commits it to the run's store and metrics file once its evaluation is known,
in the layout ``fedunlearn train`` writes (M_t, the aggregate, the updates the recording policy
keeps, every client's record with its norm, loss, dot product with the aggregate and, in a
deletion-ready round, the draws it won).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message, MetricRecord

from fedunlearn.fl.records import ClientUpdate, RoundRecord, UpdateStatus
from fedunlearn.history.policy import DOT_AGGREGATE_KEY, multiplicity_scalar
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.integrations.flower.app_protocol import ArrayLayout, Reply, check_reply
from fedunlearn.integrations.flower.messages import error_text
from fedunlearn.runs import metrics_line

log = logging.getLogger(__name__)


@dataclass
class AppRound:
    """One aggregated round, written when its evaluation is known."""

    round: int
    before: torch.Tensor
    after: torch.Tensor
    accepted: dict[int, Reply] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)
    unnamed: list[str] = field(default_factory=list)  # rejected replies with no client record
    scalars: dict[str, Any] = field(default_factory=dict)
    multiplicity: dict[int, int] = field(default_factory=dict)  # tv_stable: draws won


def numbers(record: MetricRecord | None, prefix: str = "") -> dict[str, float]:
    """Return the numeric entries of a ``MetricRecord`` (keys prefixed)."""
    out: dict[str, float] = {}
    for key, value in (record or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[prefix + key] = float(value)
    return out


def sort_replies(  # noqa: PLR0913 - the round's context, read and updated
    rnd: AppRound,
    replies: Iterable[Message],
    layout: ArrayLayout,
    *,
    asked: set[int],
    node_clients: dict[int, set[int]],
    sizes: dict[int, int],
    weight_key: str,
    max_abs: float,
) -> list[Message]:
    """Sort a round's train replies into ``rnd``; return the good ones (module docstring).

    ``node_clients`` (node -> the clients it named) and ``sizes`` (client -> n_c) are updated.
    """
    good: list[Message] = []
    replied: set[int] = set()
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        replied.add(node)
        if reply.has_error():
            reason = error_text(reply, 300)
            for hosted in sorted(node_clients.get(node, ())):
                rnd.missing[hosted] = f"client error: ...{reason}"
            if not node_clients.get(node):
                rnd.unnamed.append(f"node {node} replied with an error: ...{reason}")
            continue
        cid, out = check_reply(reply, layout, weight_key=weight_key, max_abs=max_abs)
        if isinstance(out, Reply) and out.client_id in rnd.accepted:
            first = rnd.accepted[out.client_id].node
            out = f"client {cid}: a second reply this round (node {node}; first: node {first})"
            cid = None  # keep the first reply's record
        if isinstance(out, str):
            log.warning("round %d: rejected reply: %s", rnd.round, out)
            if cid is None:
                rnd.unnamed.append(out)
            else:
                rnd.rejected[cid] = out
                node_clients.setdefault(node, set()).add(cid)
            continue
        rnd.accepted[out.client_id] = out
        node_clients.setdefault(node, set()).add(out.client_id)
        sizes[out.client_id] = out.num_samples
        good.append(reply)
    for node in sorted(asked - replied):
        for cid in sorted(node_clients.get(node, ())):
            rnd.missing.setdefault(cid, "no reply before the round's timeout")
    return good


def write_round(store: HistoryStore, policy: Any, rnd: AppRound, metrics_file: Path) -> None:
    """Commit ``rnd`` to the store (the updates ``policy`` keeps) and the metrics file."""
    aggregate = rnd.after - rnd.before
    scalars = dict(rnd.scalars)
    if rnd.round == 0:
        store.write_round(RoundEntry(round=0, global_model=rnd.after, scalars=scalars))
    else:
        updates = {c: r.params - rnd.before for c, r in rnd.accepted.items()}
        record = RoundRecord(
            round=rnd.round,
            global_before=rnd.before,
            global_after=rnd.after,
            aggregate=aggregate,
            updates=tuple(
                ClientUpdate(c, d, rnd.accepted[c].num_samples, rnd.accepted[c].loss or 0.0)
                for c, d in updates.items()
            ),
            multiplicity=rnd.multiplicity,
        )
        keep = policy.updates_to_store(record)
        agg64 = aggregate.to(torch.float64)
        clients = [
            ClientRecord(
                client_id=c,
                status=UpdateStatus.ACCEPTED.value,
                num_samples=rnd.accepted[c].num_samples,
                norm=float(d.norm()),
                loss=rnd.accepted[c].loss,
                scalars={
                    DOT_AGGREGATE_KEY: float(d.to(torch.float64) @ agg64),
                    **multiplicity_scalar(record, c),
                },
            )
            for c, d in updates.items()
        ]
        others = [(c, UpdateStatus.REJECTED, why) for c, why in sorted(rnd.rejected.items())]
        others += [
            (c, UpdateStatus.MISSING, why)
            for c, why in sorted(rnd.missing.items())
            if c not in rnd.rejected
        ]
        clients += [
            ClientRecord(
                client_id=c,
                status=status.value,
                reason=why,
                scalars=multiplicity_scalar(record, c),
            )
            for c, status, why in others
            if c not in rnd.accepted
        ]
        if rnd.unnamed:
            scalars["rejected_replies"] = len(rnd.unnamed)
            scalars["rejected_reasons"] = " | ".join(rnd.unnamed)[:2000]
        store.write_round(
            RoundEntry(
                round=rnd.round,
                global_model=rnd.after,
                aggregate=aggregate,
                updates={c: d for c, d in updates.items() if c in keep},
                clients=clients,
                scalars=scalars,
            )
        )
    row = metrics_line(rnd.round, scalars)
    row["num_accepted"] = len(rnd.accepted)
    row["num_rejected"] = len(rnd.rejected) + len(rnd.unnamed)
    with metrics_file.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
