import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.attacks import (
    Trigger,
    UpdateAttack,
    backdoor_data,
    choose_malicious,
    fang_trim,
    label_flip_data,
    trim_random,
)
from fedunlearn.fl.metrics import backdoor_success_rate
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.models import build_model, get_flat_params


def test_trigger_is_a_white_patch_in_the_bottom_right_corner():
    x = torch.zeros(2, 1, 8, 8)
    out = Trigger(size=3).apply(x)
    assert out[:, :, 5:, 5:].eq(1).all()
    assert out.sum() == 2 * 9
    assert x.sum() == 0  # input untouched
    with pytest.raises(ConfigError, match="exceeds"):
        Trigger(size=9).apply(x)


def test_backdoor_relabels_only_the_chosen_fraction_of_non_target_samples():
    y = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 4)
    data = ClientData(torch.zeros(40, 1, 8, 8), y)
    out = backdoor_data(data, Trigger(2), 0, 0.5, torch.Generator().manual_seed(0))
    stamped = out.x[:, 0, -1, -1] == 1
    assert int(stamped.sum()) == 18  # half of the 36 non-target samples
    assert out.y[stamped].eq(0).all()
    assert torch.equal(out.y[~stamped], y[~stamped])
    assert not stamped[y == 0].any()


def test_label_flip_maps_l_to_complement():
    y = torch.arange(10)
    out = label_flip_data(ClientData(torch.zeros(10, 2), y), 10, 1.0, torch.Generator())
    assert torch.equal(out.y, 9 - y)


def test_trim_random_changes_about_rho_of_the_local_model():
    global_params = torch.zeros(10_000)
    upd = ClientUpdate(0, torch.full((10_000,), 0.5), 10, 0.0)
    out = trim_random(upd, global_params, torch.Generator().manual_seed(1), rho=0.1)
    changed = (out.delta != upd.delta).sum().item()
    assert 950 <= changed <= 1000


def test_fang_trim_pushes_against_the_benign_direction():
    g = torch.Generator().manual_seed(0)
    benign = torch.randn(8, 500, generator=g) * 0.1 + torch.linspace(-1, 1, 500)
    crafted = fang_trim(benign, 3, g)
    direction = benign.mean(0).sign()
    # crafted values sit outside the benign range on the opposite side of the benign mean
    assert (crafted.mean(0) * direction < benign.mean(0) * direction).all()
    lo, hi = benign.min(0).values, benign.max(0).values
    inc = direction > 0
    assert (crafted[:, inc] <= hi[inc]).all()
    assert (crafted[:, ~inc] >= lo[~inc]).all()


def test_update_attack_only_touches_malicious_clients_and_is_seeded():
    ups = [ClientUpdate(c, torch.randn(50), 10, 0.0) for c in range(5)]
    atk = UpdateAttack("fang_trim", frozenset({1, 3}), seed=7)
    a = atk(4, torch.zeros(50), ups)
    b = atk(4, torch.zeros(50), ups)
    for i in (0, 2, 4):
        assert a[i] is ups[i]
    assert not torch.equal(a[1].delta, ups[1].delta)
    assert torch.equal(a[1].delta, b[1].delta)


def test_choose_malicious_is_seeded_and_validated():
    assert choose_malicious(20, 5, 3) == choose_malicious(20, 5, 3)
    assert len(choose_malicious(20, 5, 3)) == 5
    with pytest.raises(ConfigError, match="num_malicious"):
        choose_malicious(4, 4, 0)


def test_asr_counts_triggered_non_target_inputs_classified_as_target():
    model = build_model("logreg", (1, 4, 4), 3, seed=0)
    params = torch.zeros_like(get_flat_params(model))
    # bias-only model that always predicts class 2
    params[-3:] = torch.tensor([0.0, 0.0, 5.0])
    x = torch.rand(30, 1, 4, 4)
    y = torch.tensor([0, 1, 2] * 10)
    assert backdoor_success_rate(model, params, x, y, Trigger(2), 2) == 1.0
    assert backdoor_success_rate(model, params, x, y, Trigger(2), 0) == 0.0
