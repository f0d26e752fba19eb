"""Client-level membership test: did the forgotten clients' data shape this model?

``measure_client_membership(session, forget, models)`` trains a few reference models of the run
*with* the forgotten clients ("in") and *without* them ("out"), fits per-example Gaussians to
their logit-scaled confidence on the forgotten clients' training examples, and scores each given
model by its mean per-example log-likelihood ratio "in" against "out". The threshold comes from
the "out" references' scores at ``target_fpr``; the power is measured on the "in" references.
The result is a ``ClientMembershipEvidence`` (``fedunlearn.eval.mia.client``), which the receipt
reads. ``fit_client_membership`` does the training and calibration once and returns a
``ClientMembershipTest`` whose ``evidence(models)`` scores any models of the run later (a forward
pass each): a receipt fits once per request and scores every candidate.

Steps, in the order ``measure_client_membership`` runs them:

1. Reference models: FedAvg runs of the session's federation from the run's M_0 with the run's
   rounds, participants (read from the history's client records), local training and
   aggregation rule; "out" runs leave the forgotten clients out of every round (a Retrain with
   other batch orders), "in" runs keep them (the original run with other batch orders). Each
   reference has its own seed salt, so its clients draw other batch orders than the run's.
   "Out" and "in" are trained alternately until ``num_reference`` or ``max_seconds`` is
   reached.
2. Per-example statistic: phi = log(p_y / (1 - p_y)) for the true label y of every training
   example of the forgotten clients (Carlini et al., Sec. IV-B: the logit scaling makes the
   confidence approximately Gaussian across models).
3. Gaussians: per example, the mean of phi over the "in" references and over the "out"
   references, with one variance shared by every example and by both sides (see Deviations).
4. Score of a model: the mean over the examples of log N(phi; mu_in, s) - log N(phi; mu_out, s).
   Per forgotten client too (``notes["client_scores"]``).
5. Leave-one-out: each reference is scored with Gaussians fitted on the *other* references
   only, so its score is that of a model the calibration never saw (as the candidate is).
6. Threshold: a Gaussian fitted to the "out" references' leave-one-out scores; the threshold is
   the one-sided Student-t prediction bound at ``1 - target_fpr`` for one more draw (mean +
   t_{1-fpr, k-1} * sd * sqrt(1 + 1/k) with k "out" scores): a model trained without the
   clients exceeds it with probability about ``target_fpr``, even with few references.
7. Power: the share of "in" references whose leave-one-out score exceeds the threshold.

Papers: Carlini, Chien, Nasr, Song, Terzis, Tramer, "Membership Inference Attacks From First
Principles", IEEE S&P 2022 (LiRA: Sec. IV, Alg. 1; logit scaling Sec. IV-B; a global variance
with few shadow models, Sec. IV-C / VI-A; reporting the TPR at a fixed low FPR, Sec. III); and
client-level (user-level) inference, which aggregates the per-example evidence of all of one
participant's records: Melis, Song, De Cristofaro, Shmatikov, "Exploiting Unintended Feature
Leakage in Collaborative Learning", IEEE S&P 2019 (membership of a participant in FL);
Kandpal, Jagielski, Tramer, Carlini, "User Inference Attacks on Large Language Models", 2023
(a user's score is the mean per-example likelihood ratio over that user's samples).
Deviations:
    [REC] One variance for all examples and both sides (LiRA's "global variance", which Carlini
    et al. recommend below ~64 shadow models) instead of per-example variances per side. With
    equal variances the per-example log-likelihood ratio is linear and increasing in phi when
    mu_in > mu_out, so a model *more* confident on the client's data than the "in" references
    (e.g. fine-tuned on it) is flagged, never excused by the quadratic term.
    [REC] The reference models share the run's M_0 and differ in batch orders only: the scored
    models (the original, Retrain) start from that M_0 too, so the references are draws of the
    same training process, conditioned on the same start.
    [REC] The threshold is a parametric (Gaussian, Student-t) fit of the "out" scores rather
    than their empirical quantile: with a handful of references the empirical 95% quantile is
    the maximum of a few values.
    [REC] References reproduce the run's rounds, participants, local training, attacks
    (update mods) and aggregation, not its DP noise: on a DP run the test compares models
    trained without noise.
Limitation: a model made more confident on every input (e.g. extra training rounds on the
remaining clients) also scores higher on the forgotten clients' examples and can be flagged
though it never saw them; a flag means "more confident on the client's data than any of the
models trained without it", as the original is.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.eval.mia.common import is_int
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.clients import ClientsWrapper, TrainTask
from fedunlearn.fl.engine import run_round
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession

__all__ = [
    "DEFAULT_MAX_SECONDS",
    "DEFAULT_NUM_REFERENCE",
    "ClientMembershipTest",
    "fit_client_membership",
    "leave_one_out_scores",
    "measure_client_membership",
    "share_toward",
    "build_client_test",
]

DEFAULT_NUM_REFERENCE = 8  # 4 "in" + 4 "out"
DEFAULT_MAX_SECONDS = 300.0
MIN_PER_SIDE = 2  # leave-one-out needs another reference of the same side
CONTROL_EXAMPLES = 2000  # remaining clients' examples that measure a model's fitness
DOMAIN_LEVEL = 0.99  # prediction level of the references' fitness range
# with 2 per side the two-sided 99% Student-t factor is 63.7: a range that holds everything
MIN_PER_SIDE_FOR_RANGE = 3


class _SaltedClients(ClientsWrapper):
    """The federation's clients training with another seed salt (other batch orders)."""

    def __init__(self, federation: Federation, salt: int) -> None:
        super().__init__(federation)
        self.salt = salt

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        return self._wrapped.train(dataclasses.replace(task, salt=self.salt + task.salt))


