"""The four-process deployment on 127.0.0.1 under attack and failure (issue 15, "Done when").

Every test runs real ``fedunlearn starfish-*`` processes with mutual TLS (a trial CA made
here), on a tiny run, with every wait bounded: a killed process stops its peers with a clear
error and changes no store; impostors (another CA, the clients' certificate claiming a server
role, a server's certificate claiming the other server), junk and oversized frames are refused
while the services keep waiting for their real peers; mismatched jobs are refused at the
handshake, naming every differing field; ``comparison: ideal`` is refused before any link;
``fedunlearn starfish-local`` runs the four processes over fresh certificates after a kill,
on unchanged stores, and opens the plaintext method's model.
"""

from __future__ import annotations

import hashlib
import json
import select
import shutil
import socket
import sqlite3
import stat
import struct
import time
import zlib
from pathlib import Path

import pytest
import torch
from starfish_support import small_run_config
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, PeerAuthenticationError, PeerDisconnectedError
from fedunlearn.mpc import (
    Identity,
    LinkLimits,
    Security,
    SessionBinding,
    TcpTransport,
    connect_peer,
    create_trial_pki,
)
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.starfish.deploy import launcher
from fedunlearn.unlearn.starfish.deploy.binding import JOB_FIELDS
from fedunlearn.unlearn.starfish.deploy.job import DeployOptions, StarfishJob
from fedunlearn.unlearn.starfish.deploy.launcher import (
    CHILDREN,
    LocalRunError,
    child_commands,
    launch,
    listening_socket,
    role_directories,
    spawn,
)
from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares, share_store_dir

pytestmark = pytest.mark.slow  # every test here starts real processes

TIMEOUT = 30.0
KILL_TIMEOUT = 60.0  # a lost peer is noticed at once, not after this
HOST = "127.0.0.1"
METHOD = make_method("starfish", {"backend": "mpc"})
runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("starfish_deploy") / "run"
    train_run(parse_config(small_run_config(seed=7, rounds=8)), path)
    ensure_shares(path, METHOD)
    return path


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """Another run of the same shape (another seed), shared on its own."""
    path = tmp_path_factory.mktemp("starfish_deploy_other") / "run"
    train_run(parse_config(small_run_config(seed=8, rounds=8)), path)
    ensure_shares(path, METHOD)
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    create_trial_pki(directory)
    return directory


@pytest.fixture(scope="module")
def tls(pki, tmp_path_factory):
    """Each child's own TLS directory, as starfish-local hands them out."""
    return role_directories(pki, tmp_path_factory.mktemp("roles"))


def checksums(run_dir):
    """sha256 of every store a request reads (both share stores, the history, sharing.json)."""
    files = [share_store_dir(run_dir, k) / "history.sqlite" for k in (0, 1)]
    files += [run_dir / "history" / "history.sqlite", run_dir / "starfish" / "sharing.json"]
    for path in files:
        wal = path.with_name(path.name + "-wal")
        assert not wal.exists() or wal.stat().st_size == 0
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def read(path):
    return path.read_text(errors="replace") if path.exists() else ""


def stop(processes):
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def wait_for(predicate, what, seconds=120.0):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, what
        time.sleep(0.02)


# ---- killing any process ---------------------------------------------------------------------


