"""The steps' ring ranges: 2PC equals the plaintext mirror or stops naming the step, never wrong."""

import numpy as np
import pytest
import torch
from starfish_support import two_party

from fedunlearn.errors import ConfigError, SecureComputationError
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import FixedPoint
from fedunlearn.unlearn.starfish.backend.mpc import MpcBackend
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.backend.ranges import RingRangeError, StepRanges
from fedunlearn.unlearn.starfish.deploy.shares import share_history
from fedunlearn.unlearn.starfish.steps import (
    StageOneRecord,
    check_thresholds,
    select_rounds,
    thresholds_td2,
)

F16 = FixedPoint(16)
ROUNDS, CLIENTS, PARAMS = 5, 3, 24
NORM_RANGE = (1e-3, 3e4)  # hi^2 < 2^30: SecGE2's products fit at f = 16


class ScaledHistory:
    """A recorded run's reads (updates and models) with every update scaled by ``factor``."""

    def __init__(self, factor, seed=0):
        gen = np.random.default_rng(seed)
        self.updates = {
            (r, c): factor * gen.normal(scale=0.2, size=PARAMS)
            for r in range(1, ROUNDS + 1)
            for c in range(CLIENTS)
        }
        models = [np.zeros(PARAMS)]
        for r in range(1, ROUNDS + 1):
            models.append(models[-1] + np.mean([self.updates[r, c] for c in range(CLIENTS)], 0))
        self.models = models

    def read_update(self, round_, client_id):
        return torch.from_numpy(self.updates[round_, client_id].copy())

    def read_model(self, round_):
        return torch.from_numpy(self.models[round_].copy())


def pipeline(backend, history, norm_range=NORM_RANGE):
    """TD^2, SecRS Method 1 (target 0) and SecTC on the stored updates, as the loop runs them."""
    record = StageOneRecord(history, backend, scale=-1.0, alpha=0.3)  # type: ignore[arg-type]
    remaining = {c: list(range(1, ROUNDS + 1)) for c in (1, 2)}
    thresholds = thresholds_td2(backend, record, remaining)
    targets = {r: [0] for r in range(1, ROUNDS + 1)}
    rounds = select_rounds(backend, record, history.read_model, targets, 3, "method1", norm_range)
    estimates = {c: record.update(ROUNDS, c) for c in (1, 2)}
    return rounds, check_thresholds(backend, estimates, thresholds)


def secure_pipeline(history, norm_range=NORM_RANGE):
    def program(party):
        backend = MpcBackend(party, client_seed=5, norm_range=norm_range)
        return pipeline(backend, history, norm_range)

    return two_party(program, fixed_point=F16)[0]


@pytest.mark.parametrize("factor", [10.0, 1e3, 1e5])
def test_scaled_updates_give_the_mirror_result_or_an_error_naming_the_step(factor):
    history = ScaledHistory(factor)
    plain = pipeline(PlainBackend(), history)
    try:
        secure = secure_pipeline(history)
    except (RingRangeError, SecureComputationError) as err:
        assert factor == 1e5  # 10 and 1e3 fit every step and must run
        assert any(step in str(err) for step in ("TD^2", "SecTC", "SecRS"))
        assert "e+" not in str(err).split("f = 16")[0]  # no value of the data before the bound
        return
    assert secure == plain


def test_a_coordinate_above_the_square_headroom_is_refused_not_misflagged():
    # the original defect: at f = 16 a coordinate >= 46,341 squares past 2^63 and SecTC's bit
    # came out wrong (here: a clear exceedance of the threshold read as "not flagged")
    big = np.zeros(4)
    big[2] = 50_000.0
    plain = PlainBackend()
    expected = check_thresholds(
        plain, {0: plain.share(torch.tensor(big))}, {0: plain.share(torch.tensor(1.0))}
    )
    assert expected == {0: True}

    def program(party):
        be = MpcBackend(party, client_seed=1)
        return check_thresholds(
            be, {0: be.share(torch.tensor(big))}, {0: be.share(torch.tensor(1.0))}
        )

    with pytest.raises(RingRangeError, match=r"TD\^2 and SecTC") as caught:
        two_party(program, fixed_point=F16)
    assert "50000" not in str(caught.value)
    assert "5e+04" not in str(caught.value)


