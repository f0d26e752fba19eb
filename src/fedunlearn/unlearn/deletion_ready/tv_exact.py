"""``tv_exact``: exact unlearning of a run trained with TV-stable sampling (FATS, corrected).

Paper: Tao et al., "Communication Efficient and Provable Federated Unlearning", PVLDB 17(5)
2024, Alg. 2 (sample level) and Alg. 3 (client level), Theorem 1. The run drew each round's
clients with replacement and each local step's mini-batch without replacement, from
deletion-consistent seeded samplers (``fl.sampling``). For a request, the first round that drew a
forgotten client, or whose local training used a deleted sample (the client regenerates its own
mini-batches: ``UnlearnContext.first_use``), is where training on the reduced data can first
differ from the run. No such round: the run's model is already what training without the data
gives, and nothing is recomputed. Otherwise the rounds before it are kept and the rest is
retrained on the reduced data from the stored global model before it
(``fedunlearn.unlearn.exact.replay_from``). With the seeded samplers the result is bit for bit
the model of training from scratch on the reduced data with the same seed (tested); its law is
that of a fresh run on the reduced data.

Deviation [FIX] (docs/deletion_ready.md, "The paper's sample-level rule"): Alg. 2 restarts the
round of the first bad mini-batch by re-drawing that round's client multiset, which biases the
selection against the sample's owner (3/8 instead of 1/2 on a two-client toy). Here a sample
deletion never changes a round's draw of clients (the client sampler does not see data); only
the mini-batches that drew the sample change. The statistical test with stated power, and the
paper's rule as its negative control, are in ``fedunlearn.eval.exactness``.

Cost: the recomputed rounds' client work only; the planner (``fedunlearn.runs.plan``) predicts
it before training. On a run trained without TV-stable sampling the same replay is exact too (the
original participants minus the forgotten, as Retrain; bit for bit Retrain's model), but it saves
only the rounds before the data's first use, which with ordinary participation comes early.

What the evidence is: the lineage (``exact``: the replay started from a model before the first
round the data touched, and read nothing after it) and the first-use table in ``details``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.fl.shards import ShardPlan
from fedunlearn.history.policy import record_multiplicity
from fedunlearn.unlearn.base import Details, MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.exact import replay_from, replay_shards
from fedunlearn.unlearn.registry import register

__all__ = [
    "ExactReplayDetails",
    "ShardRetrain",
    "TvExact",
    "check_participation",
    "first_use_table",
    "shard_starts",
]


@dataclass(frozen=True)
class ExactReplayDetails(Details):
    """What an exact replay recomputed, and why no earlier round had to be.

    Attributes:
        recomputed_from_round: The first recomputed round; None when nothing was recomputed.
        recomputed_rounds: How many rounds were recomputed.
        kept_rounds: Rounds kept as the run's own (untouched by the deleted data).
        first_use: ``"client 3"`` / ``"samples of client 4"`` -> the first round that drew the
            client or used one of the samples (None: never), the evidence for the kept rounds.
        retrained_shards: A sharded run: shard -> the first round it retrained (only the shards
            that held the data).
        shard_rounds_retrained: A sharded run: the shard-rounds retrained, summed.
        evidence: One sentence saying what was recomputed and why.
    """

    recomputed_from_round: int | None = None
    recomputed_rounds: int = 0
    kept_rounds: int = 0
    first_use: dict[str, int | None] = field(default_factory=dict)
    retrained_shards: dict[str, int] = field(default_factory=dict)
    shard_rounds_retrained: int = 0
    evidence: str = ""


def first_use_table(context: UnlearnContext, request: UnlearnRequest) -> dict[str, int | None]:
    """Return the first round each forgotten client was drawn and each sample set was used."""
    table: dict[str, int | None] = {
        f"client {c}": context.first_drawn_round(frozenset({c})) for c in sorted(request.forget)
    }
    for client, ids in request.sample_map.items():
        table[f"samples of client {client}"] = context.first_use(frozenset(), {client: ids})
    return table


def exact_details(
    context: UnlearnContext,
    request: UnlearnRequest,
    table: dict[str, int | None],
    shard_starts: Mapping[int, int | None] | None = None,
) -> ExactReplayDetails:
    """Return the details of a replay that starts at the first round of ``table`` (or none)."""
    used = [r for r in table.values() if r is not None]
    total = context.num_rounds
    if shard_starts is not None:
        retrained = {s: r for s, r in shard_starts.items() if r is not None}
        shards = context.training.shards
        assert shards is not None
        work = sum(total - r + 1 for r in retrained.values())
        return ExactReplayDetails(
            recomputed_from_round=min(retrained.values(), default=None),
            recomputed_rounds=max((total - r + 1 for r in retrained.values()), default=0),
            kept_rounds=min(retrained.values(), default=total + 1) - 1,
            first_use=table,
            retrained_shards={str(s): r for s, r in sorted(retrained.items())},
            shard_rounds_retrained=work,
            evidence=(
                f"only shard(s) {', '.join(map(str, sorted(retrained)))} of {shards.count} "
                "held the deleted data; each was retrained from its first use, the others "
                "kept their models"
                if retrained
                else f"no shard of the {shards.count} used the deleted data; nothing recomputed"
            ),
        )
    if not used:
        return ExactReplayDetails(
            recomputed_from_round=None,
            recomputed_rounds=0,
            kept_rounds=total,
            first_use=table,
            evidence=f"no round of the {total} drew a forgotten client or used a deleted "
            "sample: the run's model is what training without them gives; nothing recomputed",
        )
    start = min(used)
    kept = (
        f"rounds 1..{start - 1} drew no forgotten client and used no deleted sample, so they are "
        f"kept; rounds {start}..{total} were retrained on the remaining data from the stored "
        f"model after round {start - 1}"
        if start > 1
        else f"round 1 already used the deleted data: every round (1..{total}) was retrained on "
        "the remaining data from the stored initial model"
    )
    return ExactReplayDetails(
        recomputed_from_round=start,
        recomputed_rounds=total - start + 1,
        kept_rounds=start - 1,
        first_use=table,
        evidence=kept,
    )


@register("tv_exact")
class TvExact(Unlearner[MethodParams]):
    """Recompute a TV-stable run only from the first round the deleted data touched."""

    serves_generations = True  # an applied replay leaves a history without the data
    serves_samples = True
    serves_shards = True  # each shard from its own first use
    deletion_ready = True

    def check_history(self, context: UnlearnContext) -> None:
        """Refuse a DP run (its kept rounds are noised, a replay would not be: use DP Retrain)."""
        super().check_history(context)
        if context.privacy.enabled:
            raise UnsupportedHistoryError(
                "tv_exact replays without DP; this run trained with privacy.enabled, so its kept "
                "rounds and a noise-free replay would mix two releases. Use retrain --param "
                "dp=true"
            )

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """The stored global models (a replay starts from one of them)."""
        return (context.num_rounds + 1) * context.initial_params.numel() * 4

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        check_participation(context, request)
        table = first_use_table(context, request)
        shards = context.training.shards
        if shards is not None:
            starts = shard_starts(context, request, shards)
            out = replay_shards(context, request, starts)
            details = exact_details(context, request, table, starts)
            return RunOutput(out.params, out.round_metrics, details, out.trajectory)
        details = exact_details(context, request, table)
        start = details.recomputed_from_round or context.num_rounds + 1
        out = replay_from(context, request, start)
        return RunOutput(out.params, out.round_metrics, details, out.trajectory)


def check_participation(context: UnlearnContext, request: UnlearnRequest) -> None:
    """Re-derive a TV-stable run's participation index from its seed and compare it (every round).

    The kept rounds are kept because the stored client records say no forgotten client was drawn
    there; on a TV-stable run those records are a function of the seed: round r drew
    ``sampler.draw(r, clients not forgotten)`` (deletion-consistent: clients forgotten since were
    never drawn where they would have won), so the whole index is checked against the seed
    before it is trusted. A record removed, added or edited (a client hidden from its rounds)
    makes the request refuse instead of serving a replay that would keep its influence.

    Raises:
        UnsupportedHistoryError: a round's records differ from its seeded draw.
    """
    training = context.training
    if not training.deletion_ready:
        return  # fraction sampling: continuations re-draw among the remaining clients
    rounds = {
        t: {r.client_id: record_multiplicity(r) for r in context.history.client_records(t)}
        for t in range(1, context.num_rounds + 1)
    }
    # the clients the current history drew among: the remaining ones and the forgotten ones it
    # still holds (an applied result removed the others from every round; a client never drawn
    # changes no draw, present or not)
    recorded = {c for stored in rounds.values() for c in stored}
    present = set(context.clients.client_ids) | (set(request.forget) & recorded)
    shards = training.shards
    for round_, stored in rounds.items():
        if shards is None:
            assert training.sampler is not None
            expected = dict(training.sampler.draw(round_, sorted(present)).multiplicity)
        else:
            expected = {}
            for shard in shards.shards:
                members = [c for c in shards.members(shard) if c in present]
                expected |= training.shard_samplers[shard].draw(round_, members).multiplicity
        if stored != expected:
            missing = sorted(set(expected) - set(stored))
            extra = sorted(set(stored) - set(expected))
            raise UnsupportedHistoryError(
                f"round {round_}'s participation records do not match the run's seeded draws "
                f"(missing {missing[:5]}, unexpected {extra[:5]}, multiplicities "
                f"{'differ' if not missing and not extra else 'too'}): the history was edited "
                "or is not this config's; tv_exact cannot show which rounds to keep. Verify the "
                "run ('fedunlearn verify') or use retrain"
            )


def shard_starts(
    context: UnlearnContext, request: UnlearnRequest, shards: ShardPlan
) -> dict[int, int | None]:
    """Return each shard's first round to retrain: its members' first use (None: untouched)."""
    starts: dict[int, int | None] = {}
    for shard in shards.shards:
        members = set(shards.members(shard))
        forget = frozenset(request.forget & members)
        samples = {c: ids for c, ids in request.sample_map.items() if c in members}
        starts[shard] = context.first_use(forget, samples) if forget or samples else None
    return starts


@register("shard_retrain")
class ShardRetrain(TvExact):
    """Retrain only the shards that held the deleted data, each from its first use (SISA).

    The same replay as ``tv_exact`` under the name sharded runs are documented with; a run
    without shards is one shard, where it is ``tv_exact``.
    """