@pytest.mark.parametrize("victim", CHILDREN)
def test_killing_any_process_stops_its_peers_with_a_clear_error_and_changes_no_store(
    run_dir, tls, tmp_path, victim
):
    # Prepare
    before = checksums(run_dir)
    outs = (tmp_path / "s0.json", tmp_path / "s1.json")
    children = dict(
        zip(
            CHILDREN,
            launch(
                StarfishJob(run_dir, (0,), METHOD, f"kill-{victim}"),
                outs,
                tmp_path,
                tls,
                DeployOptions(timeout_seconds=KILL_TIMEOUT, idle_timeout_seconds=KILL_TIMEOUT),
            ),
            strict=True,
        )
    )
    try:
        # Execute: kill the victim once server 1 replayed its first round (mid-protocol)
        wait_for(
            lambda: "replayed round" in read(tmp_path / "server1.log"),
            read(tmp_path / "server1.log"),
        )
        children[victim].kill()
        killed_at = time.monotonic()
        for child in children.values():
            child.wait(timeout=KILL_TIMEOUT + 10)
        elapsed = time.monotonic() - killed_at
    finally:
        stop(children.values())

    # Assert: every peer stopped promptly (a closed connection, not the receive timeout),
    # each with one error line; no result; no store changed
    assert elapsed < KILL_TIMEOUT / 2
    for name, child in children.items():
        if name == victim:
            continue
        log = read(tmp_path / f"{name}.log")
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert child.returncode == 2, (name, log)
        assert "Traceback" not in log, (name, log)
        assert len(errors) == 1, (name, log)
        assert "PeerDisconnectedError" in errors[0], (name, log)
    assert not outs[0].exists()
    assert not outs[1].exists()
    assert checksums(run_dir) == before


# ---- impostors and junk ------------------------------------------------------------------------


def impostor(pki, certificate_role, claimed_role):
    """The certificate of one role presented by a process that claims another."""
    real = Identity.from_directory(pki, certificate_role)
    return Identity(real.ca, real.cert, real.key, claimed_role)


def attempt(port, identity, service_role):
    """Try to join the service on ``port`` as ``identity.role``; return the error (or None)."""
    try:
        link = connect_peer(
            (HOST, port),
            security=Security(identity=identity),
            role=identity.role,
            peer_roles={service_role},
            binding=SessionBinding("attacker"),
            limits=LinkLimits(timeout_seconds=5.0, handshake_timeout_seconds=5.0),
        )
    except (PeerAuthenticationError, PeerDisconnectedError) as exc:
        return exc
    link.close()
    return None


def junk(port):
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 4)


def oversized_hello(port, identity, service_role):
    """TLS with a real certificate, then a 1 KiB header declaring a 1 GiB frame."""
    sock = socket.create_connection((HOST, port), timeout=5)
    tls, _ = identity.wrap_client(sock, {service_role}, timeout_seconds=5.0, where="service")
    transport = TcpTransport(tls, 1, 5.0)
    header = struct.pack("!4sBBxxQ", b"FUMP", 2, 1, 1 << 30) + struct.pack("!Q", 1 << 30)
    transport.send_raw(header + bytes(1024 - len(header)))
    time.sleep(0.2)
    transport.close()


