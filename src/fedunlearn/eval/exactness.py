"""Statistical tests that deletion-ready unlearning is exact in law, with stated power.

Design note: docs/deletion_ready.md, "Exactness tests" (the FATS paper's Definitions 1-2: the
unlearned state must have the law of training on the reduced data). Three tests, each on the
library's own samplers (their fast path ``fedunlearn.eval.draws``, checked draw for draw):

1. Sampler goodness of fit: b-subsets of a client's samples, and the K slots of a round, against
   their laws (uniform b-subsets; i.i.d. uniform slots, so a K-multiset has the multinomial
   probability K!/(prod m_i!) / M^K, not 1/#multisets), Pearson chi-square.
2. History-level two-sample test on a toy (M=3, K=2, R=3, E=2, N=3, b=1; delete sample 0 of
   client 0 after training). Group A: n histories on D with fresh seeds, then unlearned by a
   rule; group B: n histories on D' with fresh seeds. Statistics: Z, the rounds that draw client
   0, and U, client 0's local steps on sample 1 (a rule that keeps a used sample's batches
   shows in U, never in Z, since client draws never look at data). Chi-square homogeneity on
   each, Bonferroni alpha/2. Rules: ``replay`` (fedunlearn's: keep the rounds before the first
   use, regenerate the rest with the same seed on D', as ``tv_exact`` does; it equals a
   from-scratch history on D' draw for draw), ``alg2`` (the paper's Alg. 2 as printed: restart
   at the first bad local step, re-drawing the round's client multiset when that step is the
   round's first, with fresh randomness), ``redraw_round`` (re-draw the first bad round's
   multiset and everything after), ``proof_b2`` (App. B.2: re-draw every round that used the
   sample), ``never`` (recompute nothing). ``toy_laws`` gives each rule's exact law by
   enumeration, so the power of the test against each wrong rule is computed, not guessed.
3. Cost calibration: histories without training in a planner setting; the empirical recompute
   rate against the planner's P(recompute) (exact binomial test) and the mean recomputed rounds
   against its expectation (z score).

scipy is imported lazily (``scipy.special`` for chi-square tails, ``scipy.stats.binomtest``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedunlearn.eval.draws import batch_members, client_seeds, client_slots, derive_seeds

__all__ = [
    "RULES",
    "Calibration",
    "ChiSquareResult",
    "Toy",
    "ToyHistories",
    "calibrate_costs",
    "detectable_effect",
    "first_use",
    "homogeneity_test",
    "pearson_test",
    "power",
    "simulate",
    "slot_test",
    "statistics",
    "subset_test",
    "toy_laws",
    "unlearn",
]

RULES = ("replay", "alg2", "redraw_round", "proof_b2", "never")


# ----- chi-square tests --------------------------------------------------------------------------


@dataclass(frozen=True)
class ChiSquareResult:
    """A chi-square test: its statistic, degrees of freedom and p-value."""

    statistic: float
    df: int
    p_value: float


def _chi2_sf(statistic: float, df: int) -> float:
    from scipy.special import chdtrc

    return float(chdtrc(df, statistic))


def pearson_test(
    counts: Sequence[float] | np.ndarray, probabilities: Sequence[float]
) -> ChiSquareResult:
    """Pearson's goodness-of-fit test of ``counts`` against cell ``probabilities``."""
    observed = np.asarray(counts, dtype=float)
    expected = observed.sum() * np.asarray(probabilities, dtype=float)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return ChiSquareResult(statistic, len(observed) - 1, _chi2_sf(statistic, len(observed) - 1))


def _pool(table: np.ndarray, minimum: float) -> np.ndarray:
    """Merge adjacent columns (ordered categories) until every column totals ``minimum``."""
    columns, current = [], np.zeros(table.shape[0])
    for column in table.T:
        current = current + column
        if current.sum() >= minimum:
            columns.append(current)
            current = np.zeros(table.shape[0])
    if current.sum() > 0:
        if columns:
            columns[-1] = columns[-1] + current
        else:
            columns.append(current)
    return np.stack(columns, axis=1)


