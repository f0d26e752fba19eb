"""The local deployment: four supervised processes, a killed server, a rerun, mutual TLS."""

import hashlib
import json
import time

import pytest
import torch
from starfish_support import small_run_config, write_tls

from fedunlearn.config import parse_config
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.starfish.deploy.launcher import launch, run_local
from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares, share_store_dir

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("starfish_launcher") / "run"
    train_run(parse_config(small_run_config(seed=7, rounds=10)), path)
    return path


def checksums(run_dir):
    """sha256 of each share store; a WAL a killed reader leaves behind must be empty."""
    out = {}
    for k in (0, 1):
        store = share_store_dir(run_dir, k)
        wal = store / "history.sqlite-wal"
        assert not wal.exists() or wal.stat().st_size == 0
        out[k] = hashlib.sha256((store / "history.sqlite").read_bytes()).hexdigest()
    return out


def read(path):
    return path.read_text(errors="replace") if path.exists() else ""


def test_killed_server_stops_its_peer_with_a_disconnect_error_and_a_rerun_succeeds(
    run_dir, tmp_path
):
    ensure_shares(run_dir, make_method("starfish", {"backend": "mpc"}))
    before = checksums(run_dir)
    logs = tmp_path / "logs"
    logs.mkdir()
    outs = (tmp_path / "s0.json", tmp_path / "s1.json")
    children = launch(run_dir, [0], outs, logs, timeout_seconds=TIMEOUT)
    try:
        deadline = time.monotonic() + 120
        while "replayed round" not in read(logs / "server1.log"):  # server 1 is mid-replay
            assert children[2].poll() is None, read(logs / "server1.log")
            assert time.monotonic() < deadline, read(logs / "server1.log")
            time.sleep(0.02)
        children[2].kill()
        killed_at = time.monotonic()
        children[1].wait(timeout=TIMEOUT + 10)
        assert time.monotonic() - killed_at < TIMEOUT
        assert children[1].returncode == 2
        log0 = read(logs / "server0.log")
        assert "PeerDisconnectedError" in log0, log0
        children[0].wait(timeout=TIMEOUT + 10)
        assert children[0].returncode != 0  # the dealer reports the lost server too
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
    assert not outs[0].exists() and not outs[1].exists()
    assert checksums(run_dir) == before  # the share stores are untouched

    result = run_local(run_dir, [0], timeout_seconds=TIMEOUT, deadline_seconds=180)
    assert checksums(run_dir) == before
    with UnlearnSession(run_dir, evaluate=False) as session:
        plain = session.run(make_method("starfish"), UnlearnRequest.of([0]))
    details = result["details"]
    assert result["models_agree"] is True
    assert details["selected_rounds"] == list(plain.details.selected_rounds)
    assert details["flags"] == {str(r): ids for r, ids in plain.details.flags.items()}
    params = torch.tensor(result["params"], dtype=plain.params.dtype)
    assert float((params - plain.params).norm() / plain.params.norm()) < 1e-2
    for phase in ("TD", "RS", "UE", "TC", "AGG"):
        assert details["mpc_costs"][phase]["bytes_sent"] > 0, phase
        assert result["party1_mpc_costs"][phase]["rounds"] > 0, phase
    # real bytes: party 0 receives one 16-byte seed per dealer request and nothing else
    offline0 = sum(details["mpc_costs"][phase]["offline_bytes"] for phase in details["mpc_costs"])
    offline1 = sum(c["offline_bytes"] for c in result["party1_mpc_costs"].values())
    assert offline0 > 0 and offline0 % 16 == 0
    assert offline1 > offline0  # party 1 also receives the correction shares
    assert result["dealer_link_bytes"] > offline0  # plus the request frames it sent
    assert result["clients_link_bytes"] > 0
    json.dumps(result)  # JSON-ready


def test_four_processes_over_mutual_tls_select_the_same_rounds_and_flags_as_plaintext(tmp_path):
    # Prepare: a small run, one CA, one certificate shared by dealer, servers and clients
    run_dir = tmp_path / "run"
    train_run(parse_config(small_run_config(seed=11, rounds=8)), run_dir)
    tls = write_tls(tmp_path / "tls", "fedunlearn")

    # Execute: every connection (server-server, server-dealer, server-clients) is mutual TLS
    result = run_local(run_dir, [1], timeout_seconds=30.0, deadline_seconds=300.0, tls=tls)
    with UnlearnSession(run_dir, evaluate=False) as session:
        plain = session.run(make_method("starfish"), UnlearnRequest.of([1]))

    # Assert
    details = result["details"]
    assert result["models_agree"] is True
    assert details["selected_rounds"] == list(plain.details.selected_rounds)
    assert details["flags"] == {str(r): ids for r, ids in plain.details.flags.items()}
    assert result["dealer_link_bytes"] > 0 and result["clients_link_bytes"] > 0
