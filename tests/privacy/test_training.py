"""DP training runs end to end: determinism, the saved ledger, dp_scope, config errors, CLI."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
import torch
from dp_accounting import pld, rdp
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.history import HistoryStore
from fedunlearn.privacy.mechanisms import noise_multiplier
from fedunlearn.privacy.schedule import epsilon_sequence
from fedunlearn.runs import build_setup, resolve_config, run_info, train_run, wrap_privacy

BASE = {
    "seed": 5,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 4, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}
DP = {"enabled": True, "clip_norm": "auto", "epsilon_max": 3.0}


def _train(root, name, **over):
    run_dir = root / name
    train_run(parse_config({**BASE, **over}), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_runs")
    return {
        "dp": _train(root, "dp", privacy=DP),
        "dp_again": _train(root, "dp_again", privacy=DP),
        "clean": _train(root, "clean"),
        "store_only": _train(
            root,
            "store_only",
            privacy={**DP, "dp_scope": "store_only"},
            history={"policy": "fedadp", "fedadp": {"round_ratio": 1.0, "client_ratio": 1.0}},
        ),
    }


def _models(run_dir):
    with HistoryStore.open(run_dir / "history") as store:
        return [store.read_model(r) for r in store.rounds()]


@pytest.mark.slow
def test_same_config_and_seed_give_bit_identical_dp_runs(runs):
    a, b = _models(runs["dp"]), _models(runs["dp_again"])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[-1], _models(runs["clean"])[-1])  # the noise did change training


@pytest.mark.slow
def test_ledger_matches_the_schedule_and_dp_accounting_called_directly(runs):
    info = run_info(runs["dp"])
    ledger = info["privacy"]
    saved = json.loads((runs["dp"] / "privacy.json").read_text())
    assert saved == json.loads(json.dumps(ledger))
    losses = [m["clients_loss"] for m in info["metrics"]]  # rounds 0..T
    eps = epsilon_sequence(losses[:-1], 1.0, 1.0, 3.0)
    assert [r["epsilon"] for r in ledger["rounds"]] == pytest.approx(eps)
    zs = [noise_multiplier(e, 1e-5) for e in eps]
    assert [r["noise_multiplier"] for r in ledger["rounds"]] == pytest.approx(zs)
    # add/remove: sensitivity S; replace one client's data: 2S, the noise multiplier halves
    for relation, factor in (("add_remove_one", 1), ("replace_one", 2)):
        composed = dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(z / factor) for z in zs]
        )
        pld_direct = pld.PLDAccountant(value_discretization_interval=1e-3).compose(composed)
        rdp_direct = rdp.RdpAccountant().compose(composed)
        totals = ledger["totals"][relation]
        assert totals["pld_epsilon"] == pytest.approx(pld_direct.get_epsilon(1e-5), rel=1e-3)
        assert totals["rdp_epsilon"] == pytest.approx(rdp_direct.get_epsilon(1e-5), rel=1e-9)
    # the guarantee's relation is replace-one (n_c and participation are public)
    totals = ledger["totals"]["replace_one"]
    assert ledger["neighbour_relation"] == "replace_one"
    assert ledger["realised_epsilon"] == ledger["total_epsilon"] == totals["pld_epsilon"]
    assert totals["pld_epsilon"] > ledger["totals"]["add_remove_one"]["pld_epsilon"]
    assert ledger["clip_norm_source"] == "auto (pilot)"
    assert ledger["clip_norm"] > 0
    assert all(r["noise_to_signal"] > 1 for r in ledger["rounds"])


@pytest.mark.slow
def test_train_and_store_uploads_carry_the_noise(runs):
    ledger = run_info(runs["dp"])["privacy"]
    with HistoryStore.open(runs["dp"] / "history") as store:
        d = store.meta["num_params"]
        r = ledger["rounds"][-1]
        norms = [float(u.norm()) for _, u in store.iter_updates(4)]
    expected = math.sqrt(r["clip_norm"] ** 2 + d * r["noise_std"] ** 2)  # ||clip(g) + n||
    assert all(n == pytest.approx(expected, rel=0.15) for n in norms)


def test_store_only_trains_like_no_dp_and_stores_noisy_copies(runs):
    clean, store_only = _models(runs["clean"]), _models(runs["store_only"])
    assert all(torch.equal(x, y) for x, y in zip(clean, store_only, strict=True))
    with (
        HistoryStore.open(runs["clean"] / "history") as a,
        HistoryStore.open(runs["store_only"] / "history") as b,
    ):
        stored = dict(b.iter_updates(1))
        assert stored  # λ = γ = 1 with one stage: round 1 is kept
        for cid, noisy in stored.items():
            assert float((noisy - a.read_update(1, cid)).norm()) > 0.5 * float(noisy.norm())
    assert run_info(runs["store_only"])["privacy"]["protects"].startswith("stored history only")


def test_info_shows_the_privacy_ledger(runs):
    result = CliRunner().invoke(app, ["info", str(runs["dp"])], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "eps_t per round" in result.output
    assert "PLD" in result.output
    assert "mechanism client_update (eps per client and round (replace one" in result.output
    assert "replace one client's data by other data of the same size" in result.output
    assert "zCDP" in result.output
    clean = CliRunner().invoke(app, ["info", str(runs["clean"]), "--json"])
    assert json.loads(clean.output)["privacy"] == {"enabled": False, "variant": "no DP"}


@pytest.mark.parametrize(
    ("privacy", "history", "message"),
    [
        ({"enabled": True, "epsilon_min": 4.0}, {}, "epsilon_min \\(4.0\\) must not exceed"),
        ({"enabled": True, "dp_scope": "store_only"}, {}, "needs history.policy 'fedadp'"),
        ({"clip_norm": -1.0}, {}, "privacy.clip_norm"),
        ({"delta": 1.5}, {}, "privacy.delta"),
        ({"noise": 1}, {}, "privacy.noise"),
        ({}, {"fedadp": {"round_ratio": 0}}, "history.fedadp.round_ratio"),
    ],
)
def test_bad_privacy_config_names_the_field(privacy, history, message):
    # parsed by config.py, or assembled (policy options, store_only's policy) by resolve_config
    with pytest.raises(ConfigError, match=message):
        resolve_config(parse_config({"privacy": privacy, "history": history}))


@pytest.mark.parametrize("mechanism", ["client_update", "dp_sgd"])
def test_dp_training_wraps_the_federation_and_leaves_it_unchanged(mechanism):
    # Prepare
    config = resolve_config(
        parse_config({**BASE, "privacy": {**DP, "clip_norm": 1.0, "mechanism": mechanism}})
    )
    setup = build_setup(config)
    mods, training = setup.federation.update_mods, setup.federation.local_training

    # Execute
    privacy, private = wrap_privacy(config, setup)

    # Assert: the mechanism lives on a wrapper; the setup's federation is as it was built
    try:
        assert privacy is not None
        assert private.federation is not setup.federation
        assert setup.federation.update_mods == mods
        assert setup.federation.local_training is training
        if mechanism == "client_update":
            assert private.federation.update_mods == (*mods, privacy.mod)
        else:
            assert private.federation.local_training is privacy.local_training
    finally:
        private.close()
        setup.close()