def homogeneity_test(a: np.ndarray, b: np.ndarray) -> ChiSquareResult:
    """Chi-square homogeneity test of two samples of an integer statistic.

    Categories are the values seen; adjacent ones are pooled until each category totals 10
    (an expected count >= 5 per group with equal group sizes).
    """
    top = int(max(a.max(initial=0), b.max(initial=0)))
    table = np.stack([np.bincount(a, minlength=top + 1), np.bincount(b, minlength=top + 1)])
    table = _pool(table.astype(float), 10.0)
    if table.shape[1] < 2:
        return ChiSquareResult(0.0, 0, 1.0)
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    df = table.shape[1] - 1
    return ChiSquareResult(statistic, df, _chi2_sf(statistic, df))


def power(reference: Sequence[float], alternative: Sequence[float], n: int, alpha: float) -> float:
    """Power of the two-sample chi-square test (n per group) to tell two laws apart.

    Noncentral chi-square with noncentrality n w^2, w^2 = sum (p1 - p2)^2 / (p1 + p2), over the
    cells where either law has mass; df = cells - 1.
    """
    from scipy.special import chdtri, chndtr

    p1, p2 = np.asarray(reference, dtype=float), np.asarray(alternative, dtype=float)
    cells = (p1 + p2) > 0
    w2 = float(((p1 - p2)[cells] ** 2 / (p1 + p2)[cells]).sum())
    df = int(cells.sum()) - 1
    critical = float(chdtri(df, alpha))
    return 1.0 - float(chndtr(critical, df, n * w2)) if w2 > 0 else alpha


def detectable_effect(n: int, df: int, alpha: float, target: float = 0.9) -> float:
    """The smallest w^2 the two-sample test (n per group) detects with power ``target``."""
    from scipy.special import chdtri, chndtr

    critical = float(chdtri(df, alpha))

    def reaches(w2: float) -> bool:
        return 1.0 - float(chndtr(critical, df, n * w2)) >= target

    low, high = 0.0, 1.0
    while not reaches(high):
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return high


# ----- sampler goodness of fit -------------------------------------------------------------------


def subset_test(seeds: np.ndarray, num_samples: int, batch_size: int) -> ChiSquareResult:
    """Chi-square of one step's b-subsets (``step_batches``) against the uniform law."""
    members = batch_members(seeds, range(num_samples), batch_size, 1)[:, 0, :]
    subsets = list(itertools.combinations(range(num_samples), batch_size))
    bits = 1 << np.arange(num_samples, dtype=np.int64)
    index = np.zeros(1 << num_samples, dtype=np.int64)
    index[[int(bits[list(s)].sum()) for s in subsets]] = np.arange(len(subsets))
    counts = np.bincount(index[members.astype(np.int64) @ bits], minlength=len(subsets))
    return pearson_test(counts, [1 / len(subsets)] * len(subsets))


def slot_test(
    seeds: np.ndarray, num_clients: int, draws: int
) -> tuple[ChiSquareResult, ChiSquareResult]:
    """Chi-square of a round's K slots: ordered tuples (uniform) and multisets (multinomial)."""
    slots = client_slots(seeds, 1, draws, range(num_clients))[:, 0, :]
    codes = (slots * num_clients ** np.arange(draws)).sum(axis=1)
    ordered = pearson_test(
        np.bincount(codes, minlength=num_clients**draws), [num_clients**-draws] * num_clients**draws
    )
    multisets = list(itertools.combinations_with_replacement(range(num_clients), draws))
    index = {m: i for i, m in enumerate(multisets)}
    counts = np.bincount(
        [index[tuple(sorted(row))] for row in slots.tolist()], minlength=len(multisets)
    )
    law = [
        math.factorial(draws)
        / math.prod(math.factorial(m.count(c)) for c in set(m))
        / num_clients**draws
        for m in multisets
    ]
    return ordered, pearson_test(counts, law)


# ----- the toy history ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Toy:
    """A federation without a model: sizes, draws and the deleted sample (client 0, sample 0)."""

    num_clients: int = 3
    draws: int = 2
    rounds: int = 3
    local_steps: int = 2
    num_samples: int = 3
    batch_size: int = 1


