"""MpcBackend against numpy, and the whole 2PC pipeline against its plaintext mirror."""

import inspect
import time

import numpy as np
import pytest
import torch
from starfish_support import FORGET, two_party

from fedunlearn.config import parse_config
from fedunlearn.mpc import FixedPoint, sec_inverse, sec_share
from fedunlearn.mpc.dealer import DealerClient
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.starfish.backend.mpc import TIMED_CALLS, MpcBackend, TimedDealer
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.backend.protocol import StarfishBackend

PHASES = ("TD", "RS", "UE", "TC", "AGG")


@pytest.fixture(scope="module")
def run_dir(convex_run):
    return convex_run


@pytest.fixture(scope="module")
def both(run_dir):
    with UnlearnSession(run_dir, evaluate=False) as session:
        plain = session.run(make_method("starfish"), FORGET)
        secure = session.run(make_method("starfish", {"backend": "mpc"}), FORGET)
    return plain, secure


# ---- the backend against numpy -------------------------------------------------------------


def test_mpc_backend_implements_the_protocol_with_the_same_signatures():
    ops = [n for n, f in vars(StarfishBackend).items() if callable(f) and not n.startswith("_")]
    for name in ops:
        wanted = list(inspect.signature(getattr(StarfishBackend, name)).parameters)
        assert list(inspect.signature(getattr(MpcBackend, name)).parameters) == wanted, name


def test_mpc_backend_ops_match_numpy_within_fixed_point_error():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    sq = rng.normal(size=(3, 3)) + 3 * np.eye(3)
    unit = rng.normal(size=5000)
    unit /= np.linalg.norm(unit)
    long = rng.normal(size=5000)

    def program(party):
        be = MpcBackend(party, client_seed=1)
        sa, sb = be.share(torch.tensor(a)), be.share(torch.tensor(b))

        def open_(x):
            return be.reveal(x, "test").numpy()

        w = torch.tensor([0.2, 0.3, 0.1, 0.4], dtype=torch.float64)
        return {
            "add": open_(be.add(sa, sb)),
            "mul_public": open_(be.mul_public(sa, 2.5)),
            "matmul_public": open_(be.matmul_public(torch.tensor(b.T), sa)),
            "unit_dot": open_(be.matmul_public(torch.tensor(unit), be.share(torch.tensor(long)))),
            "weighted": open_(be.weighted_sum([be.index(sa, i) for i in range(4)], w)),
            "mul": open_(be.mul(sa, sb)),
            "square": open_(be.mul(sa, sa)),
            "matmul": open_(be.matmul(sa, be.transpose(sb))),
            "dot": open_(be.dot(sa, sb)),
            "ge": open_(be.ge(sa, sb)),
            "ge0": open_(be.ge(sa, 0.0)),
            "max": open_(be.max(be.index(sa, 0))),
            "kth": open_(be.kth_largest(sa, 3)),
            "div": open_(be.div(sa, be.add_public(be.mul(sb, sb), 1.0), (1.0, 20.0))),
            "inverse": open_(be.inverse(be.share(torch.tensor(sq)))),
            "share": sa.share,
        }

    first, second = two_party(program)
    tol = 1e-3
    np.testing.assert_allclose(first["add"], a + b, atol=tol)
    np.testing.assert_allclose(first["mul_public"], 2.5 * a, atol=tol)
    np.testing.assert_allclose(first["matmul_public"], b.T @ a, atol=tol * 10)
    np.testing.assert_allclose(first["unit_dot"], unit @ long, atol=tol * 10)  # 5000 tiny entries
    np.testing.assert_allclose(first["weighted"], np.array([0.2, 0.3, 0.1, 0.4]) @ a, atol=tol)
    np.testing.assert_allclose(first["mul"], a * b, atol=tol)
    np.testing.assert_allclose(first["square"], a * a, atol=tol)
    np.testing.assert_allclose(first["matmul"], a @ b.T, atol=tol * 10)
    np.testing.assert_allclose(first["dot"], (a * b).sum(-1), atol=tol * 10)
    np.testing.assert_array_equal(first["ge"], (a >= b).astype(float))
    np.testing.assert_array_equal(first["ge0"], (a >= 0).astype(float))
    np.testing.assert_allclose(first["max"], a[0].max(), atol=tol)
    np.testing.assert_allclose(first["kth"], np.sort(a.ravel())[::-1][2], atol=tol)
    np.testing.assert_allclose(first["div"], a / (b * b + 1), atol=1e-2)
    np.testing.assert_allclose(first["inverse"], np.linalg.inv(sq), atol=1e-2)
    # the two shares of a client upload are each uniform; only together do they open
    fp = FixedPoint()
    np.testing.assert_array_equal(first["share"] + second["share"], fp.encode(a))
    assert not np.array_equal(first["share"], fp.encode(a))


