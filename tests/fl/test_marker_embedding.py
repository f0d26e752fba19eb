"""Participation markers: derivation from the client's secret seed, marked copies, config."""

import pytest
import torch

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError
from fedunlearn.fl.markers import make_marker, mark_data
from fedunlearn.fl.records import ClientData
from fedunlearn.runs import build_setup


def marker(seed=7, samples=5):
    return make_marker(0, seed, (1, 8, 8), 10, num_pixels=6, value=1.0, num_samples=samples)


def test_the_same_secret_seed_gives_the_same_marker_and_another_seed_another():
    assert marker(7) == marker(7)
    assert marker(7).pixels != marker(8).pixels


def test_mark_data_appends_marked_copies_with_the_target_and_keeps_the_samples():
    x = torch.zeros(12, 1, 8, 8)
    y = torch.arange(12) % 10
    m = marker(samples=5)
    marked = mark_data(ClientData(x, y), m)
    assert len(marked) == 17
    assert torch.equal(marked.x[:12], x)
    assert torch.equal(marked.y[:12], y)
    assert bool((marked.y[12:] == m.target_label).all())
    flat = marked.x[12:].reshape(5, -1)
    assert bool((flat[:, list(m.pixels)] == 1.0).all())
    assert float(flat.sum()) == 5 * len(m.pixels)  # nothing else stamped


def test_decoys_are_other_patterns_of_the_same_size_and_target():
    m = marker()
    decoys = m.decoys(4, 64)
    assert len({d.pixels for d in decoys} | {m.pixels}) == 5
    assert all(len(d.pixels) == 6 and d.target_label == m.target_label for d in decoys)


def test_markers_need_images_and_a_pattern_that_fits():
    with pytest.raises(ConfigError, match="image inputs"):
        make_marker(0, 1, (20,), 4, num_pixels=3, value=1.0, num_samples=2)
    with pytest.raises(ConfigError, match="does not fit"):
        make_marker(0, 1, (1, 4, 4), 4, num_pixels=9, value=1.0, num_samples=2)


def test_config_rejects_marked_clients_outside_the_federation():
    with pytest.raises(ValueError, match="outside 0..9"):
        RunConfig.model_validate(
            {
                "data": {"dataset": "digits", "num_clients": 10},
                "verification": {"markers": {"clients": [10]}},
            }
        )
    with pytest.raises(ValueError, match="not in markers.clients"):
        RunConfig.model_validate({"verification": {"markers": {"clients": [0], "seeds": {1: 3}}}})


def test_setup_adds_the_marked_copies_and_keeps_clean_data_and_other_clients_unchanged():
    base = {
        "data": {"dataset": "digits", "num_clients": 4},
        "model": {"name": "logreg"},
        "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    }
    plain = build_setup(RunConfig.model_validate(base))
    attacker = next(iter(plain.federation.malicious))
    honest = 0 if attacker != 0 else 1
    marked = build_setup(
        RunConfig.model_validate(
            {**base, "verification": {"markers": {"clients": [honest, attacker], "samples": 7}}}
        )
    )
    try:
        for cid in plain.federation.client_ids:
            before = plain.federation.client_data[cid]
            after = marked.federation.client_data[cid]
            extra = 7 if cid in (honest, attacker) else 0
            assert len(after) == len(before) + extra
            assert torch.equal(after.x[: len(before)], before.x)
            assert torch.equal(marked.clean_data(cid).x, plain.clean_data(cid).x)
        # the attacker's honest copy (trained on before attack.start_round) carries the marker too
        assert len(marked.poisoned_originals[attacker]) == len(plain.clean_data(attacker)) + 7
        assert set(marked.markers) == {honest, attacker}
        assert plain.markers == {}
    finally:
        plain.close()
        marked.close()


def test_markers_embed_into_a_users_own_data_object():
    """A user's data source (FederatedData / plain mapping) has no x_train: markers still work."""
    g = torch.Generator().manual_seed(0)
    clients = {c: (torch.rand(30, 1, 8, 8, generator=g), torch.arange(30) % 10) for c in range(3)}
    test = (torch.rand(20, 1, 8, 8, generator=g), torch.arange(20) % 10)
    data = {"clients": clients, "test": test}
    config = RunConfig.model_validate(
        {
            "data": {"num_clients": 3},
            "model": {"name": "mlp", "hidden": [8]},
            "verification": {"markers": {"clients": [1], "samples": 4, "pixels": 6}},
        }
    )
    setup = build_setup(config, data=data)
    try:
        assert len(setup.federation.client_data[1]) == 34  # 30 own + 4 marked copies
        assert len(setup.clean_data(1)) == 30
        assert 1 in setup.markers
    finally:
        setup.close()
