"""``fedunlearn starfish-*`` commands (the processes themselves: tests/unlearn/starfish)."""

import os
import stat

import pytest
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import ROLES, Identity
from fedunlearn.runs import train_run
from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.starfish.cli import starfish_method
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
    assert res.exit_code == 0
    assert "kept existing" in res.output


def test_server_rejects_a_bad_address_before_any_work(run_dir):
    args = ["starfish-server", "--party", "1", "--run", str(run_dir), "--forget", "0",
            "--session", "s-1", "--peer", "localhost", "--dealer", "127.0.0.1:1",
            "--clients", "127.0.0.1:1", "--insecure"]  # fmt: skip
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


def flat(text):
    """Help text without rich's box drawing and line breaks."""
    return " ".join(text.replace("│", " ").split())


def test_certs_command_makes_a_ca_and_one_certificate_per_role(tmp_path):
    # Execute
    made = runner.invoke(app, ["starfish-certs", str(tmp_path / "pki"), "--hosts", "127.0.0.1"])
    again = runner.invoke(app, ["starfish-certs", str(tmp_path / "pki")])
    first_ca = (tmp_path / "pki" / "ca.pem").read_bytes()
    replaced = runner.invoke(app, ["starfish-certs", str(tmp_path / "pki"), "--overwrite"])

    # Assert: each role's certificate binds that role, keys are private, no silent overwrite
    assert made.exit_code == 0, made.output
    for role in ROLES:
        assert Identity.from_directory(tmp_path / "pki", role).role == role
        mode = (tmp_path / "pki" / f"{role}.key").stat().st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, oct(mode)
    assert again.exit_code == 2
    assert "already holds a CA" in again.output
    assert replaced.exit_code == 0
    assert (tmp_path / "pki" / "ca.pem").read_bytes() != first_ca


@pytest.mark.parametrize(
    "command", ["starfish-dealer", "starfish-clients", "starfish-server", "starfish-local"]
)
def test_insecure_is_an_explicit_flag_whose_help_says_what_it_gives_up(command):
    res = runner.invoke(app, [command, "--help"])
    text = flat(res.output)
    assert res.exit_code == 0
    assert "--insecure" in text
    assert "--no-insecure" not in text
    assert "Gives up: peer authentication" in text
    assert "encryption" in text


def test_a_process_needs_tls_of_its_own_role_or_an_explicit_insecure_flag(tmp_path):
    # Prepare
    pki = tmp_path / "pki"
    assert runner.invoke(app, ["starfish-certs", str(pki)]).exit_code == 0
    dealer = ["starfish-dealer", "--timeout", "0.3"]
    server0 = [f"--tls-ca={pki / 'ca.pem'}", f"--tls-cert={pki / 'server0.pem'}",
               f"--tls-key={pki / 'server0.key'}"]  # fmt: skip

    # Execute
    nothing = runner.invoke(app, dealer)
    missing = runner.invoke(app, [*dealer, f"--tls-dir={tmp_path / 'empty'}"])
    wrong_role = runner.invoke(app, [*dealer, *server0])
    both = runner.invoke(app, [*dealer, f"--tls-dir={pki}", "--insecure"])
    local_both = runner.invoke(app, ["starfish-local", str(tmp_path), "--forget", "0",
                                     f"--tls-dir={pki}", "--insecure"])  # fmt: skip

    # Assert: one line each, saying what to do
    assert nothing.exit_code == 2
    assert "needs exactly one of --tls-dir" in flat(nothing.output)
    assert missing.exit_code == 2
    assert "cannot load the TLS identity" in flat(missing.output)
    assert wrong_role.exit_code == 2
    assert "binds role 'server0'; give it the dealer certificate" in flat(wrong_role.output)
    assert both.exit_code == 2
    assert "needs exactly one of" in flat(both.output)
    assert local_both.exit_code == 2
    assert "not both" in flat(local_both.output)


def test_a_tls_dir_others_may_access_stops_each_command_with_the_chmod_that_fixes_it(tmp_path):
    # issue 41: the PKI directory was accepted at any mode (a group-writable one let another
    # user replace ca.pem); keys at any mode (0666 too)
    pki = tmp_path / "pki"
    assert runner.invoke(app, ["starfish-certs", str(pki)]).exit_code == 0
    os.chmod(pki, 0o755)
    dealer = runner.invoke(app, ["starfish-dealer", "--timeout", "0.3", f"--tls-dir={pki}"])
    local = runner.invoke(app, ["starfish-local", str(tmp_path), "--forget", "0",
                                f"--tls-dir={pki}"])  # fmt: skip
    certs = runner.invoke(app, ["starfish-certs", str(pki), "--overwrite"])
    for res in (dealer, local, certs):
        assert res.exit_code == 2, res.output
        assert f"Fix it with: chmod 700 {pki}" in flat(res.output)
        assert len(res.output.strip().splitlines()) == 1, res.output
    os.chmod(pki, 0o700)
    os.chmod(pki / "dealer.key", 0o644)
    dealer = runner.invoke(app, ["starfish-dealer", "--timeout", "0.3", f"--tls-dir={pki}"])
    assert dealer.exit_code == 2
    assert f"Fix it with: chmod 600 {pki / 'dealer.key'}" in flat(dealer.output)


def test_an_insecure_dealer_warns_and_gives_up_when_no_server_joins():
    res = runner.invoke(app, ["starfish-dealer", "--insecure", "--timeout", "0.3"])
    text = flat(res.output)
    assert res.exit_code == 2
    assert "warning: --insecure: plain TCP" in text
    assert "PeerDisconnectedError: no authenticated server0, server1 joined dealer" in text