@pytest.mark.parametrize("order", ["ratio", "value", "signed_ratio", "signed_value"])
def test_top_k_opens_the_plain_ranking_for_every_order(order):
    rng = np.random.default_rng(1)
    n, k = 9, 5
    g = rng.normal(size=(n, 30))
    y = rng.normal(size=(n, 30)) + 0.7 * g
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    u = (g * y).sum(1)
    norm = np.linalg.norm(g, axis=1)
    cols = {
        "ratio": {"u": u, "v": norm},
        "value": {"tau": u / norm},
        "signed_ratio": {"w": (u >= 0).astype(float), "a": u * u, "v": norm**2},
        "signed_value": {"w": (u >= 0).astype(float), "b": (u / norm) ** 2},
    }[order]
    plain = PlainBackend()
    expected = plain.top_k(
        {c: plain.share(torch.tensor(v)) for c, v in cols.items()}, order, k, "t"
    )

    def program(party):
        be = MpcBackend(party, client_seed=2)
        chosen = be.top_k({c: be.share(torch.tensor(v)) for c, v in cols.items()}, order, k, "t")
        return chosen, [o.to_dict() for o in be.opened]

    (chosen, opened), (other, _) = two_party(program)
    assert chosen == other == expected
    assert opened == [
        {"phase": "setup", "label": "t", "shape": [k], "value": list(map(float, chosen))}
    ]


# ---- plaintext vs 2PC on the whole pipeline ---------------------------------------------


def test_two_party_run_selects_the_same_rounds_and_flags_as_plaintext(both):
    plain, secure = both
    assert secure.details.selection_ranking == plain.details.selection_ranking
    assert secure.details.selected_rounds == plain.details.selected_rounds
    assert secure.details.flags == plain.details.flags
    assert secure.details.flags  # some correction round ran SecTC
    assert secure.details.servers_opened_same_model is True
    error = (secure.params - plain.params).norm() / plain.params.norm()
    assert float(error) < 1e-2


def test_two_party_run_opens_what_the_plaintext_mirror_opens(both):
    plain, secure = both

    def labels(result):
        return [(o["phase"], o["label"], tuple(o["shape"])) for o in result.details.opened]

    assert labels(secure) == labels(plain)


def test_two_party_run_reports_bytes_rounds_and_seconds_per_phase(both):
    _, secure = both
    for costs in (secure.details.mpc_costs, secure.details.mpc_costs_party1):
        for phase in PHASES:
            book = costs[phase]
            assert book["bytes_sent"] > 0, phase
            assert book["rounds"] > 0, phase
            assert book["seconds"] > 0, phase
            assert 0 <= book["offline_seconds"] <= book["seconds"]
        assert costs["EXACT"]["bytes_sent"] == 0  # clients upload shares; servers do not talk
    # client work is counted once although both servers receive every exact upload
    assert secure.costs.client_participations == sum(
        secure.details.exact_requests_per_client.values()
    )


# The 2PC runs below are seeded (mpc_seed): same config and seed, bit-identical result. The
# two-loop variant used to fail about one run in 65 with a fresh seed (relative difference up
# to 0.038, once a different flag): its scalar SecMI opened N = (s^T y) R, whose rounding error
# (about 2^-f) is relative to |s^T y| |R|, and the dealer's 1 x 1 mask R could be ~0.01. Masks
# now keep sigma_min(R) >= 1/2 (mpc/dealer.py), so SecMI adds at most about X's own
# quantisation error. Seed 76 was one that failed; 300 seeds now stay below 4e-4.
MIRROR_SEEDS = (7, 76)


@pytest.mark.parametrize("seed", MIRROR_SEEDS)
@pytest.mark.parametrize(
    "params",
    [
        {"round_selection": "method2"},  # secure sqrt of ||g_0 + g_1||, SecDiv with range hints
        {"estimator": "two_loop"},  # scalar SecMI per pair
        {"comparison": "ideal"},  # ideal SecGE (cost sweeps)
    ],
    ids=["method2", "two_loop", "ideal"],
)
@pytest.mark.slow
def test_other_variants_agree_with_their_plaintext_mirror(run_dir, params, seed):
    with UnlearnSession(run_dir, evaluate=False) as session:
        plain = session.run(make_method("starfish", params), FORGET)
        secure = session.run(
            make_method("starfish", {**params, "backend": "mpc", "mpc_seed": seed}), FORGET
        )
    assert secure.details.selection_ranking == plain.details.selection_ranking
    assert secure.details.flags == plain.details.flags
    assert float((secure.params - plain.params).norm() / plain.params.norm()) < 1e-2