@dataclass(frozen=True)
class ToyHistories:
    """n sampling histories: each round's slots and client 0's mini-batches.

    Attributes:
        slots: Client ids of each round's K slots, shape (n, R, K).
        batches: Client 0's mini-batch membership per round and step, (n, R, E, N) (computed
            for every round; used only where client 0 was drawn).
    """

    slots: np.ndarray
    batches: np.ndarray

    @property
    def drawn(self) -> np.ndarray:
        """Whether each round drew client 0, (n, R)."""
        return (self.slots == 0).any(axis=-1)

    @property
    def used(self) -> np.ndarray:
        """Client 0's mini-batches in the rounds that drew it (all False elsewhere)."""
        return self.batches & self.drawn[..., None, None]

    def same(self, other: ToyHistories) -> np.ndarray:
        """Whether each history equals ``other``'s draw for draw (slots and used batches)."""
        slots = (self.slots == other.slots).all(axis=(1, 2))
        return slots & (self.used == other.used).all(axis=(1, 2, 3))


def simulate(seeds: np.ndarray, toy: Toy, reduced: bool) -> ToyHistories:
    """Return the histories of runs with ``seeds`` on D, or on D' (sample 0 of client 0 gone)."""
    slots = client_slots(seeds, toy.rounds, toy.draws, range(toy.num_clients))
    local = client_seeds(seeds, toy.rounds, [0])[..., 0]
    deleted = [0] if reduced else []
    batches = batch_members(local, range(toy.num_samples), toy.batch_size, toy.local_steps, deleted)
    return ToyHistories(slots, batches)


def first_use(history: ToyHistories) -> tuple[np.ndarray, np.ndarray]:
    """Return each history's first round (0-based; R if none) and step that used sample 0."""
    used = history.used[..., 0]  # (n, R, E)
    any_round = used.any(axis=-1)
    # numpy stubs type ndarray.any(axis=...) as "numpy.bool | ndarray" (it is an array here)
    rounds = np.where(any_round.any(axis=1), any_round.argmax(axis=1), used.shape[1])  # type: ignore[call-overload]
    steps = used[np.arange(len(rounds)), np.minimum(rounds, used.shape[1] - 1)].argmax(axis=-1)
    return rounds, steps


def _take(keep: np.ndarray, old: ToyHistories, new: ToyHistories) -> ToyHistories:
    """Rounds where ``keep`` (n, R) from ``old``, the others from ``new``."""
    return ToyHistories(
        np.where(keep[..., None], old.slots, new.slots),
        np.where(keep[..., None, None], old.batches, new.batches),
    )


def unlearn(
    rule: str, trained: ToyHistories, same_seed: ToyHistories, fresh: ToyHistories
) -> ToyHistories:
    """Return the histories after deleting sample 0 of client 0 by ``rule`` (``RULES``).

    Args:
        rule: Which coupling.
        trained: The histories on D.
        same_seed: Histories on D' with the same seeds (what a seeded replay regenerates).
        fresh: Histories on D' with independent seeds (fresh randomness).
    """
    r_first, step_first = first_use(trained)
    rounds = np.arange(trained.slots.shape[1])[None, :]
    before = rounds < r_first[:, None]
    if rule == "replay":
        return _take(before, trained, same_seed)
    if rule == "redraw_round":
        return _take(before, trained, fresh)
    if rule == "proof_b2":
        bad = trained.used[..., 0].any(axis=-1)
        return _take(~bad, trained, fresh)  # type: ignore[arg-type]  # as above: an array
    if rule == "never":
        return trained
    if rule == "alg2":
        out = _take(before, trained, fresh)
        # a first bad step after the round's first: the round's multiset and its earlier
        # steps are kept, the later steps re-drawn on D' (Alg. 1 restarted mid-round)
        mid = (step_first > 0) & (r_first < trained.slots.shape[1])
        at = rounds == r_first[:, None]
        keep_slots = at & mid[:, None]
        steps = np.arange(trained.batches.shape[2])[None, None, :]
        keep_steps = keep_slots[..., None] & (steps < step_first[:, None, None])
        return ToyHistories(
            np.where(keep_slots[..., None], trained.slots, out.slots),
            np.where(keep_steps[..., None], trained.batches, out.batches),
        )
    raise ValueError(f"unknown rule {rule!r}; known: {', '.join(RULES)}")


