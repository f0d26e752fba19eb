import json
import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from fedunlearn.data import load_dataset
from fedunlearn.errors import ConfigError
from fedunlearn.eval.mia import (
    AttackSpec,
    MIAResult,
    ShadowAttack,
    ShadowSpec,
    attack_features,
    calibrate_loss_threshold,
    loss_threshold_attack,
)
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.metrics import accuracy_and_loss
from fedunlearn.fl.records import ClientData
from fedunlearn.models import build_model, get_flat_params

# Training recipe shared by the target and the shadow models: 30 digits memorised.
TRAINING = LocalTrainingSpec(epochs=300, lr=0.5, batch_size=25)
SHADOWS = ShadowSpec(num_shadows=4, training=TRAINING)


@dataclass(frozen=True)
class Split:
    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class Overfitted:
    model: nn.Module
    params: torch.Tensor
    members: Split  # the 30 training samples
    nonmembers: Split  # 200 held-out samples
    shadow_pool: Split  # 60 held-out samples: shadows train on 30, like the target
    unseen_a: Split  # two more disjoint held-out sets: 500 training-split samples,
    unseen_b: Split  # and the 449 samples of the test split


@pytest.fixture(scope="module")
def overfitted() -> Overfitted:
    ds = load_dataset("digits", seed=0)
    x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cuts = [0, 30, 230, 290, 790]
    parts = [Split(x[perm[a:b]], y[perm[a:b]]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    parts.append(Split(torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)))
    model = build_model("mlp", ds.input_shape, ds.num_classes, seed=0, hidden=(64,))
    start = get_flat_params(model)
    members = parts[0]
    params = start + local_update(model, start, ClientData(members.x, members.y), TRAINING, 1).delta
    return Overfitted(model, params, *parts)


@pytest.fixture(scope="module")
def shadow_attack(overfitted: Overfitted) -> ShadowAttack:
    pool = overfitted.shadow_pool
    return ShadowAttack.fit(overfitted.model, pool.x, pool.y, SHADOWS, seed=0)


def test_the_fixture_model_is_overfitted(overfitted):
    m = overfitted
    train_acc, train_loss = accuracy_and_loss(m.model, m.params, m.members.x, m.members.y)
    _, test_loss = accuracy_and_loss(m.model, m.params, m.nonmembers.x, m.nonmembers.y)

    assert train_acc == 1.0
    assert train_loss < 0.02 < 0.2 < test_loss


def test_loss_attack_detects_members_of_an_overfitted_model(overfitted):
    m = overfitted

    result = loss_threshold_attack(
        m.model, m.params, m.members.x, m.members.y, m.nonmembers.x, m.nonmembers.y
    )

    assert result.auc > 0.7
    assert result.member_rate > result.nonmember_rate + 0.2
    assert result.precision > 0.6
    assert (result.num_members, result.num_nonmembers) == (15, 100)  # the non-calibration half


def test_loss_attack_is_at_chance_on_unseen_data(overfitted):
    m = overfitted

    result = loss_threshold_attack(
        m.model, m.params, m.unseen_a.x, m.unseen_a.y, m.unseen_b.x, m.unseen_b.y
    )

    assert 0.4 < result.auc < 0.6


@pytest.mark.slow
def test_shadow_attack_detects_members_of_an_overfitted_model(overfitted, shadow_attack):
    m = overfitted

    result = shadow_attack.evaluate(
        m.params, m.members.x, m.members.y, m.nonmembers.x, m.nonmembers.y
    )

    assert result.attack == "shadow"
    assert result.auc > 0.7
    assert result.member_rate > result.nonmember_rate + 0.2
    assert result.recall == result.member_rate
    assert (result.num_members, result.num_nonmembers) == (30, 200)
    assert shadow_attack.num_training_samples == SHADOWS.num_shadows * 60


@pytest.mark.slow
def test_shadow_attack_is_at_chance_on_unseen_data(overfitted, shadow_attack):
    m = overfitted

    result = shadow_attack.evaluate(
        m.params, m.unseen_a.x, m.unseen_a.y, m.unseen_b.x, m.unseen_b.y
    )

    assert 0.4 < result.auc < 0.6
    assert abs(result.member_rate - result.nonmember_rate) < 0.1


@pytest.mark.slow
def test_shadow_attack_same_seed_same_result_and_inputs_untouched(overfitted, shadow_attack):
    m = overfitted
    params_before = m.params.clone()
    template_before = get_flat_params(m.model)
    pool = m.shadow_pool

    again = ShadowAttack.fit(m.model, pool.x, pool.y, SHADOWS, seed=0)
    args = (m.params, m.members.x, m.members.y, m.nonmembers.x, m.nonmembers.y)

    assert again.evaluate(*args) == shadow_attack.evaluate(*args)
    assert torch.equal(m.params, params_before)
    assert torch.equal(get_flat_params(m.model), template_before)


def test_loss_attack_same_seed_same_split(overfitted):
    m = overfitted
    args = (m.model, m.params, m.members.x, m.members.y, m.nonmembers.x, m.nonmembers.y)

    assert loss_threshold_attack(*args, seed=3) == loss_threshold_attack(*args, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "attack", [AttackSpec(classifier="gboost"), AttackSpec(per_class=True)], ids=str
)
def test_other_attack_models_detect_members_and_not_unseen_data(overfitted, attack):
    m = overfitted
    spec = ShadowSpec(num_shadows=4, training=TRAINING, attack=attack)

    fitted = ShadowAttack.fit(m.model, m.shadow_pool.x, m.shadow_pool.y, spec, seed=1)
    seen = fitted.evaluate(m.params, m.members.x, m.members.y, m.nonmembers.x, m.nonmembers.y)
    unseen = fitted.evaluate(m.params, m.unseen_a.x, m.unseen_a.y, m.unseen_b.x, m.unseen_b.y)

    assert bool(fitted.class_classifiers) == attack.per_class  # labels with enough rows
    assert seen.auc > 0.7
    assert seen.member_rate > seen.nonmember_rate + 0.2
    assert 0.4 < unseen.auc < 0.6


def test_reference_attack_transfers_to_held_out_members(overfitted):
    m = overfitted
    spec = AttackSpec(top_k=3)
    attack = ShadowAttack.fit_reference(
        m.model,
        m.params,
        m.members.x[:15],
        m.members.y[:15],
        m.nonmembers.x[:100],
        m.nonmembers.y[:100],
        spec,
        seed=0,
    )

    result = attack.evaluate(
        m.params, m.members.x[15:], m.members.y[15:], m.nonmembers.x[100:], m.nonmembers.y[100:]
    )

    assert result.attack == "reference"
    assert result.auc > 0.7
    assert result.member_rate > result.nonmember_rate


def _identity_logreg() -> tuple[nn.Module, torch.Tensor]:
    model = build_model("logreg", (2,), 2, seed=0)
    return model, torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # logits = x


def test_fixed_threshold_result_matches_hand_count():
    model, params = _identity_logreg()
    # losses: members 0.0067, 0.0067, log 2; non-members log 2, 5.0067
    members_x, members_y = (
        torch.tensor([[5.0, 0.0], [0.0, 5.0], [0.0, 0.0]]),
        torch.tensor([0, 1, 1]),
    )
    nonmembers_x, nonmembers_y = torch.tensor([[0.0, 0.0], [5.0, 0.0]]), torch.tensor([0, 1])

    result = loss_threshold_attack(
        model, params, members_x, members_y, nonmembers_x, nonmembers_y, threshold=0.5
    )

    assert result == MIAResult(
        attack="loss_threshold",
        member_rate=2 / 3,
        nonmember_rate=0.0,
        auc=11 / 12,  # 5 wins and one tie (log 2 against log 2) among 6 pairs
        precision=1.0,
        recall=2 / 3,
        balanced_accuracy=(2 / 3 + 1) / 2,
        threshold=0.5,
        num_members=3,
        num_nonmembers=2,
    )
    assert json.loads(json.dumps(result.to_dict())) == result.to_dict()


def test_calibrated_threshold_separates_separable_losses():
    model, params = _identity_logreg()
    members_x = torch.tensor([[4.0, 0.0], [0.0, 6.0], [3.0, 0.0]])
    members_y = torch.tensor([0, 1, 0])
    nonmembers_x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    nonmembers_y = torch.tensor([0, 1, 0])

    threshold = calibrate_loss_threshold(
        model, params, members_x, members_y, nonmembers_x, nonmembers_y
    )
    result = loss_threshold_attack(
        model, params, members_x, members_y, nonmembers_x, nonmembers_y, threshold=threshold
    )

    assert -math.log(torch.sigmoid(torch.tensor(3.0)).item()) == pytest.approx(threshold)
    assert (result.member_rate, result.nonmember_rate, result.auc) == (1.0, 0.0, 1.0)


def test_no_member_predicted_gives_nan_precision():
    model, params = _identity_logreg()
    x, y = torch.tensor([[0.0, 0.0]]), torch.tensor([0])

    result = loss_threshold_attack(model, params, x, y, x, y, threshold=0.1)

    assert result.member_rate == 0.0
    assert math.isnan(result.precision)


def test_attack_features_are_sorted_probabilities_then_loss():
    model, params = _identity_logreg()

    features = attack_features(
        model, params, torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([0])
    )

    assert features.shape == (1, 3)
    assert features[0].tolist() == pytest.approx([0.75, 0.25, math.log(4.0)])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ShadowSpec(num_shadows=0), "num_shadows"),
        (lambda: ShadowSpec(num_shadows=10_000), "num_shadows"),
        (lambda: ShadowSpec(num_shadows=2.5), "num_shadows"),
        (lambda: ShadowSpec(in_fraction=1.0), "in_fraction"),
        (lambda: ShadowSpec(training=LocalTrainingSpec(epochs=0)), "epochs >= 1"),
        (lambda: ShadowSpec(attack="logreg"), "AttackSpec"),
        (lambda: AttackSpec(classifier="xgboost"), "logreg, gboost"),
        (lambda: AttackSpec(top_k=0), "top_k"),
        (lambda: AttackSpec(top_k=True), "top_k"),
        (lambda: AttackSpec(per_class=1), "per_class"),
    ],
)
def test_invalid_hyperparameters_raise_config_error(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_invalid_attack_inputs_raise_config_error():
    model, params = _identity_logreg()
    x, y = torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([0, 1])

    with pytest.raises(ConfigError, match="calibration_fraction"):
        loss_threshold_attack(model, params, x, y, x, y, calibration_fraction=1.0)
    with pytest.raises(ConfigError, match="finite"):
        loss_threshold_attack(model, params, x, y, x, y, threshold=math.nan)
    with pytest.raises(ConfigError, match="cannot be split"):
        loss_threshold_attack(model, params, x[:1], y[:1], x, y)
    with pytest.raises(ConfigError, match="no samples"):
        loss_threshold_attack(model, params, x[:0], y[:0], x, y, threshold=1.0)
    with pytest.raises(ConfigError, match="shapes"):
        loss_threshold_attack(model, params, x, y[:1], x, y, threshold=1.0)
    with pytest.raises(ConfigError, match=r"0\.\.1"):
        loss_threshold_attack(model, params, x, torch.tensor([0, 2]), x, y, threshold=1.0)
    with pytest.raises(ConfigError, match="exceeds"):
        ShadowAttack.fit_reference(model, params, x, y, x, y, AttackSpec(top_k=3), seed=0)
    with pytest.raises(ConfigError, match="cannot be split"):
        ShadowAttack.fit(model, x[:1], y[:1], ShadowSpec(num_shadows=1), seed=0)
