"""A certified clients service that lies ends the session with one line and exit 2 (issue 41).

Real ``starfish-dealer`` and ``starfish-server`` processes with mutual TLS; the clients service
runs in this process (``remote.serve_clients``, the real service with its real certificate),
and answers the servers' first exact-update request with a rejected client id ``"²"``. Before
issue 41 both servers exited 1 with a 60-line ``ValueError`` traceback (``str.isdigit()``
accepts "²", ``int()`` refuses it). Now the answer is a ``MalformedFrameError``: each server
prints one ``error:`` line and exits 2, the dealer (whose servers hung up without their
goodbye) exits 2 too, and no result file is written.
"""

from __future__ import annotations

import threading

import pytest
from starfish_support import small_run_config

from fedunlearn.config import parse_config
from fedunlearn.mpc import Identity, Security, create_trial_pki
from fedunlearn.runs import train_run
from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.starfish.deploy.clients import ClientSimulator
from fedunlearn.unlearn.starfish.deploy.job import DeployOptions, Listen, StarfishJob
from fedunlearn.unlearn.starfish.deploy.launcher import (
    child_commands,
    listening_socket,
    role_directories,
    spawn,
)
from fedunlearn.unlearn.starfish.deploy.remote import serve_clients
from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares

pytestmark = pytest.mark.slow  # real processes

TIMEOUT = 30.0
METHOD = make_method("starfish", {"backend": "mpc"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("starfish_peers") / "run"
    train_run(parse_config(small_run_config(seed=7, rounds=6)), path)
    ensure_shares(path, METHOD)
    return path


def read(path):
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize(
    "answer",
    [
        {"accepted": [], "rejected": {"²": "wrong shape"}, "reasons": []},  # the issue's
        {"accepted": [], "rejected": ["²"], "reasons": ["wrong shape"]},
    ],
    ids=["dict_key", "string_id"],
)
def test_a_clients_service_answering_a_non_integer_id_stops_both_servers_in_one_line(
    run_dir, tmp_path, monkeypatch, answer
):
    # Prepare: certificates, the dealer's, server 0's and the clients' sockets
    pki = tmp_path / "pki"
    create_trial_pki(pki)
    tls = role_directories(pki, tmp_path / "roles")
    outs = (tmp_path / "s0.json", tmp_path / "s1.json")
    sockets = {name: listening_socket() for name in ("dealer", "server0", "clients")}
    job = StarfishJob(run_dir, (0,), METHOD, "lying-clients")
    options = DeployOptions(timeout_seconds=TIMEOUT, idle_timeout_seconds=120.0)
    commands = child_commands(job, outs, sockets, tls, options)

    def lie(self, round_, ids):  # the real service, but its answer is the lie
        return {**answer, "shares": [[], []]}

    monkeypatch.setattr(ClientSimulator, "_train", lie)
    clients = {}

    def clients_service():
        security = Security(identity=Identity.from_directory(tls["clients"], "clients"))
        listen = Listen(listen_fd=sockets.pop("clients").detach())  # the service closes it
        # it listens from now on: wait for the servers as long as they may take to start
        own = DeployOptions(timeout_seconds=180.0, idle_timeout_seconds=60.0, listen=listen)
        try:
            clients["summary"] = serve_clients(job, security, own)
        except Exception as exc:  # reported to the test
            clients["error"] = exc

    processes = {}
    service = threading.Thread(target=clients_service, daemon=True)
    try:
        for name in ("dealer", "server0", "server1"):
            args, fds = commands[name]
            processes[name] = spawn(args, tmp_path / f"{name}.log", fds)
        for name in ("dealer", "server0"):
            sockets.pop(name).close()
        service.start()

        # Execute
        for process in processes.values():
            process.wait(timeout=240)
        service.join(60)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        for sock in sockets.values():
            sock.close()

    # Assert: each server ends with one error line and exit 2; nothing is written
    logs = {name: read(tmp_path / f"{name}.log") for name in processes}
    codes = {name: p.returncode for name, p in processes.items()}
    assert codes == {"dealer": 2, "server0": 2, "server1": 2}, logs
    for name in ("server0", "server1"):
        errors = [line for line in logs[name].splitlines() if line.startswith("error:")]
        assert len(errors) == 1, logs[name]
        assert errors[0].startswith("error: MalformedFrameError: clients at 127.0.0.1:"), errors
        assert "answered 'rejected' that is not a list of integer client ids" in errors[0]
    assert not any("Traceback" in log for log in logs.values()), logs
    assert not outs[0].exists()
    assert not outs[1].exists()
    assert "error" in clients  # the servers hung up on the service