def test_impostors_junk_and_oversized_frames_are_refused_and_the_session_still_runs(
    run_dir, pki, tls, tmp_path
):
    # Prepare: dealer, server 0 and the clients wait for their peers; server 1 is held back
    before = checksums(run_dir)
    rogue = tmp_path / "rogue"
    create_trial_pki(rogue)
    outs = (tmp_path / "s0.json", tmp_path / "s1.json")
    sockets = {name: listening_socket() for name in ("dealer", "server0", "clients")}
    ports = {name: sock.getsockname()[1] for name, sock in sockets.items()}
    job = StarfishJob(run_dir, (0,), METHOD, "attacked")
    options = DeployOptions(timeout_seconds=TIMEOUT, idle_timeout_seconds=120.0)
    commands = child_commands(job, outs, sockets, tls, options)
    processes = {}
    try:
        for name in ("dealer", "server0", "clients"):
            processes[name] = spawn(commands[name][0], tmp_path / f"{name}.log", commands[name][1])
        for sock in sockets.values():
            sock.close()
        # the services' own roles, as an attacker's TLS client expects them
        service_role = {"dealer": "dealer", "server0": "server0", "clients": "clients"}

        # Execute: attack every listener
        refusals = {}
        for name, port in ports.items():
            role = service_role[name]
            junk(port)
            refusals[(name, "another CA")] = attempt(
                port, Identity.from_directory(rogue, "server1"), role
            )
            refusals[(name, "clients cert as server1")] = attempt(
                port, impostor(pki, "clients", "server1"), role
            )
            refusals[(name, "server0 cert as server1")] = attempt(
                port, impostor(pki, "server0", "server1"), role
            )
            if name != "server0":  # server 0 accepts only server 1
                # the old oracle: claim party 0, then party 1, on two connections
                refusals[(name, "clients cert as server0")] = attempt(
                    port, impostor(pki, "clients", "server0"), role
                )
            oversized_hello(port, Identity.from_directory(pki, "server1"), role)
        alive = {name: p.poll() is None for name, p in processes.items()}
        # the real server 1 arrives: the session runs to its end
        processes["server1"] = spawn(commands["server1"][0], tmp_path / "server1.log")
        for process in processes.values():
            process.wait(timeout=120)
    finally:
        stop(processes.values())

    # Assert
    assert all(alive.values()), alive
    assert all(isinstance(err, PeerAuthenticationError | PeerDisconnectedError)
               for err in refusals.values()), refusals  # fmt: skip
    codes = {name: p.returncode for name, p in processes.items()}
    assert codes == dict.fromkeys(CHILDREN, 0), {n: read(tmp_path / f"{n}.log") for n in codes}
    for name in ("dealer", "server0", "clients"):
        log = read(tmp_path / f"{name}.log")
        attacks = 5 if name == "server0" else 6
        assert log.count("refused a connection") >= attacks, log
        assert "for role 'clients'" in log  # the clients' certificate claimed a server role
        # server 0's certificate claimed server 1
        assert ("certificate is for role 'server0'" if name == "server0" else
                "claims role 'server1' but your certificate is for 'server0'") in log  # fmt: skip
        assert "exceeds the cap" in log  # the 1 GiB frame was refused from its header
    results = [json.loads(path.read_text()) for path in outs]
    assert results[0]["params"] == results[1]["params"]
    assert "mutual TLS" in results[0]["security"]
    with UnlearnSession(run_dir, evaluate=False) as session:
        plain = session.run(make_method("starfish"), UnlearnRequest.of([0]))
    details = results[0]["details"]
    assert details["selected_rounds"] == list(plain.details.selected_rounds)
    assert details["flags"] == {str(r): ids for r, ids in plain.details.flags.items()}
    params = torch.tensor(results[0]["params"], dtype=plain.params.dtype)
    assert float((params - plain.params).norm() / plain.params.norm()) < 1e-2
    # both directions of every link are counted; a round ran on streamed material
    for link in ("server", "dealer", "clients"):
        assert results[0]["links"][link]["sent"] > 0
        assert results[0]["links"][link]["received"] > 0
    assert any(r["streamed"] for r in results[0]["rounds"])
    assert checksums(run_dir) == before


# ---- mismatched jobs ------------------------------------------------------------------------


def test_mismatched_runs_are_refused_at_the_handshake_naming_every_differing_field(
    run_dir, other_run, tls, tmp_path
):
    # Prepare: server 1 reads another run (another seed: config, trajectory and sharing
    # differ), forgets another client and selects another share of the rounds
    outs = (tmp_path / "s0.json", tmp_path / "s1.json")
    sockets = {name: listening_socket() for name in ("dealer", "server0", "clients")}
    options = DeployOptions(timeout_seconds=TIMEOUT)
    ours = child_commands(StarfishJob(run_dir, (0,), METHOD, "mismatch"), outs, sockets, tls,
                          options)  # fmt: skip
    other = make_method("starfish", {"backend": "mpc", "selection_rate": 0.8})
    theirs = child_commands(StarfishJob(other_run, (1,), other, "mismatch"), outs, sockets, tls,
                            options)  # fmt: skip
    processes = []
    try:
        processes.append(spawn(ours["server0"][0], tmp_path / "server0.log", ours["server0"][1]))
        processes.append(spawn(theirs["server1"][0], tmp_path / "server1.log"))

        # Execute
        for process in processes:
            process.wait(timeout=TIMEOUT + 30)
        # neither went on to the dealer or the clients: nobody connected to their listeners
        reached = select.select([sockets["dealer"], sockets["clients"]], [], [], 0)[0]
    finally:
        stop(processes)
        for sock in sockets.values():
            sock.close()

    # Assert: both stop with one error line naming every field of the job that differs
    assert reached == []
    for k, process in enumerate(processes):
        log = read(tmp_path / f"server{k}.log")
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert process.returncode == 2, log
        assert len(errors) == 1, log
        assert "SessionMismatchError" in errors[0], log
        for field in JOB_FIELDS:
            assert f"digest {field}" in errors[0], (field, errors[0])
        assert "session_id" not in errors[0]  # the same session: only the job differs