class _Budget:
    """Wall-clock budget: may one more round start without passing ``max_seconds``?"""

    def __init__(self, max_seconds: float) -> None:
        self.max_seconds = max_seconds
        self.started = time.perf_counter()
        self.rounds = 0
        self.round_seconds = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def allows_round(self) -> bool:
        mean = self.round_seconds / self.rounds if self.rounds else 0.0
        return self.elapsed() + mean <= self.max_seconds

    def count_round(self, seconds: float) -> None:
        self.rounds += 1
        self.round_seconds += seconds


def _logit_confidence(
    model: torch.nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> np.ndarray:
    """Return phi = log(p_y / (1 - p_y)) per example, computed stably from the logits."""
    logits = predict_logits(model, params, x).to(torch.float64)
    true = logits.gather(1, y.long().view(-1, 1)).squeeze(1)
    others = logits.scatter(1, y.long().view(-1, 1), -math.inf)
    # log p_y - log(1 - p_y) = z_y - logsumexp_{j != y} z_j
    return (true - torch.logsumexp(others, dim=1)).numpy()


def _run_participants(session: UnlearnSession) -> list[frozenset[int]]:
    """Return the clients the run asked to train in each round (1..T), from its records."""
    run = session.run_view
    return [
        frozenset(r.client_id for r in run.store.client_records(round_))
        for round_ in range(1, run.num_rounds + 1)  # the store's rounds (applied: L, not T)
    ]


def _control_sample(
    session: UnlearnSession,
    forgotten: frozenset[int],
    rounds: Sequence[frozenset[int]],
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Step 8: a seeded sample of the remaining clients' training examples (as trained on)."""
    remaining = sorted(set().union(*rounds) - forgotten) if rounds else []
    if not remaining:
        return None
    data = session.federation.client_data
    x = torch.cat([data[c].x for c in remaining])
    y = torch.cat([data[c].y for c in remaining])
    g = torch.Generator().manual_seed(derive_seed(seed, "client_lira_control"))
    keep = torch.randperm(len(y), generator=g)[:CONTROL_EXAMPLES]
    return x[keep], y[keep]


def _client_epochs(rounds: Sequence[frozenset[int]], excluded: frozenset[int], epochs: int) -> int:
    """Return the client epochs of one run of ``rounds`` without the ``excluded`` clients."""
    return sum(len(participants - excluded) for participants in rounds) * epochs


def _train_reference(
    clients: _SaltedClients,
    start: torch.Tensor,
    rounds: Sequence[frozenset[int]],
    aggregator: Aggregator,
    excluded: frozenset[int],
    budget: _Budget,
) -> tuple[torch.Tensor, float] | None:
    """Train one reference model; return (params, client epochs), or None if out of budget."""
    params = start.clone()
    epochs = 0.0
    for round_, everyone in enumerate(rounds, start=1):
        participants = sorted(everyone - excluded)
        if not participants:
            continue
        if not budget.allows_round():
            return None
        began = time.perf_counter()
        record = run_round(clients, aggregator, params, round_, participants)
        budget.count_round(time.perf_counter() - began)
        params = record.global_after
        epochs += len(participants) * clients.spec.epochs
    return params, epochs


def _score(phi: np.ndarray, mu_in: np.ndarray, mu_out: np.ndarray, var: float) -> float:
    """Step 4: mean per-example log N(phi; mu_in, var) - log N(phi; mu_out, var)."""
    llr = ((phi - mu_out) ** 2 - (phi - mu_in) ** 2) / (2.0 * var)
    return float(np.mean(llr))


def _score_se(phi: np.ndarray, mu_in: np.ndarray, mu_out: np.ndarray, var: float) -> float:
    """The standard error of ``_score`` (the mean per-example log-likelihood ratio)."""
    llr = ((phi - mu_out) ** 2 - (phi - mu_in) ** 2) / (2.0 * var)
    return float(np.std(llr, ddof=1) / math.sqrt(len(llr))) if len(llr) > 1 else math.nan


def _fit(phi_in: np.ndarray, phi_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Step 3: per-example means per side and one pooled variance (rows are references)."""
    mu_in, mu_out = phi_in.mean(axis=0), phi_out.mean(axis=0)
    squares = ((phi_in - mu_in) ** 2).sum() + ((phi_out - mu_out) ** 2).sum()
    dof = (len(phi_in) + len(phi_out) - 2) * phi_in.shape[1]
    var = float(squares / dof) if dof > 0 else 0.0
    return mu_in, mu_out, max(var, 1e-12)


def leave_one_out_scores(
    phi_in: np.ndarray, phi_out: np.ndarray
) -> tuple[list[float], list[float]]:
    """Step 5: score every reference with Gaussians fitted on the other references only.

    Args:
        phi_in: Logit-scaled confidences (references x examples) of the "in" references.
        phi_out: The same for the "out" references.

    Returns:
        The "in" references' scores and the "out" references' scores, in row order. Neither
        its own row's mean nor its own deviations enter a reference's Gaussians.
    """
    scores: dict[str, list[float]] = {"in": [], "out": []}
    for side, own, other in (("in", phi_in, phi_out), ("out", phi_out, phi_in)):
        for r in range(len(own)):
            rest = np.delete(own, r, axis=0)
            fit_in, fit_out = (rest, other) if side == "in" else (other, rest)
            scores[side].append(_score(own[r], *_fit(fit_in, fit_out)))
    return scores["in"], scores["out"]


def _threshold(out_scores: np.ndarray, target_fpr: float) -> float:
    """Step 6: one-sided Student-t prediction bound of the "out" scores at 1 - target_fpr."""
    from scipy.stats import t as student_t

    k = len(out_scores)
    sd = float(np.std(out_scores, ddof=1))
    quantile = float(student_t.ppf(1.0 - target_fpr, df=k - 1))
    return float(np.mean(out_scores)) + quantile * sd * math.sqrt(1.0 + 1.0 / k)


def _check_options(
    session: UnlearnSession,
    forget: Iterable[int],
    num_reference: int,
    target_fpr: float,
    max_seconds: float,
    skip: bool,
) -> frozenset[int]:
    forgotten = list(forget)
    if not forgotten:
        raise ConfigError("forget is empty; name at least one client whose influence to test")
    if not all(is_int(c) for c in forgotten):
        raise ConfigError(f"forget must hold client ids (ints); got {forgotten!r}")
    request = UnlearnRequest.of(forgotten)
    session.run_view.check_request(request)
    if not is_int(num_reference) or num_reference < 2 * MIN_PER_SIDE:
        raise ConfigError(
            f"num_reference must be an int >= {2 * MIN_PER_SIDE} (half 'in', half 'out'); got "
            f"{num_reference!r}"
        )
    if not 0.0 < target_fpr < 0.5:
        raise ConfigError(f"target_fpr must lie in (0, 0.5); got {target_fpr}")
    if not max_seconds > 0:
        raise ConfigError(f"max_seconds must be > 0; got {max_seconds}")
    if not isinstance(skip, bool):
        raise ConfigError(f"skip must be a bool; got {skip!r}")
    return request.forget


def _check_models(models: Mapping[str, torch.Tensor], size: int) -> None:
    if "original" not in models:
        raise ConfigError(
            f"models must include 'original' (the negative control); got {sorted(models)}"
        )
    for label, params in models.items():
        if not isinstance(params, torch.Tensor) or params.ndim != 1 or params.numel() != size:
            shape = tuple(params.shape) if isinstance(params, torch.Tensor) else type(params)
            raise ConfigError(
                f"model '{label}' must be a flat vector of this run's {size} parameters; got "
                f"{shape}"
            )


def _domain(fitness: Mapping[str, Sequence[float]], level: float) -> tuple[float, float]:
    """Step 8: the references' range of fitness.

    Per side, the two-sided Student-t prediction bounds at ``level`` for one more draw; the
    union of the sides' ranges.
    """
    from scipy.stats import t as student_t

    lows, highs = [], []
    for values in fitness.values():
        k = len(values)
        mean = float(np.mean(values))
        spread = float(np.std(values, ddof=1)) * math.sqrt(1.0 + 1.0 / k) if k > 1 else 0.0
        half = float(student_t.ppf(0.5 + level / 2.0, df=max(k - 1, 1))) * spread
        lows.append(mean - half)
        highs.append(mean + half)
    return min(lows), max(highs)


class ClientMembershipTest:
    """The test fitted once for one run and request: reference statistics and calibration.

    Built by ``fit_client_membership`` (steps 1-2, 5-7 of the module docstring);
    ``evidence(models)`` scores any models of the run against it (steps 3-4: one forward pass
    over the forgotten clients' examples per model), so a receipt fits once per request and
    scores every candidate. Its ``power`` is None when the test is inconclusive (skipped or
    out of time); ``inconclusive`` then says why.

    Args:
        template: The run's model template.
        num_params: Its number of parameters (the flat vectors scored).
        data: Forgotten client id -> its training data (inputs, labels), scored per example.
        phi_in: Logit-scaled confidences (references x examples) of the "in" references.
        phi_out: The same for the "out" references.
        control: Inputs and training labels of the remaining clients (a seeded sample): each
            model's mean logit-scaled confidence on them is its *fitness* (step 8).
        fitness: The references' fitness, per side ("in", "out").
        out_params: The "out" references' flat parameters (independent exact retrains), for
            their positions between Retrain and the original (``toward``) and for each scored
            model's distance to them (``ground``).
        initial: The run's M_0, from which every reference was trained.
        target_fpr: The false-positive rate the threshold is set for.
        cost_seconds: Wall time of the fit.
        cost_client_epochs: Client epochs the references cost.
        notes: Details kept in every evidence's ``notes``.
        inconclusive: Why no calibration is possible, or None.
    """

    def __init__(
        self,
        template: torch.nn.Module,
        num_params: int,
        data: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
        phi_in: np.ndarray,
        phi_out: np.ndarray,
        *,
        control: tuple[torch.Tensor, torch.Tensor] | None = None,
        fitness: Mapping[str, Sequence[float]] | None = None,
        out_params: Sequence[torch.Tensor] = (),
        initial: torch.Tensor | None = None,
        target_fpr: float,
        cost_seconds: float,
        cost_client_epochs: float,
        notes: Mapping[str, object],
        inconclusive: str | None = None,
    ) -> None:
        self._template = template
        self._x = torch.cat([x for x, _ in data.values()])
        self._y = torch.cat([y for _, y in data.values()])
        self._owner = np.concatenate([np.full(len(y), c) for c, (_, y) in data.items()])
        self.clients = tuple(int(c) for c in data)
        self.num_params = num_params
        self.target_fpr = target_fpr
        self.cost_seconds = cost_seconds
        self.cost_client_epochs = cost_client_epochs
        self.num_reference_models = len(phi_in) + len(phi_out)
        self.inconclusive = inconclusive
        self.notes: dict[str, object] = {
            **notes,
            "num_in": len(phi_in),
            "num_out": len(phi_out),
            "num_examples": {int(c): len(y) for c, (_, y) in data.items()},
        }
        self.threshold = math.inf
        self.power: float | None = None
        self._control = control
        self._out_params = tuple(out_params)
        self._displacement = (
            float(np.mean([float((p - initial).norm()) for p in self._out_params]))
            if initial is not None and self._out_params
            else None
        )
        self.fitness = {side: [float(v) for v in vals] for side, vals in (fitness or {}).items()}
        self.domain: tuple[float, float] | None = None
        self.in_max: float | None = None
        if min(len(phi_in), len(phi_out)) < MIN_PER_SIDE:
            self.inconclusive = inconclusive or (
                f"only {len(phi_in)} 'in' and {len(phi_out)} 'out' reference model(s); need "
                f"{MIN_PER_SIDE} of each"
            )
        if self.inconclusive is not None:
            self.notes["inconclusive"] = self.inconclusive
            return
        # Step 3: Gaussians on every reference, for the models scored later.
        self._mu_in, self._mu_out, self._var = _fit(phi_in, phi_out)
        # Step 5: leave-one-out scores of the references.
        loo_in, loo_out = leave_one_out_scores(phi_in, phi_out)
        # Steps 6-7: threshold from the "out" scores, power on the "in" scores.
        self.threshold = _threshold(np.array(loo_out), target_fpr)
        self.power = float(np.mean(np.array(loo_in) > self.threshold))
        self.notes["reference_scores"] = {"in": loo_in, "out": loo_out}
        self.notes["variance"] = self._var
        self.in_max = float(max(loo_in))
        # Step 8: the fitness range of the references (the models the calibration is valid for)
        if control is not None and self.fitness:
            self.notes["reference_fitness"] = self.fitness
            values = [v for side in self.fitness.values() for v in side]
            if min(len(v) for v in self.fitness.values()) < MIN_PER_SIDE_FOR_RANGE:
                self.notes["fitness_range"] = (
                    f"not measured: fewer than {MIN_PER_SIDE_FOR_RANGE} references per side"
                )
            elif not all(math.isfinite(v) for v in values):
                self.notes["fitness_range"] = "not measured: a reference's fitness is not finite"
            else:
                self.domain = _domain(self.fitness, DOMAIN_LEVEL)

    def evidence(self, models: Mapping[str, torch.Tensor]) -> ClientMembershipEvidence:
        """Score ``models`` (label -> flat parameters; ``"original"`` required).

        Returns:
            The models' scores (NaN, flagging nothing, when inconclusive), the threshold, the
            power, and the fit's cost; per-client scores in ``notes["client_scores"]``.

        Raises:
            ConfigError: without ``"original"`` or for parameters of the wrong size.
        """
        _check_models(models, self.num_params)
        notes = dict(self.notes)
        fitness: dict[str, float] = {}
        toward: tuple[float, ...] = ()
        if self.power is None:
            scores = {label: math.nan for label in models}
        else:
            # Step 4: mean per-example log-likelihood ratio, over all examples and per client.
            mu_in, mu_out, var, owner = self._mu_in, self._mu_out, self._var, self._owner
            phis = {
                label: _logit_confidence(
                    self._template, p.detach().to(torch.float32), self._x, self._y
                )
                for label, p in models.items()
            }
            scores = {label: _score(phi, mu_in, mu_out, var) for label, phi in phis.items()}
            # the standard error of each score (a mean over the examples): its interval
            notes["score_se"] = {
                label: _score_se(phi, mu_in, mu_out, var) for label, phi in phis.items()
            }
            notes["examples"] = len(self._y)
            notes["client_scores"] = {
                label: {
                    c: _score(phi[owner == c], mu_in[owner == c], mu_out[owner == c], var)
                    for c in self.clients
                }
                for label, phi in phis.items()
            }
            if self.domain is not None and self._control is not None:
                cx, cy = self._control
                fitness = {
                    label: float(
                        np.mean(_logit_confidence(self._template, p.to(torch.float32), cx, cy))
                    )
                    for label, p in models.items()
                }
        ground = {label: self._ground(p) for label, p in models.items()}
        if "retrain" in models and self._out_params:
            toward = tuple(
                share_toward(r, models["retrain"], models["original"]) for r in self._out_params
            )
        return ClientMembershipEvidence(
            scores=scores,
            threshold=self.threshold,
            target_fpr=self.target_fpr,
            power=self.power,
            num_reference_models=self.num_reference_models,
            cost_seconds=self.cost_seconds,
            cost_client_epochs=self.cost_client_epochs,
            notes=notes,
            fitness=fitness,
            domain=self.domain,
            in_max=self.in_max,
            reference_toward=toward,
            ground={k: v for k, v in ground.items() if v is not None},
        )

    def _ground(self, params: torch.Tensor) -> float | None:
        """Distance to the nearest "out" reference over their mean displacement from M_0."""
        if not self._displacement:
            return None
        flat = params.detach().to(torch.float32)
        nearest = min(float((flat - r).norm()) for r in self._out_params)
        return nearest / self._displacement


def share_toward(model: torch.Tensor, retrain: torch.Tensor, original: torch.Tensor) -> float:
    """Return how far ``model`` lies from Retrain toward the original, along their difference.

    ``<m - r, o - r> / ||o - r||^2``: 0 at Retrain, 1 at the original, lambda for the weight
    interpolation ``lambda * o + (1 - lambda) * r``; a move orthogonal to ``o - r`` (noise,
    another batch order) adds nothing. NaN when the original equals Retrain.
    """
    r = retrain.detach().to(torch.float64)
    gap = original.detach().to(torch.float64) - r
    norm = float(gap @ gap)
    if norm == 0.0:
        return math.nan
    return float((model.detach().to(torch.float64) - r) @ gap) / norm


def fit_client_membership(
    session: UnlearnSession,
    forget: Iterable[int],
    *,
    num_reference: int = DEFAULT_NUM_REFERENCE,
    target_fpr: float = 0.05,
    seed: int = 0,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    skip: bool = False,
) -> ClientMembershipTest:
    """Train the reference models and calibrate the test; score models with ``evidence``.

    Args: as ``measure_client_membership`` (without ``models``).

    Raises:
        ConfigError: for an empty ``forget`` or options out of range.
        UnknownClientError: for a client id not in the run.
    """
    forgotten = _check_options(session, forget, num_reference, target_fpr, max_seconds, skip)
    budget = _Budget(max_seconds)
    federation = session.federation
    rounds = _run_participants(session)
    num_in, num_out = num_reference // 2, num_reference - num_reference // 2
    local_epochs = federation.spec.epochs
    retrain_epochs = _client_epochs(rounds, forgotten, local_epochs)
    planned = num_out * retrain_epochs + num_in * _client_epochs(rounds, frozenset(), local_epochs)
    notes: dict[str, object] = {
        "planned_client_epochs": planned,
        "retrain_client_epochs": retrain_epochs,
        "skipped": skip,
        "budget_exhausted": False,
    }
    trained: list[tuple[str, torch.Tensor]] = []
    client_epochs = 0.0
    reason = None
    if skip:
        reason = (
            f"skipped on request: {num_reference} reference models would cost {planned:,} "
            f"client epochs ({planned / max(retrain_epochs, 1):.1f}x a Retrain); run it to "
            "test the influence"
        )
    else:
        aggregator = session.context(UnlearnRequest.of(sorted(forgotten))).aggregator
        # Step 1: "out" and "in" references, alternately, within the budget.
        plan: list[tuple[str, int]] = []
        for j in range(num_out):
            plan.append(("out", j))
            if j < num_in:
                plan.append(("in", j))
        for side, j in plan:
            salt = derive_seed(seed, "client_lira", 0 if side == "out" else 1, j)
            reference = _train_reference(
                _SaltedClients(federation, salt),
                session.run_view.initial_params,
                rounds,
                aggregator,
                forgotten if side == "out" else frozenset(),
                budget,
            )
            if reference is None:
                notes["budget_exhausted"] = True
                break
            trained.append((side, reference[0]))
            client_epochs += reference[1]
        sides = [side for side, _ in trained]
        if min(sides.count("in"), sides.count("out")) < MIN_PER_SIDE:
            reason = (
                f"only {sides.count('in')} 'in' and {sides.count('out')} 'out' reference "
                f"model(s) fitted in max_seconds={max_seconds:g}; need {MIN_PER_SIDE} of each "
                "(raise max_seconds)"
            )
    return build_client_test(
        session,
        forgotten,
        trained,
        target_fpr=target_fpr,
        seed=seed,
        cost_seconds=budget.elapsed(),
        cost_client_epochs=client_epochs,
        notes=notes,
        inconclusive=reason,
    )


def build_client_test(
    session: UnlearnSession,
    forgotten: frozenset[int],
    trained: Sequence[tuple[str, torch.Tensor]],
    *,
    target_fpr: float,
    seed: int,
    cost_seconds: float,
    cost_client_epochs: float,
    notes: Mapping[str, object],
    inconclusive: str | None = None,
) -> ClientMembershipTest:
    """Steps 2-8 on trained references: the calibrated test of ``forgotten``.

    Args:
        session: The opened run.
        forgotten: The clients whose influence is tested.
        trained: ``("in" | "out", flat parameters)`` of each reference, in training order.
        target_fpr: The false-positive rate the threshold is set for.
        seed: Seed of the control sample (step 8).
        cost_seconds: Wall seconds the references cost this request.
        cost_client_epochs: Client epochs the same.
        notes: Details kept in every evidence's ``notes``.
        inconclusive: Why no calibration is possible, or None.
    """
    federation = session.federation
    template = session.run_view.model
    data = {
        c: (federation.client_data[c].x, federation.client_data[c].y) for c in sorted(forgotten)
    }
    x = torch.cat([x for x, _ in data.values()])
    y = torch.cat([y for _, y in data.values()])
    phis: dict[str, list[np.ndarray]] = {"out": [], "in": []}
    control = _control_sample(session, forgotten, _run_participants(session), seed)
    fitness: dict[str, list[float]] = {"out": [], "in": []}
    out_params: list[torch.Tensor] = []
    for side, params in trained:
        # Step 2: logit-scaled confidence on every forgotten client's training example.
        phis[side].append(_logit_confidence(template, params.to(torch.float32), x, y))
        # Step 8: fitness on the remaining clients' examples
        if control is not None:
            fitness[side].append(
                float(np.mean(_logit_confidence(template, params.float(), *control)))
            )
        if side == "out":
            out_params.append(params.to(torch.float32))
    width = len(y)
    return ClientMembershipTest(
        template,
        session.run_view.final_params.numel(),
        data,
        np.array(phis["in"]).reshape(-1, width),
        np.array(phis["out"]).reshape(-1, width),
        control=control,
        fitness=fitness,
        out_params=out_params,
        initial=session.run_view.initial_params.to(torch.float32),
        target_fpr=target_fpr,
        cost_seconds=cost_seconds,
        cost_client_epochs=cost_client_epochs,
        notes=notes,
        inconclusive=inconclusive,
    )


def measure_client_membership(
    session: UnlearnSession,
    forget: Iterable[int],
    models: Mapping[str, torch.Tensor],
    *,
    num_reference: int = DEFAULT_NUM_REFERENCE,
    target_fpr: float = 0.05,
    seed: int = 0,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    skip: bool = False,
) -> ClientMembershipEvidence:
    """Score models on a client-level likelihood-ratio membership test (LiRA-style).

    ``fit_client_membership(...).evidence(models)``, with ``models`` checked before any
    training. To score more models later without training again, keep the fitted test.

    Args:
        session: The opened run (its federation trains the reference models).
        forget: The forgotten client ids whose influence is tested.
        models: Label -> flat parameters of each model to score; must include ``"original"``
            (the negative control); usually ``"retrain"`` (the positive control, when computed)
            and ``"candidate"``.
        num_reference: Reference models to train, half "out" (without ``forget``), half "in"
            (with them); an odd count gives "out" the extra one. At least 4.
        target_fpr: The false-positive rate the threshold is set for, in (0, 0.5).
        seed: Seed of the references' batch orders (with the run's seed).
        max_seconds: Wall-time budget of the reference training: a round is not started when
            the mean round time would pass it (so it is exceeded by at most one round's time
            plus the scoring). References cut short are dropped; with fewer than 2 per side the
            evidence has an infinite threshold, ``power=None`` and ``notes["inconclusive"]``.
        skip: Train nothing and return evidence without power (``power=None``, infinite
            threshold, NaN scores, no client epochs) whose ``notes["inconclusive"]`` says it was
            skipped and what the test would cost (``notes["planned_client_epochs"]`` against
            ``notes["retrain_client_epochs"]``): for a receipt that cannot afford it.

    Returns:
        The scores of ``models`` (and, in ``notes``, the references' leave-one-out scores, the
        per-client scores, the sample counts and the planned cost), the threshold, the
        measured power, and the cost (wall seconds, client epochs spent on references).
        ``power`` is None exactly when the test is inconclusive (skipped, or out of time);
        ``notes["inconclusive"]`` then says why.

    Raises:
        ConfigError: for an empty ``forget``, missing ``"original"``, parameters of the wrong
            size, or options out of range.
        UnknownClientError: for a client id not in the run.
    """
    forget = list(forget)
    _check_options(session, forget, num_reference, target_fpr, max_seconds, skip)
    _check_models(models, session.run_view.final_params.numel())
    test = fit_client_membership(
        session,
        forget,
        num_reference=num_reference,
        target_fpr=target_fpr,
        seed=seed,
        max_seconds=max_seconds,
        skip=skip,
    )
    return test.evidence(models)