def test_method1_norms_outside_the_declared_range_stop_in_2pc():
    # target norms ~7e4 made SecGE2's products wrap (a wrong ranking, exit 0); the ring check
    # refuses them at the client, and the declared norm_range is checked securely in 2PC
    u = np.array([0.9, 0.1, 0.5]) * 7e4
    v = np.array([1.0, 1.0, 1.0]) * 7e4

    def shared_norms(party):
        be = MpcBackend(party, client_seed=1)
        return be.top_k(
            {"u": be.share(torch.tensor(u)), "v": be.share(torch.tensor(v))}, "ratio", 3, "t"
        )

    with pytest.raises(RingRangeError):
        two_party(shared_norms, fixed_point=F16)

    def declared(party):  # in range of the ring, outside the declared norm_range
        be = MpcBackend(party, client_seed=1, norm_range=(1e-3, 10.0))
        be.check_range(be.share(torch.tensor([1.0, 20.0])), (1e-3, 10.0), "SecRS method1")

    with pytest.raises(SecureComputationError, match="SecRS method1"):
        two_party(declared, fixed_point=F16)


def test_a_declared_range_whose_products_cannot_fit_is_refused_naming_the_method():
    StepRanges(16, (1e-3, 1e3)).check_selection("method1")  # 1e6 < 2^30
    with pytest.raises(ConfigError, match="SecRS alt_method1"):
        StepRanges(16, (1e-3, 1e3)).check_selection("alt_method1")  # 1e12 > 2^30
    with pytest.raises(ConfigError, match="SecRS method1"):
        StepRanges(24, (1e-3, 1e3)).check_selection("method1")  # 1e6 > 2^14
    assert StepRanges(16).coordinate_bound == 2.0**15
    assert StepRanges(13).coordinate_bound == 2.0**18


def test_the_client_norm_is_checked_against_the_declared_range():
    ranges = StepRanges(16, (1e-3, 10.0))
    ranges.check_norm(5.0)
    for norm in (20.0, 1e-4):
        with pytest.raises(RingRangeError, match="declared norm_range"):
            ranges.check_norm(norm)


def test_an_encoding_error_never_carries_the_value():
    with pytest.raises(SecureComputationError) as caught:
        F16.encode(np.array([0.5, 1.9997e14]))
    text = str(caught.value)
    assert "1.9997" not in text
    assert "199970000000000" not in text
    assert "1 of 2 values" in text


def test_the_stage_one_sharing_refuses_updates_outside_the_ring_range(convex_run, tmp_path):
    # the deployment's clients side: gradients G = -delta / lr at lr = 1e-9 are ~1e7, far past
    # 2^15 at f = 16 (before: shared, then squared and compared past the ring's end)
    with HistoryStore.open(convex_run / "history") as plain:
        with pytest.raises(RingRangeError, match=r"TD\^2 and SecTC") as caught:
            share_history(plain, [tmp_path / "s0", tmp_path / "s1"], lr=1e-9, frac_bits=16)
        assert "e+0" not in str(caught.value).split("2^15")[0]
        share_history(plain, [tmp_path / "t0", tmp_path / "t1"], lr=0.05, frac_bits=16)


# ---- the bound's inequality is the code's (issue 41) ---------------------------------------------


@pytest.mark.parametrize("frac_bits", [13, 16, 20])
def test_every_accepted_value_squares_to_strictly_below_2_to_the_62_in_ring_units(frac_bits):
    # before: a value just inside 2^(31 - f) was accepted and rounded to 2^31 ring units, whose
    # square is exactly 2^62 (the docs said "below 2^62")
    ranges = StepRanges(frac_bits)
    bound = ranges.coordinate_bound
    unit = 2.0**-frac_bits
    just_inside = [bound - unit / 4, -(bound - unit / 4), bound - unit / 2]  # round to 2^31
    accepted = [bound - unit, -(bound - unit), bound - 3 * unit / 4]  # round to 2^31 - 1
    for value in just_inside:
        with pytest.raises(RingRangeError, match="round to"):
            ranges.check_client_values([value])
    ranges.check_client_values(accepted)
    fp = FixedPoint(frac_bits)
    for value in accepted:
        units = abs(int(fp.encode(np.array([value])).view(np.int64)[0]))
        assert units == 2**31 - 1
        assert units * units < 2**62
    with pytest.raises(RingRangeError):
        ranges.check_norm(bound - unit / 4)