# ---- ideal comparisons ------------------------------------------------------------------------


def test_ideal_comparisons_are_refused_before_any_link_is_made(run_dir, pki, tls, tmp_path):
    # Prepare: server 1 would connect to server 0's listener, held by the test
    outs = (tmp_path / "s0.json", tmp_path / "s1.json")
    sockets = {name: listening_socket() for name in ("dealer", "server0", "clients")}
    ideal = make_method("starfish", {"backend": "mpc", "comparison": "ideal"})
    with pytest.raises(ConfigError, match="comparison=ideal is refused"):
        StarfishJob(run_dir, (0,), ideal, "ideal")  # the launcher cannot even describe it
    job = StarfishJob(run_dir, (0,), METHOD, "ideal")
    commands = child_commands(job, outs, sockets, tls, DeployOptions(timeout_seconds=TIMEOUT))
    try:
        # Execute: a real server process, and the clients and starfish-local commands
        server_args = [*commands["server1"][0], "--param=comparison=ideal"]
        server = spawn(server_args, tmp_path / "server1.log")
        try:
            server.wait(timeout=TIMEOUT + 30)
        finally:
            stop([server])
        reached = select.select(list(sockets.values()), [], [], 0)[0]
    finally:
        for sock in sockets.values():
            sock.close()
    clients = runner.invoke(app, commands["clients"][0][:4] + ["--param=comparison=ideal",
                                                                f"--tls-dir={pki}"])  # fmt: skip
    local = runner.invoke(app, ["starfish-local", str(run_dir), "--forget", "0",
                                "--param", "comparison=ideal", "--out", str(outs[0])])  # fmt: skip

    # Assert: each refuses with the reason, before any connection
    log = read(tmp_path / "server1.log")
    assert server.returncode == 2, log
    assert "comparison=ideal is refused" in log, log
    assert reached == []
    for result in (clients, local):
        assert result.exit_code == 2, result.output
        assert "comparison=ideal is refused" in result.output
    assert not outs[0].exists()


# ---- starfish-local ------------------------------------------------------------------------------


