import math
from dataclasses import dataclass

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.runs import HISTORY_DIR, train_run
from fedunlearn.unlearn import Costs, UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.baselines.fedrecover import (
    FedRecover,
    Schedule,
    kth_largest_abs,
    round_thresholds,
)
from fedunlearn.unlearn.context import CostMeter, MeteredHistory, RemainingClients, UnlearnContext

# L2-regularised logistic regression on Gaussian blobs, non-IID: small and convex.
ROUNDS = 16
EPOCHS = 2
RUN = {
    "seed": 5,
    "data": {
        "dataset": "synthetic",
        "num_clients": 6,
        "partition": "dirichlet",
        "alpha": 0.5,
        "options": {"num_samples": 900, "num_features": 12, "num_classes": 3},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": ROUNDS,
        "local_epochs": EPOCHS,
        "lr": 0.05,
        "batch_size": 40,
        "weight_decay": 1e-3,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}
FORGET = UnlearnRequest.of([0, 1])


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # Tiny models: a second OpenMP thread only spins against other work on a shared box
    # (this module: 11 s with one thread, 67 s with two on a busy 2-core machine).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fedrecover") / "run"
    train_run(parse_config(RUN), run_dir)
    with UnlearnSession(run_dir, evaluate=False) as opened:
        yield opened


@pytest.fixture(scope="module")
def retrained(session):
    return session.run(make_method("retrain"), FORGET)


@pytest.fixture(scope="module")
def recovered(session):
    return session.run(make_method("fedrecover"), FORGET)


# ---- (1) every round exact = Retrain, bit for bit ----------------------------------------------


@pytest.mark.parametrize(
    "params",
    [{"correction_period": 1}, {"warmup_rounds": ROUNDS - 5, "final_rounds": 5}],
    ids=["period_1", "warmup_covers_middle"],
)
def test_all_exact_schedule_reproduces_retrain_bitwise(session, retrained, params):
    result = session.run(make_method("fedrecover", params), FORGET)
    assert torch.equal(result.params, retrained.params)
    assert result.details.estimated_updates == 0
    assert result.costs.estimated_updates == 0
    assert result.costs.client_epochs == retrained.costs.client_epochs
    assert result.costs.history_bytes_read == retrained.costs.history_bytes_read  # M_0 only


# ---- (2) convex model: much closer to Retrain than the original model --------------------------


def test_default_recovery_lands_much_closer_to_retrain_than_the_original(
    session, retrained, recovered
):
    original_gap = float((session.run_view.final_params - retrained.params).norm())
    recovery_gap = float((recovered.params - retrained.params).norm())
    assert recovery_gap < 0.5 * original_gap
    assert recovered.costs.client_epochs < retrained.costs.client_epochs
    assert recovered.details.estimated_updates > 0


# ---- (3) isotropic quadratic clients: exact for any schedule -----------------------------------


@dataclass
class QuadraticFederation:
    """Client i: L_i(w) = h_i/2 ||w - c_i||^2, one gradient step of size lr per round."""

    centres: torch.Tensor  # (n, p)
    curvatures: torch.Tensor  # (n,)
    sizes: tuple[int, ...]
    lr: float = 0.3
    seed: int = 0
    malicious: frozenset = frozenset()
    calls: int = 0
    nan_at: frozenset = frozenset()  # (round, client) whose fresh update is NaN

    def __post_init__(self):
        self.spec = LocalTrainingSpec(epochs=1, lr=self.lr)
        self.num_params = self.centres.shape[1]
        self.model = torch.nn.Linear(self.num_params, 1, bias=False)

    @property
    def client_ids(self):
        return tuple(range(len(self.sizes)))

    def num_samples(self, cid):
        return self.sizes[cid]

    def delta(self, cid, w):
        return -self.lr * self.curvatures[cid] * (w - self.centres[cid])

    def train(self, task: TrainTask):
        self.calls += 1
        out = []
        for c in task.client_ids:
            delta = self.delta(c, task.global_params)
            if (task.round, c) in self.nan_at:
                delta = delta * math.nan
            out.append(ClientUpdate(c, delta, self.sizes[c], 0.0))
        return out


class Float64Context(UnlearnContext):
    def aggregate(self, updates):
        deltas = torch.stack([d for _, d in updates])
        weights = torch.tensor([float(self.clients.num_samples(c)) for c, _ in updates])
        return fedavg(deltas, weights)


def fedavg_rounds(fed, w, clients, rounds):
    """Plain FedAvg loop; yields (round, w_before, {cid: delta}, w_after)."""
    for r in range(1, rounds + 1):
        deltas = {c: fed.delta(c, w) for c in clients}
        weights = torch.tensor([float(fed.sizes[c]) for c in clients])
        after = w + fedavg(torch.stack(list(deltas.values())), weights)
        yield r, w, deltas, after
        w = after


def build_quadratic(tmp_path, corrupt=frozenset()):
    """Store a 5-client FedAvg run (stored deltas of ``corrupt`` (round, client) set to inf)."""
    g = torch.Generator().manual_seed(0)
    n, p, rounds = 5, 6, 14
    fed = QuadraticFederation(
        centres=torch.randn(n, p, generator=g, dtype=torch.float64) * 3,
        curvatures=torch.rand(n, generator=g, dtype=torch.float64) * 1.5 + 0.5,
        sizes=(30, 10, 20, 25, 15),
    )
    w0 = torch.zeros(p, dtype=torch.float64)
    store = HistoryStore.create(tmp_path / "h", {"history_policy": "all"})
    store.write_round(RoundEntry(round=0, global_model=w0))
    for r, _, deltas, after in fedavg_rounds(fed, w0, range(n), rounds):
        records = [ClientRecord(c, "accepted", num_samples=fed.sizes[c]) for c in deltas]
        deltas = {c: d * math.inf if (r, c) in corrupt else d for c, d in deltas.items()}
        store.write_round(RoundEntry(r, after, after * 0, deltas, records))
    forget = frozenset({0})
    *_, retrain = (w for *_, w in fedavg_rounds(fed, w0, [1, 2, 3, 4], rounds))

    def context():
        meter = CostMeter()
        return Float64Context(
            history=MeteredHistory(store, meter),
            clients=RemainingClients(fed, forget, meter),
            aggregator=fedavg,
            num_rounds=rounds,
            initial_params=w0,
            final_model=store.read_model(rounds),
            evaluate=None,
            meter=meter,
        )

    return context, retrain, forget, fed, store


@pytest.fixture
def quadratic(tmp_path):
    built = build_quadratic(tmp_path)
    yield built
    built[-1].close()


@pytest.mark.parametrize(
    "params",
    [
        {"warmup_rounds": 3, "correction_period": 4, "final_rounds": 2},
        {"warmup_rounds": 4, "correction_period": None, "final_rounds": 0, "buffer_size": 3},
        {"warmup_rounds": 3, "correction_period": 5, "final_rounds": 1, "buffer_size": 1},
        {
            "warmup_rounds": 3,
            "correction_period": 4,
            "final_rounds": 2,
            "buffer_mode": "paper_literal",
        },
    ],
)
def test_isotropic_quadratic_clients_are_recovered_exactly(quadratic, params):
    context, retrain, forget, _, _ = quadratic
    original = context().final_params
    result = FedRecover({**params, "abnormality_fixing": False}).unlearn(
        UnlearnRequest(forget), context()
    )
    assert result.details.estimated_updates >= 4 * 5  # 4 clients, at least 5 rounds estimated
    assert float((original - retrain).abs().max()) > 1e-2  # forgetting matters
    assert torch.allclose(result.params, retrain, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["paired", "paper_literal"])
def test_abnormality_fixes_feed_exact_pairs_and_keep_quadratic_recovery_exact(quadratic, mode):
    context, retrain, forget, _, _ = quadratic
    params = {"warmup_rounds": 3, "correction_period": 4, "final_rounds": 2, "tau": 2.0}
    result = FedRecover({**params, "buffer_mode": mode}).unlearn(UnlearnRequest(forget), context())
    fixes = result.details.abnormality_fixes
    assert sum(fixes.values()) > 0
    assert result.details.estimated_updates > 0
    assert 0 < fixes[2] < len(result.details.estimated_rounds)  # fixed in some rounds only
    # a fix pushes (v, g - g_bar): positive curvature; the wrong sign would be skipped here
    assert result.details.guard_counts["nonpositive_curvature"] == 0
    # exact rounds 1, 2, 3, 7, 11 precede the last estimated round 12; round 1's pair is
    # degenerate (paired skips it, paper_literal keeps the column); plus one pair per fix
    first = 1 if mode == "paired" else 0
    assert result.details.pairs_pushed == {c: 5 - first + fixes[c] for c in (1, 2, 3, 4)}
    assert torch.allclose(result.params, retrain, rtol=0, atol=1e-10)


def test_client_without_usable_pair_is_asked_for_an_exact_update(quadratic):
    context, retrain, forget, _, _ = quadratic
    params = {"warmup_rounds": 1, "correction_period": None, "final_rounds": 0}
    with pytest.warns(UserWarning, match="should exceed the buffer size"):
        result = FedRecover({**params, "abnormality_fixing": False}).unlearn(
            UnlearnRequest(forget), context()
        )
    details = result.details
    # round 1's pairs are degenerate (dw = 0), so round 2 has none: A3 asks all 4 clients once,
    # and their round-2 pairs let rounds 3..14 be estimated
    assert details.no_pair_requests == {1: 1, 2: 1, 3: 1, 4: 1}
    assert details.guard_counts["no_pairs"] == 4
    assert details.guard_counts["degenerate_step"] == 4
    assert details.pairs_pushed == {1: 1, 2: 1, 3: 1, 4: 1}
    assert details.exact_updates_per_client == {1: 2, 2: 2, 3: 2, 4: 2}
    assert torch.allclose(result.params, retrain, rtol=0, atol=1e-10)


def test_non_finite_estimates_and_exact_updates_are_handled(tmp_path):
    context, retrain, forget, fed, store = build_quadratic(tmp_path, corrupt={(6, 2)})
    params = {"warmup_rounds": 3, "correction_period": 4, "final_rounds": 2}
    try:
        # round 6 is estimated: client 2's stored delta is inf, so its estimate is abnormal
        # even with fixing off; the exact update replaces it and recovery stays exact
        result = FedRecover({**params, "abnormality_fixing": False}).unlearn(
            UnlearnRequest(forget), context()
        )
        assert result.details.abnormality_fixes == {1: 0, 2: 1, 3: 0, 4: 0}
        assert torch.allclose(result.params, retrain, rtol=0, atol=1e-10)
        # a NaN exact update (round 2, client 3) is screened out of the aggregate, as in training
        fed.nan_at = frozenset({(2, 3)})
        result = FedRecover(params).unlearn(UnlearnRequest(forget), context())
    finally:
        store.close()
    rejected = result.details.rejected_updates
    assert [(x["round"], x["client_id"]) for x in rejected] == [(2, 3)]
    assert "non-finite" in rejected[0]["reason"]
    assert bool(torch.isfinite(result.params).all())


def test_missing_stored_update_is_refused_before_any_client_work(tmp_path):
    fed = QuadraticFederation(torch.ones(2, 3, dtype=torch.float64), torch.ones(2), (5, 5))
    w0 = torch.zeros(3, dtype=torch.float64)
    with HistoryStore.create(tmp_path / "h", {"history_policy": "all"}) as store:
        store.write_round(RoundEntry(round=0, global_model=w0))
        records = [ClientRecord(c, "accepted", num_samples=5) for c in (0, 1)]
        store.write_round(RoundEntry(1, w0, w0, {0: w0}, records))  # client 1's update lost
        meter = CostMeter()
        context = Float64Context(
            history=MeteredHistory(store, meter),
            clients=RemainingClients(fed, frozenset({0}), meter),
            aggregator=fedavg,
            num_rounds=1,
            initial_params=w0,
            final_model=w0,
            meter=meter,
        )
        with pytest.raises(UnsupportedHistoryError, match="round 1 client 1"):
            FedRecover().unlearn(UnlearnRequest.of([0]), context)
    assert fed.calls == 0
    assert meter.costs.history_bytes_read == 0


# ---- (4) schedule and cost accounting with tau = inf -------------------------------------------


def test_schedule_and_costs_with_infinite_tau(session):
    params = {
        "warmup_rounds": 3,
        "correction_period": 4,
        "final_rounds": 2,
        "abnormality_fixing": False,
    }
    result = session.run(make_method("fedrecover", params), FORGET)
    # middle rounds 4..14; (r - 3) % 4 == 0 at r = 7, 11
    exact = [1, 2, 3, 7, 11, 15, 16]
    per_client = 3 + 2 + (ROUNDS - 3 - 2) // 4
    remaining = [c for c in session.run_view.client_ids if c not in FORGET.forget]
    details, costs = result.details, result.costs
    assert list(details.exact_rounds) == exact
    assert per_client == len(exact)
    assert details.exact_updates_per_client == {c: per_client for c in remaining}
    assert costs.client_participations == len(remaining) * per_client
    assert costs.client_epochs == len(remaining) * per_client * EPOCHS
    assert costs.estimated_updates == len(remaining) * (ROUNDS - per_client)
    assert costs.rounds == ROUNDS
    assert sum(details.abnormality_fixes.values()) == 0
    assert sum(details.no_pair_requests.values()) == 0
    assert details.tau == math.inf


def test_schedule_is_clamped_for_short_runs():
    params = FedRecover({"warmup_rounds": 5, "final_rounds": 5}).params
    assert Schedule.clamped(params, 8).to_dict() == {
        "num_rounds": 8,
        "warmup_rounds": 5,
        "correction_period": 10,
        "final_rounds": 3,
    }
    assert Schedule.clamped(params, 3).exact_rounds() == [1, 2, 3]
    never = Schedule.clamped(FedRecover({"correction_period": math.inf}).params, 40)
    assert never.correction_period is None
    assert never.exact_rounds() == [1, 2, 3, 4, 5, 36, 37, 38, 39, 40]
    assert never.exact_per_client() == 10
    assert Schedule.clamped(params, 40).exact_per_client() == 13  # FR1


@pytest.mark.parametrize(
    "bad",
    [
        {"warmup_rounds": -1},
        {"correction_period": 0},
        {"buffer_size": 0},
        {"alpha": 1.5},
        {"tau": -1.0},
        {"buffer_mode": "fifo"},
        {"warmup": 3},
    ],
)
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(ConfigError, match="invalid parameters for method 'fedrecover'"):
        make_method("fedrecover", bad)


# ---- (5) the threshold --------------------------------------------------------------------------


def test_round_thresholds_leave_at_most_alpha_of_coordinates_above(session, recovered):
    alpha = 0.02  # with p = 39 and 4 remaining clients, k = floor(alpha N_t) + 1 = 4
    context = session.context(FORGET)
    remaining = [c for c in session.run_view.client_ids if c not in FORGET.forget]
    per_round = round_thresholds(context, {r: remaining for r in range(1, ROUNDS + 1)}, alpha)
    assert context.meter.costs.client_epochs == 0
    assert context.meter.costs.history_bytes_read == ROUNDS * len(remaining) * 39 * 4
    assert sorted(per_round) == list(range(1, ROUNDS + 1))
    for r, tau_r in per_round.items():
        coords = torch.cat([session.run_view.store.read_update(r, c).abs() for c in remaining])
        assert int((coords > tau_r).sum()) <= alpha * coords.numel()
        assert int((coords >= tau_r).sum()) >= math.floor(alpha * coords.numel()) + 1
    # the method's own tau (default alpha = 1e-6: k = 1, the largest |coordinate|) is the max
    default = recovered.details.tau_per_round
    assert recovered.details.tau == max(default.values())
    assert default[3] == float(
        torch.cat([session.run_view.store.read_update(3, c).abs() for c in remaining]).max()
    )


@pytest.mark.parametrize("k", [1, 2, 7, 50, 51, 99, 100, 101])
def test_streaming_kth_largest_matches_a_full_sort(k):
    g = torch.Generator().manual_seed(k)
    chunks = [torch.randn(n, generator=g) for n in (30, 1, 40, 29)]
    ordered = torch.cat(chunks).abs().sort(descending=True).values
    expected = float(ordered[k - 1]) if k <= 100 else 0.0
    assert kth_largest_abs(iter(chunks), k, 100) == expected


@pytest.mark.parametrize("k", [1, 2, 3, 40, 159, 160, 161])
def test_streaming_kth_largest_with_ties_and_nan_matches_the_unfiltered_top_k(k):
    """The chunk filter (values that cannot enter the candidates) changes no value."""
    g = torch.Generator().manual_seed(k)
    chunks = [torch.randint(-3, 4, (n,), generator=g).float() for n in (20, 20, 40, 20, 60)]
    chunks[3][5] = float("nan")
    pool = torch.cat(chunks).abs()
    total = pool.numel()
    largest = k <= total - k + 1
    keep = k if largest else total - k + 1
    # the unfiltered rule: one top-k over every value (NaN ranks above every number)
    kept = pool.topk(min(keep, total), largest=largest).values
    expected = float(kept.min() if largest else kept.max()) if k <= total else 0.0
    got = kth_largest_abs(iter(chunks), k, total)
    assert got == expected or (math.isnan(got) and math.isnan(expected))


# ---- (6) buffer modes ---------------------------------------------------------------------------


def test_paired_and_paper_literal_buffers_agree_when_no_fix_fires(session, recovered):
    literal = session.run(make_method("fedrecover", {"buffer_mode": "paper_literal"}), FORGET)
    assert sum(recovered.details.abnormality_fixes.values()) == 0
    assert sum(literal.details.abnormality_fixes.values()) == 0
    assert torch.equal(literal.params, recovered.params)


def test_abnormality_fixing_with_zero_tau_asks_every_client(session, retrained):
    result = session.run(make_method("fedrecover", {"tau": 0.0}), FORGET)
    # every estimate is abnormal, so every update is exact, with the round's seed: Retrain
    assert torch.equal(result.params, retrained.params)
    assert result.costs.estimated_updates == 0
    estimated = len(result.details.estimated_rounds)
    assert set(result.details.abnormality_fixes.values()) == {estimated}
    assert estimated > 0


# ---- (7) history the method cannot use ----------------------------------------------------------


def test_run_recorded_with_policy_every_is_refused_before_any_work(tmp_path):
    cfg = {
        **RUN,
        "training": {**RUN["training"], "rounds": 2},
        "history": {"policy": "every", "every": 2},
    }
    train_run(parse_config(cfg), tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as opened:
        context = opened.context(FORGET)
        with pytest.raises(UnsupportedHistoryError, match="fedrecover needs history policy all"):
            make_method("fedrecover").unlearn(FORGET, context)
    assert context.meter.costs == Costs()


# ---- (8) determinism, reporting -----------------------------------------------------------------


def test_same_inputs_give_bit_identical_results(session, recovered):
    again = session.run(make_method("fedrecover"), FORGET)
    assert torch.equal(again.params, recovered.params)
    assert again.details == recovered.details
    assert again.costs.client_epochs == recovered.costs.client_epochs


def test_details_report_tau_guards_and_history_needs(session, recovered):
    details = recovered.details
    assert 0 < details.tau < math.inf
    assert details.exact_updates + details.estimated_updates == 4 * ROUNDS
    # round 1 starts from M_0 for both trajectories: its pairs are degenerate (guard a)
    assert details.guard_counts["degenerate_step"] == 4
    method = make_method("fedrecover")
    context = session.context(FORGET)
    p = session.run_view.final_params.numel()
    assert method.history_bytes_needed(context) == (ROUNDS + 6 * ROUNDS) * p * 4
    with HistoryStore.open(session.run_view.run_dir / HISTORY_DIR) as store:
        assert method.history_bytes_needed(context) < store.stored_bytes()