@pytest.mark.slow
def test_a_seeded_2pc_run_is_bit_identical(run_dir):
    with UnlearnSession(run_dir, evaluate=False) as session:
        method = make_method("starfish", {"estimator": "two_loop", "backend": "mpc", "mpc_seed": 5})
        first, second = session.run(method, FORGET), session.run(method, FORGET)
    assert torch.equal(first.params, second.params)


@pytest.mark.parametrize("x", [0.005, 0.03, 1.0, 40.0])
def test_scalar_secmi_keeps_the_precision_of_its_input_whatever_the_mask(x):
    # Bound (f = 16, u = 2^-f, B = the dealer's public mask bound): X is encoded with error
    # u/2 and the opened N = X R (|R| >= 1/2) with error about u, i.e. 2u/|X| relative; the
    # public N^-1 is encoded with at least f bits (relative error u |N| <= u |X| B) and
    # [R] N^-1 is truncated once more (u |X| relative to 1/X). So X^-1 comes back as
    # (1 + e) / X with |e| <= 4u (1/|X| + |X| B). Before the fix a mask near 0 gave e up to
    # 0.6 at X = 0.005 (about 2^-f / |X R| with |R| ~ 0.01).
    fp = FixedPoint(16)
    values = np.full((300, 1, 1), x)

    def program(party):
        shared = sec_share(party, values if party.party_id == 0 else None, 0)
        return sec_inverse(shared).reveal(), party.dealer.mask_bound()

    (got, bound), _ = two_party(program, fixed_point=fp)
    unit = 2.0**-fp.frac_bits
    error = np.abs(got.ravel() * x - 1.0)
    assert error.max() <= 4 * unit * (1 / x + x * bound), error.max()


# ---- the in-process 2PC runs every time ------------------------------------------------------

# A run whose clients train vectorised (torch.func.vmap) and whose unlearning is evaluated
# after every replayed round: party 0's evaluation deep-copies the model that party 1's thread
# is training on.
VECTORISED_RUN = {
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {
        "rounds": 4,
        "local_epochs": 1,
        "lr": 0.3,
        "batch_size": 32,
        "executor": "vectorized",
    },  # fmt: skip
    "history": {"policy": "all"},
}


@pytest.mark.slow
def test_in_process_2pc_with_evaluation_succeeds_20_times_in_a_row(tmp_path):
    # Prepare: every round replayed with exact updates, so the threads train and evaluate
    # side by side (unguarded, about 1 run in 3 failed with "Cannot access storage of
    # TensorWrapper": issue 15)
    train_run(parse_config(VECTORISED_RUN), tmp_path / "run")
    method = make_method("starfish", {"backend": "mpc", "selection_rate": 1.0, "warmup_rounds": 4})

    # Execute
    outcomes = []
    with UnlearnSession(tmp_path / "run", evaluate=True) as session:
        for _ in range(20):
            try:
                result = session.run(method, UnlearnRequest.of([3]))
            except Exception as exc:  # collected: the test reports every failure
                outcomes.append(f"{type(exc).__name__}: {exc}")
            else:
                outcomes.append(result.details.servers_opened_same_model)

    # Assert
    assert outcomes == [True] * 20


def test_the_timed_dealer_forwards_every_material_call_and_counts_its_seconds():
    # every call of the dealer interface that hands out material is timed; none is missed
    material = {
        n
        for n, f in vars(DealerClient).items()
        if callable(f) and not n.startswith("_") and n not in ("recording", "plan", "close")
    }
    assert TIMED_CALLS == material - {"mask_bound"}

    class Inner:
        def zero(self, shape, charged=True):
            time.sleep(0.002)
            return ("zero", shape, charged)

    dealer = TimedDealer(Inner())
    assert dealer.zero((2, 3), False) == ("zero", (2, 3), False)
    assert dealer.seconds >= 0.002
    with pytest.raises(AttributeError):
        dealer.plan([])  # not forwarded: the protocols never plan through it