def test_starfish_local_after_a_kill_runs_over_fresh_certificates_and_matches_plaintext(
    run_dir, tmp_path
):
    # Prepare: the stores as the killed runs above left them
    before = checksums(run_dir)
    out = tmp_path / "result.json"

    # Execute: no certificates given: starfish-local makes fresh ones per role
    res = runner.invoke(app, ["starfish-local", str(run_dir), "--forget", "0", "--out", str(out),
                              "--timeout", str(TIMEOUT), "--deadline", "240"])  # fmt: skip
    with UnlearnSession(run_dir, evaluate=False) as session:
        plain = session.run(make_method("starfish"), UnlearnRequest.of([0]))

    # Assert
    assert res.exit_code == 0, res.output
    assert "both servers opened the same model" in res.output
    result = json.loads(out.read_text())
    details = result["details"]
    assert result["servers_opened_same_model"] is True
    assert any("semi-honest servers" in a for a in details["assumptions"])
    assert result["security"].startswith("mutual TLS, roles from certificates")
    assert details["selected_rounds"] == list(plain.details.selected_rounds)
    assert details["flags"] == {str(r): ids for r, ids in plain.details.flags.items()}
    params = torch.tensor(result["params"], dtype=plain.params.dtype)
    assert float((params - plain.params).norm() / plain.params.norm()) < 1e-2
    for phase in ("TD", "RS", "UE", "TC", "AGG"):
        assert details["mpc_costs"][phase]["bytes_sent"] > 0, phase
        assert result["party1_mpc_costs"][phase]["rounds"] > 0, phase
    # party 0 receives 16-byte seeds from the dealer; party 1 also the correction shares
    offline0 = sum(book["offline_bytes"] for book in details["mpc_costs"].values())
    offline1 = sum(book["offline_bytes"] for book in result["party1_mpc_costs"].values())
    assert 0 < offline0 < offline1
    assert offline0 % 16 == 0  # seeds only
    for name in ("server", "dealer", "clients"):
        for k, links in enumerate((result["links"], result["party1_links"])):
            assert links[name]["sent"] > 0, (k, name)
            assert links[name]["received"] > 0, (k, name)
    assert result["links"]["dealer"]["received"] >= offline0
    assert checksums(run_dir) == before


# ---- issue 25: each child its own key; shares checked on every read ----------------------------


def test_each_child_gets_only_its_own_roles_key(run_dir, monkeypatch, tmp_path):
    # Prepare: catch what starfish-local hands its children (no process is started)
    handed = {}

    def fake_launch(job, outs, logs, tls, options):
        sockets = {name: listening_socket() for name in ("dealer", "server0", "clients")}
        try:
            commands = child_commands(job, outs, sockets, tls, options)
        finally:
            for sock in sockets.values():
                sock.close()
        for name, (args, _) in commands.items():
            [tls_arg] = [a for a in args if a.startswith("--tls-dir=")]
            directory = Path(tls_arg.removeprefix("--tls-dir="))
            handed[name] = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
            Identity.from_directory(directory, name)  # the child can still load its identity
        raise LocalRunError("stop before any process starts")

    monkeypatch.setattr(launcher, "launch", fake_launch)

    # Execute
    with pytest.raises(LocalRunError, match="stop before"):
        launcher.run_local(run_dir, [0], METHOD, log_dir=tmp_path)

    # Assert: the CA certificate, the role's certificate and key (0600), nothing else
    assert set(handed) == set(CHILDREN)
    for role, files in handed.items():
        assert set(files) == {"ca.pem", f"{role}.pem", f"{role}.key"}, (role, files)
        assert files[f"{role}.key"] == 0o600


def test_a_share_edited_after_sharing_stops_the_run_instead_of_changing_the_result(
    run_dir, tmp_path
):
    # Prepare: a copy of the run whose server 0 share store has the target's shares edited
    # (CRC-32 recomputed, metadata untouched: the handshake's binding still matches)
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    con = sqlite3.connect(share_store_dir(run, 0) / "history.sqlite")
    rows = con.execute("SELECT round, data FROM payloads WHERE kind='update' AND client_id=0")
    for round_, data in rows.fetchall():
        edited = bytearray(data)
        edited[8] ^= 0x01
        con.execute(
            "UPDATE payloads SET data=?, crc32=? WHERE round=? AND kind='update' AND client_id=0",
            (bytes(edited), zlib.crc32(edited), round_),
        )
    con.commit()
    con.close()
    out = tmp_path / "result.json"

    # Execute
    res = runner.invoke(app, ["starfish-local", str(run), "--forget", "0", "--out", str(out),
                              "--timeout", str(TIMEOUT), "--deadline", "240"])  # fmt: skip

    # Assert: server 0 refuses the edited share; no result is written
    assert res.exit_code == 2, res.output
    assert "not the one bound into the session" in " ".join(res.output.split()), res.output
    assert not out.exists()
