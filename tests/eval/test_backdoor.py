import math

import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.backdoor import backdoor_success_rate, client_backdoor_success_rate
from fedunlearn.fl import metrics
from fedunlearn.fl.attacks import Trigger
from fedunlearn.fl.records import ClientData
from fedunlearn.models import build_model

TRIGGER = Trigger(size=1, value=1.0)  # stamps pixel (3, 3) of a 4x4 image


def _trigger_detector():
    """Logreg on 1x4x4 images: class 0 fires on pixel (3, 3) unless pixel (3, 2) is -1."""
    model = build_model("logreg", (1, 4, 4), 3, seed=0)
    weight = torch.zeros(3, 16)
    weight[0, 15] = 10.0  # the trigger pixel
    weight[0, 14] = 20.0  # a negative value here blocks the backdoor
    bias = torch.tensor([0.0, 1.0, 0.5])  # clean images: class 1
    return model, torch.cat([weight.flatten(), bias])


def _client(blocker: list[float], labels: list[int]) -> ClientData:
    x = torch.zeros(len(labels), 1, 4, 4)
    x[:, 0, 3, 2] = torch.tensor(blocker)
    return ClientData(x, torch.tensor(labels))


def test_client_asr_counts_triggered_non_target_samples():
    model, params = _trigger_detector()
    client = _client([0.0, -1.0, -1.0, 0.0], [1, 2, 1, 0])  # sample 3 is target class: skipped

    assert client_backdoor_success_rate(model, params, [client], TRIGGER, 0) == pytest.approx(1 / 3)


def test_client_asr_with_poisoned_copies_counts_only_poisoned_samples():
    model, params = _trigger_detector()
    clean = _client([0.0, -1.0, -1.0, 0.0], [1, 2, 1, 0])
    only_first = ClientData(TRIGGER.apply(clean.x), torch.tensor([0, 2, 1, 0]))
    only_second = ClientData(clean.x, torch.tensor([1, 0, 1, 0]))

    assert (
        client_backdoor_success_rate(model, params, [clean], TRIGGER, 0, poisoned=[only_first]) == 1
    )
    assert (
        client_backdoor_success_rate(model, params, [clean], TRIGGER, 0, poisoned=[only_second])
        == 0
    )


def test_client_asr_pools_clients_and_matches_the_test_set_asr():
    model, params = _trigger_detector()
    a = _client([0.0, -1.0], [1, 2])
    b = _client([0.0, 0.0, -1.0], [2, 0, 1])
    pooled_x, pooled_y = torch.cat([a.x, b.x]), torch.cat([a.y, b.y])

    rate = client_backdoor_success_rate(model, params, [a, b], TRIGGER, 0)

    assert rate == 0.5
    assert rate == metrics.backdoor_success_rate(model, params, pooled_x, pooled_y, TRIGGER, 0)
    assert backdoor_success_rate is metrics.backdoor_success_rate


def test_client_asr_is_nan_without_qualifying_samples():
    model, params = _trigger_detector()
    all_target = _client([0.0, 0.0], [0, 0])

    assert math.isnan(client_backdoor_success_rate(model, params, [all_target], TRIGGER, 0))


def test_client_asr_rejects_misaligned_inputs():
    model, params = _trigger_detector()
    clean = _client([0.0, 0.0], [1, 2])

    with pytest.raises(ConfigError, match="at least one"):
        client_backdoor_success_rate(model, params, [], TRIGGER, 0)
    with pytest.raises(ConfigError, match="2 clients"):
        client_backdoor_success_rate(model, params, [clean], TRIGGER, 0, poisoned=[clean, clean])
    with pytest.raises(ConfigError, match="same samples"):
        short = _client([0.0], [1])
        client_backdoor_success_rate(model, params, [clean], TRIGGER, 0, poisoned=[short])
