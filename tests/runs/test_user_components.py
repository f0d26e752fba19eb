"""User components: model.factory / data.source in the config and objects passed to the API.

The components live outside the package (tests/support/own_components.py: a BatchNorm model and
a Gaussian-blob data source), as a user's would.
"""

import warnings

import pytest
import torch
from tests.support import own_components as own

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.history.store import HistoryStore
from fedunlearn.models import get_flat_params, load_model, save_model
from fedunlearn.runs import HISTORY_DIR, build_setup, train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.views import module_with

OWN = "tests.support.own_components"


def user_config(**training):
    return parse_config(
        {
            "seed": 3,
            "data": {"num_clients": 4, "source": f"{OWN}:load", "options": {"per_client": 32}},
            "model": {"factory": f"{OWN}:make_net", "options": {"width": 8}},
            "training": {
                "rounds": 3,
                "batch_size": 16,
                "lr": 0.1,
                "executor": "serial",
                **training,
            },
        }
    )


@pytest.mark.slow
def test_a_user_factory_trains_bit_for_bit_like_the_same_builtin_model(tmp_path):
    # Prepare: the built-in mlp (one hidden layer of 16) and a user factory building that MLP
    base = {
        "seed": 0,
        "data": {"dataset": "digits", "num_clients": 3, "max_train_samples": 300},
        "training": {"rounds": 2, "batch_size": 32},
    }
    builtin = parse_config({**base, "model": {"name": "mlp", "hidden": [16]}})
    user = parse_config({**base, "model": {"factory": f"{OWN}:make_plain"}})

    # Execute
    train_run(builtin, tmp_path / "builtin")
    summary = train_run(user, tmp_path / "user")

    # Assert: same executor, same models, round by round
    a = HistoryStore.open(tmp_path / "builtin" / HISTORY_DIR)
    b = HistoryStore.open(tmp_path / "user" / HISTORY_DIR)
    try:
        for r in range(3):
            assert torch.equal(a.read_model(r), b.read_model(r)), r
        assert "components" not in a.meta  # built-in runs record nothing new
        record = b.meta["components"]["model"]
        assert record["path"] == f"{OWN}:make_plain"
        assert len(record["source_sha256"]) == 64
    finally:
        a.close()
        b.close()
    assert summary["executor"] == "vectorized"


@pytest.mark.slow
def test_a_batchnorm_model_from_outside_trains_unlearns_verifies_and_exports(tmp_path):
    # Prepare
    from fedunlearn.eval import Verifier

    train_run(user_config(), tmp_path / "run")

    # Execute
    with UnlearnSession(tmp_path / "run") as session:
        run = session.run_view
        results = {
            m: session.run(make_method(m), UnlearnRequest.of([1]))
            for m in ("retrain", "fedrecover", "crab")
        }
        verified = Verifier(session, UnlearnRequest.of([1])).verify(results["fedrecover"])
        path = save_model(tmp_path / "m.safetensors", run.model, params=results["crab"].params)
        template = run.model
        initial, final = run.initial_params, run.final_params

    # Assert: the BatchNorm statistics are coordinates of every stored model and result
    d_trainable = sum(p.numel() for p in template.parameters())
    assert len(final) == d_trainable + 8 + 8 + 1  # running mean, var, num_batches_tracked
    assert not torch.equal(initial[d_trainable:], final[d_trainable:])  # statistics trained
    assert final[-1] == 3 * 2  # 3 rounds x 2 batches of 16 from 32 samples
    for result in results.values():
        assert result.params.shape == final.shape
        assert torch.isfinite(result.params).all()
    # the exported module is bit for bit the one the session evaluates (integer buffers are
    # rounded when written into a module: Crab's calibrated counter is not an integer)
    loaded = load_model(path, factory=own.make_net)
    evaluated = module_with(template, results["crab"].params)
    for key, value in evaluated.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(get_flat_params(loaded)[:-1], results["crab"].params[:-1])
    assert torch.equal(loaded.body[1].running_var, results["crab"].params[-9:-1])
    receipt = verified.verification
    assert receipt is not None
    assert receipt.checks
    assert receipt.verdict is not None


def test_objects_passed_to_train_run_must_be_passed_to_the_session(tmp_path):
    # Prepare
    config = parse_config(
        {"seed": 1, "data": {"num_clients": 4}, "training": {"rounds": 2, "executor": "serial"}}
    )
    data = own.load(4, 1, per_client=24)
    train_run(config, tmp_path / "run", model=own.make_net, data=data)

    # Execute / Assert: without them the run cannot be rebuilt
    with pytest.raises(ConfigError, match="trained with model .*make_net.*model=\\.\\.\\."):
        UnlearnSession(tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with UnlearnSession(tmp_path / "run", model=own.make_net, data=data) as session:
            result = session.run(make_method("retrain"), UnlearnRequest.of([2]))
    assert result.params.shape == session.run_view.final_params.shape
    changed = own.load(4, 2, per_client=24)
    with pytest.warns(
        UserWarning, match="the data passed in changed since training \\(its data\\)"
    ):
        UnlearnSession(tmp_path / "run", model=own.make_net, data=changed).close()


@pytest.mark.slow
def test_a_changed_factory_source_is_warned_about_in_one_line(tmp_path, monkeypatch):
    # Prepare: the user's package, in a directory on sys.path
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mynets.py").write_text(
        "from tests.support.own_components import make_net as make\n"
    )
    monkeypatch.syspath_prepend(str(package))
    config = user_config().model_dump()
    config["model"] = {"factory": "mynets:make", "options": {"width": 8}}
    train_run(parse_config(config), tmp_path / "run")

    # Execute: the module's source changes after training
    (package / "mynets.py").write_text(
        "from tests.support.own_components import make_net as make  # edited\n"
    )
    with pytest.warns(UserWarning) as caught:
        UnlearnSession(tmp_path / "run").close()

    # Assert
    lines = [str(w.message) for w in caught if "changed since training" in str(w.message)]
    assert len(lines) == 1
    assert "model.factory mynets:make changed since training (its source)" in lines[0]