def statistics(history: ToyHistories) -> tuple[np.ndarray, np.ndarray]:
    """Return Z (rounds that drew client 0) and U (its local steps on sample 1) per history."""
    return history.drawn.sum(axis=1), history.used[..., 1].sum(axis=(1, 2))


# ----- exact laws of the toy ---------------------------------------------------------------------


def toy_laws(toy: Toy = Toy()) -> dict[str, tuple[list[float], list[float]]]:
    """Return each rule's exact law of (Z, U), and the retrain law under ``retrain``.

    Enumerates the toy's per-round outcomes (b = 1 only): client 0 drawn with probability
    q = 1 - (1 - 1/M)^K; each local step takes one of its N samples (N - 1 on D'), uniformly.
    """
    if toy.batch_size != 1:
        raise ValueError("toy_laws enumerates b = 1 only")
    q = 1 - (1 - 1 / toy.num_clients) ** toy.draws
    full = range(toy.num_samples)
    reduced = range(1, toy.num_samples)
    fresh_round = _round_law(q, reduced, toy.local_steps)
    outcomes: list[tuple[tuple[int, ...] | None, float]] = [(None, 1 - q)]
    outcomes += [
        (steps, q / toy.num_samples**toy.local_steps)
        for steps in itertools.product(full, repeat=toy.local_steps)
    ]
    laws: dict[str, Law] = {"retrain": _power_law(fresh_round, toy.rounds)}
    for rule in RULES:
        law: Law = {}
        for history in itertools.product(outcomes, repeat=toy.rounds):
            weight = math.prod(p for _, p in history)
            for key, p in _rule_law(rule, [s for s, _ in history], fresh_round, reduced).items():
                law[key] = law.get(key, 0.0) + weight * p
        laws[rule] = law
    size_u = toy.rounds * toy.local_steps + 1
    return {
        name: (
            [sum(p for (z, _), p in law.items() if z == v) for v in range(toy.rounds + 1)],
            [sum(p for (_, u), p in law.items() if u == v) for v in range(size_u)],
        )
        for name, law in laws.items()
    }


Law = dict[tuple[int, int], float]


def _round_law(q: float, samples: range, steps: int) -> Law:
    law: Law = {(0, 0): 1 - q}
    for chosen in itertools.product(samples, repeat=steps):
        key = (1, chosen.count(1))
        law[key] = law.get(key, 0.0) + q / len(samples) ** steps
    return law


def _add(a: Law, b: Law) -> Law:
    out: Law = {}
    for (z1, u1), p1 in a.items():
        for (z2, u2), p2 in b.items():
            key = (z1 + z2, u1 + u2)
            out[key] = out.get(key, 0.0) + p1 * p2
    return out


def _power_law(law: Law, times: int) -> Law:
    out: Law = {(0, 0): 1.0}
    for _ in range(times):
        out = _add(out, law)
    return out


def _kept(steps: tuple[int, ...] | None) -> Law:
    return {(0, 0) if steps is None else (1, steps.count(1)): 1.0}


def _rule_law(rule: str, rounds: list[tuple[int, ...] | None], fresh: Law, reduced: range) -> Law:
    """The law of (Z, U) after ``rule`` given the trained history's rounds."""
    bad = [i for i, s in enumerate(rounds) if s is not None and 0 in s]
    if rule == "never" or not bad:
        law: Law = {(0, 0): 1.0}
        for steps in rounds:
            law = _add(law, _kept(steps))
        return law
    if rule == "proof_b2":
        law = {(0, 0): 1.0}
        for i, steps in enumerate(rounds):
            law = _add(law, fresh if i in bad else _kept(steps))
        return law
    first = bad[0]
    law = {(0, 0): 1.0}
    for steps in rounds[:first]:
        law = _add(law, _kept(steps))
    steps = rounds[first]
    assert steps is not None
    if rule == "replay":  # multiset kept, the round's steps on D' (the seeded replay's law)
        kept_round = {k: p / (1 - fresh[(0, 0)]) for k, p in fresh.items() if k[0] == 1}
        middle = kept_round
    elif rule == "alg2" and steps.index(0) > 0:  # mid-round restart: earlier steps kept
        i = steps.index(0)
        middle = {}
        for rest in itertools.product(reduced, repeat=len(steps) - i):
            key = (1, steps[:i].count(1) + rest.count(1))
            middle[key] = middle.get(key, 0.0) + 1 / len(reduced) ** len(rest)
    else:  # redraw_round, or alg2 with the round's first step bad: a fresh round
        middle = fresh
    return _add(_add(law, middle), _power_law(fresh, len(rounds) - first - 1))


