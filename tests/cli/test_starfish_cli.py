"""``fedunlearn starfish-*`` commands (the processes themselves: tests/unlearn/starfish)."""

import pytest
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.cli.starfish import starfish_method
from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.starfish.deploy.launcher import option_params
from fedunlearn.unlearn.starfish.deploy.shares import share_meta, share_store_dir

runner = CliRunner()
RUN = {
    "seed": 7,
    "data": {
        "dataset": "synthetic",
        "num_clients": 5,
        "partition": "dirichlet",
        "alpha": 0.5,
        "options": {"num_samples": 400, "num_features": 10, "num_classes": 3},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": 10,
        "local_epochs": 2,
        "lr": 0.05,
        "batch_size": 40,
        "weight_decay": 1e-3,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("starfish_cli") / "run"
    train_run(parse_config(RUN), path)
    return path


def test_share_command_writes_both_stores_once(run_dir):
    res = runner.invoke(app, ["starfish-share", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output or "kept existing" in res.output
    res = runner.invoke(app, ["starfish-share", str(run_dir)])
    assert res.exit_code == 0 and "kept existing" in res.output


def test_server_rejects_a_bad_address_before_any_work(run_dir):
    args = ["starfish-server", "--party", "1", "--run", str(run_dir), "--forget", "0",
            "--peer", "localhost", "--dealer", "127.0.0.1:1",
            "--clients", "127.0.0.1:1"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "HOST:PORT" in res.output


def test_launcher_options_reach_the_server_command_unchanged():
    # Prepare: options of both kinds, values YAML reads back only when written carefully
    options = {
        "selection_rate": 0.75,
        "round_selection": "method2",
        "unlearning_rate": 1e-05,
        "warmup_rounds": None,
        "frac_bits": 13,
        "mpc_seed": None,
        "norm_range": (1e-4, 1e4),
        "record_models": True,
    }
    method = make_method("starfish", options)

    # Execute: what run_local passes as --param, parsed as starfish-server parses it
    child = starfish_method(option_params(method))

    # Assert: the same algorithm and execution, on the 2PC backend
    assert child.params == method.params
    assert child.execution == method.execution.model_copy(update={"backend": "mpc"})
    assert sorted(item.partition("=")[0] for item in option_params(method)) == sorted(options)


def test_share_command_records_the_execution_options_of_its_params(run_dir):
    res = runner.invoke(app, ["starfish-share", str(run_dir), "--force", "--param", "frac_bits=13"])
    assert res.exit_code == 0, res.output
    with HistoryStore.open(share_store_dir(run_dir, 1)) as store:
        assert share_meta(store)["frac_bits"] == 13