@pytest.mark.slow
def test_a_run_whose_clients_keep_their_data_opens_with_a_factory_and_an_evaluator(tmp_path):
    # Prepare: a run, then its record marked as having no server-side data (as the Flower
    # recording wrapper writes it)
    config = user_config()
    train_run(config, tmp_path / "run")
    store = HistoryStore.open(tmp_path / "run" / HISTORY_DIR, writable=True)
    components = dict(store.meta["components"])
    components["data"] = {
        "path": None,
        "server_side": False,
        "input_shape": [6],
        "num_classes": 3,
    }
    store.update_meta({"components": components})
    store.close()
    setup = build_setup(config)  # stands for the clients, who hold the data
    seen = []

    def evaluator(module):
        seen.append(module.training)
        return {"user_metric": float(module.body[1].running_mean.abs().sum())}

    # Execute
    with UnlearnSession(tmp_path / "run", evaluator=evaluator) as session:
        with pytest.raises(ConfigError, match="pass clients="):
            session.run(make_method("retrain"), UnlearnRequest.of([1]))
        with pytest.raises(ConfigError, match="data stays on its clients"):
            session.evaluation.clean_data(1)
        result = session.run(
            make_method("retrain"), UnlearnRequest.of([1]), clients=setup.federation
        )
        metrics = session.evaluation.evaluate(result.params)
    setup.close()

    # Assert
    assert session.federation is None
    assert set(metrics) == {"user_metric"}
    assert metrics["user_metric"] > 0
    assert seen
    assert not any(seen)


BAD = [
    (
        {"model": {"factory": "no_such_pkg.nets:make"}},
        "model.factory 'no_such_pkg.nets:make' cannot be loaded: ModuleNotFoundError",
    ),
    (
        {"model": {"factory": f"{OWN}:nope"}},
        f"model.factory '{OWN}:nope': module {OWN} has no 'nope'",
    ),
    ({"model": {"factory": f"{OWN}:NOT_CALLABLE"}}, "is a int, not a function"),
    (
        {"model": {"factory": f"{OWN}:raises"}},
        f"model.factory '{OWN}:raises' raised RuntimeError: no GPU kernels",
    ),
    ({"model": {"factory": f"{OWN}:not_a_module"}}, "returned int, not a torch.nn.Module"),
    (
        {"model": {"factory": f"{OWN}:wrong_classes"}},
        "output on 2 inputs has shape \\(2, 5\\); the data has 3 classes",
    ),
    (
        {"data": {"source": f"{OWN}:wrong_ids"}},
        "returned clients 1..4 \\(4 of them\\); data.num_clients is 4, so it must return "
        "clients 0..3",
    ),
    (
        {"data": {"source": f"{OWN}:wrong_shapes"}},
        "client 1: examples have shape \\(4,\\); the federation's input shape is \\(6,\\)",
    ),
    (
        {"data": {"source": f"{OWN}:wrong_type"}},
        "returned list; return a fedunlearn.data.FederatedData or a mapping",
    ),
    (
        {"data": {"source": f"{OWN}:string_labels"}},
        "test set y has dtype torch.float32; labels must be integers",
    ),
    (
        {"data": {"source": "nope"}},
        "neither 'pkg.module:function' nor a name registered under the entry-point group "
        "'fedunlearn.datasets'",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_components_fail_in_one_line_before_training(tmp_path, change, message):
    # Prepare
    config = user_config().model_dump()
    for section, values in change.items():
        config[section] = {**config[section], **values}
        if section == "model":
            config["model"].pop("options")

    # Execute
    with pytest.raises(ConfigError, match=message) as err:
        train_run(parse_config(config), tmp_path / "run")

    # Assert: one line, nothing trained
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "config.yaml").exists()


def _plus_100(x):
    return x + 100.0


def test_a_user_trigger_function_poisons_the_backdoor_clients_and_the_checks(tmp_path):
    # Prepare: the user's data brings its own trigger (x -> x + 100); a backdoor attack on 1 client
    data = own.load(4, 3, per_client=32)
    data["trigger"] = _plus_100
    config = parse_config(
        {
            "seed": 3,
            "data": {"num_clients": 4},
            "attack": {"kind": "backdoor", "num_malicious": 1, "target_label": 0},
            "model": {"factory": f"{OWN}:make_net", "options": {"width": 8}},
            "training": {"rounds": 1, "batch_size": 16, "executor": "serial"},
        }
    )
    # Act: assemble the run (before the fix: AttributeError, a function has no .apply)
    setup = build_setup(config, data=data)
    # Assert: the malicious client's poisoned samples carry the user's trigger, relabelled to 0
    (cid,) = setup.poisoned_originals
    poisoned = setup.federation.client_data[cid]
    stamped = (poisoned.x > 50).all(dim=1)
    assert int(stamped.sum()) > 0
    assert torch.equal(poisoned.y[stamped], torch.zeros(int(stamped.sum()), dtype=torch.int64))
    # and the backdoor check applies the same function
    x = torch.zeros(2, 6)
    assert torch.equal(setup.trigger.apply(x), x + 100.0)
    assert "backdoor_asr" in setup.evaluate(setup.initial_params)