# ----- cost calibration --------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Simulated first uses against the planner's prediction.

    Attributes:
        kind: ``client`` or ``sample``.
        histories: n.
        recomputed: Histories whose request recomputes something.
        predicted_probability: The planner's P(recompute).
        binomial_p_value: Exact two-sided binomial test of ``recomputed`` against it.
        mean_rounds: Mean recomputed rounds.
        predicted_rounds: The planner's E[recomputed rounds].
        z: (mean - predicted) / (sample sd / sqrt(n)).
    """

    kind: str
    histories: int
    recomputed: int
    predicted_probability: float
    binomial_p_value: float
    mean_rounds: float
    predicted_rounds: float
    z: float


def _first_rounds(seeds: np.ndarray, toy: Toy, kind: str, chunk: int = 200) -> np.ndarray:
    """First round (1-based; 0 if none) that drew client 0, or used its sample 0."""
    out = []
    for start in range(0, len(seeds), chunk):
        part = seeds[start : start + chunk]
        drawn = (client_slots(part, toy.rounds, toy.draws, range(toy.num_clients)) == 0).any(-1)
        if kind == "sample":  # the batches of the rounds that drew client 0 only
            which, round_ = np.nonzero(drawn)
            local = derive_seeds(part[which], "client", round_ + 1, 0, 0)
            members = batch_members(local, range(toy.num_samples), toy.batch_size, toy.local_steps)
            drawn[which, round_] = members[..., 0].any(axis=-1)
        out.append(np.where(drawn.any(axis=1), drawn.argmax(axis=1) + 1, 0))
    return np.concatenate(out)


def calibrate_costs(seeds: np.ndarray, toy: Toy, kind: str) -> Calibration:
    """Compare simulated requests (client 0, or its sample 0, after ``toy.rounds``) with the plan.

    The planner (``fedunlearn.runs.plan``) predicts from M, K, E, b, N and r_u alone; the
    simulation runs the library's samplers for ``len(seeds)`` histories without training.
    """
    from scipy.stats import binomtest

    from fedunlearn.runs.plan import PlanInputs, client_request, sample_request

    inputs = PlanInputs(
        client_sizes=(toy.num_samples,) * toy.num_clients,
        rounds=toy.rounds,
        sampling="tv_stable",
        participation=toy.draws / toy.num_clients,
        batch_size=toy.batch_size,
        local_steps=toy.local_steps,
    )
    if inputs.draws_per_round() != toy.draws:
        raise ValueError(f"K = {toy.draws} is not round(p M) for any p the config can hold")
    predicted = client_request(inputs) if kind == "client" else sample_request(inputs, 0)
    first = _first_rounds(np.asarray(seeds, dtype=np.uint64), toy, kind)
    rounds = np.where(first > 0, toy.rounds - first + 1, 0).astype(float)
    n, hits = len(rounds), int((first > 0).sum())
    p = predicted.recompute_probability or 0.0
    sd = float(rounds.std(ddof=1)) if n > 1 else 0.0
    mean = float(rounds.mean())
    return Calibration(
        kind=kind,
        histories=n,
        recomputed=hits,
        predicted_probability=p,
        binomial_p_value=float(binomtest(hits, n, p).pvalue),
        mean_rounds=mean,
        predicted_rounds=predicted.expected_rounds,
        z=(mean - predicted.expected_rounds) / (sd / math.sqrt(n)) if sd else 0.0,
    )
