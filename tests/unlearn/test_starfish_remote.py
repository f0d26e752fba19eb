import datetime
import socket
import threading

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, PeerDisconnectedError
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.starfish.deploy.remote import Tls, accept, connect, listen

RUN = {
    "seed": 11,
    "data": {
        "dataset": "synthetic",
        "num_clients": 5,
        "partition": "dirichlet",
        "alpha": 0.5,
        "options": {"num_samples": 400, "num_features": 10, "num_classes": 3},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": 8,
        "local_epochs": 2,
        "lr": 0.05,
        "batch_size": 40,
        "weight_decay": 1e-3,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}


def name(text):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def build(subject, issuer, public_key, signing_key, is_ca):
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(signing_key, hashes.SHA256())
    )


def write_tls(directory, label):
    """A CA and one leaf certificate it signed, as PEM files."""
    directory.mkdir()
    ca_key, leaf_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = build(name(f"{label} CA"), name(f"{label} CA"), ca_key.public_key(), ca_key, True)
    leaf = build(name(f"{label} server"), ca.subject, leaf_key.public_key(), ca_key, False)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "cert.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Tls(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")


def serve_once(sock, tls, out):
    try:
        transport = accept(sock, 0, 10.0, tls)
        out["got"] = transport.exchange(np.arange(4, dtype=np.uint64))
        transport.close()
    except Exception as exc:  # reported to the test
        out["error"] = exc


def test_mutual_tls_connects_servers_with_certificates_of_one_ca(tmp_path):
    tls = write_tls(tmp_path / "good", "fedunlearn")
    sock = listen("127.0.0.1", 0)
    out = {}
    thread = threading.Thread(target=serve_once, args=(sock, tls, out))
    thread.start()
    try:
        client = connect(("127.0.0.1", sock.getsockname()[1]), 1, 10.0, tls)
        got = client.exchange(np.full(4, 7, dtype=np.uint64))
        client.close()
    finally:
        thread.join(20)
        sock.close()
    assert "error" not in out, out
    np.testing.assert_array_equal(got, np.arange(4))
    np.testing.assert_array_equal(out["got"], np.full(4, 7))


def test_tls_refuses_a_peer_certified_by_another_ca(tmp_path):
    good = write_tls(tmp_path / "good", "fedunlearn")
    rogue = write_tls(tmp_path / "rogue", "rogue")
    sock = listen("127.0.0.1", 0)
    out = {}
    thread = threading.Thread(target=serve_once, args=(sock, good, out))
    thread.start()
    try:
        with pytest.raises(Exception):  # noqa: B017 - the client sees an SSL or socket error
            client = connect(("127.0.0.1", sock.getsockname()[1]), 1, 10.0, rogue)
            client.exchange(np.zeros(1, dtype=np.uint64))
    finally:
        thread.join(20)
        sock.close()
    assert isinstance(out.get("error"), PeerDisconnectedError)
    assert "TLS handshake" in str(out["error"])


def test_missing_tls_files_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        Tls(tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem").context(False)


def test_accept_gives_up_after_its_timeout():
    sock = listen("127.0.0.1", 0)
    try:
        with pytest.raises(PeerDisconnectedError, match="no peer connected"):
            accept(sock, 0, 0.2)
    finally:
        sock.close()
    assert isinstance(sock, socket.socket)


def test_four_processes_over_mutual_tls_select_the_same_rounds_and_flags_as_plaintext(tmp_path):
    # Prepare: a small run, one CA, one certificate shared by dealer, servers and clients
    from fedunlearn.cli.starfish import run_local  # the launcher of the four processes

    run_dir = tmp_path / "run"
    train_run(parse_config(RUN), run_dir)
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
