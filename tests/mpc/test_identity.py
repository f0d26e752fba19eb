"""Trial PKI and role-checked mutual TLS (issue 15: roles bound in certificates)."""

from __future__ import annotations

import datetime
import os
import socket
import stat
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedunlearn.errors import ConfigError, PeerAuthenticationError
from fedunlearn.mpc.identity import (
    ROLES,
    Identity,
    create_trial_pki,
    main,
    peer_role,
    require_security,
    role_uri,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return create_trial_pki(tmp_path_factory.mktemp("pki"))


def handshake(server_identity, server_roles, client_identity, client_roles):
    """TLS between two threads; return (server outcome, client outcome): a role or an error."""
    listener = socket.create_server(("127.0.0.1", 0))
    out = {}

    def serve():
        conn, _ = listener.accept()
        try:
            tls, role = server_identity.wrap_server(
                conn, server_roles, timeout_seconds=5, where="client"
            )
            out["server"] = role
            tls.recv(1)  # let the client finish reading our answer
            tls.close()
        except Exception as exc:  # reported to the test
            out["server"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    sock = socket.create_connection(listener.getsockname())
    try:
        tls, role = client_identity.wrap_client(
            sock, client_roles, timeout_seconds=5, where="server"
        )
        out["client"] = role
        tls.sendall(b"x")
        tls.close()
    except Exception as exc:  # reported to the test
        out["client"] = exc
    thread.join(10)
    listener.close()
    return out["server"], out["client"]


def test_each_certificate_binds_its_role_and_keys_are_private(pki):
    for role in ROLES:
        identity = pki[role]
        assert Identity.load(identity.ca, identity.cert, identity.key).role == role
        cert = x509.load_pem_x509_certificate(identity.cert.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [role_uri(role)]
        assert stat.S_IMODE(identity.key.stat().st_mode) == 0o600
    assert stat.S_IMODE((pki["dealer"].ca.parent / "ca.key").stat().st_mode) == 0o600


def test_mutual_tls_reports_each_peers_certified_role(pki):
    server, client = handshake(pki["dealer"], {"server0"}, pki["server0"], {"dealer"})
    assert (server, client) == ("server0", "dealer")


def test_a_client_certificate_is_refused_where_a_server_is_expected(pki):
    server, _ = handshake(pki["dealer"], {"server0", "server1"}, pki["clients"], {"dealer"})
    assert isinstance(server, PeerAuthenticationError)
    assert "role 'clients'" in str(server)
    assert "server0, server1" in str(server)


def test_a_server_refuses_a_dealer_that_is_not_the_dealer(pki):
    _, client = handshake(pki["server1"], {"server0"}, pki["server0"], {"dealer"})
    assert isinstance(client, PeerAuthenticationError)
    assert "role 'server1'" in str(client)


def test_a_certificate_of_another_ca_is_refused(pki, tmp_path):
    rogue = create_trial_pki(tmp_path / "rogue")
    server, client = handshake(pki["dealer"], {"server0"}, rogue["server0"], {"dealer"})
    assert isinstance(client, PeerAuthenticationError) or isinstance(
        server, PeerAuthenticationError
    )
    assert isinstance(server, PeerAuthenticationError)  # the dealer never accepts it


def write_leaf_without_role(pki, directory):
    """A certificate signed by the deployment's CA but with no role URI."""
    ca_dir = pki["dealer"].ca.parent
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "no role")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir()
    (directory / "leaf.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "leaf.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "leaf.key").chmod(0o600)  # a key only its owner may read (issue 41)
    return directory / "leaf.pem", directory / "leaf.key"


def test_a_certificate_without_a_role_cannot_be_loaded_or_accepted(pki, tmp_path):
    cert, key = write_leaf_without_role(pki, tmp_path / "leaf")
    with pytest.raises(ConfigError, match="exactly one of"):
        Identity.load(pki["dealer"].ca, cert, key)
    sneaky = Identity(pki["dealer"].ca, cert, key, "server0")  # bypasses load's check
    server, _ = handshake(pki["dealer"], {"server0"}, sneaky, {"dealer"})
    assert isinstance(server, PeerAuthenticationError)
    assert "roles none" in str(server)


def test_peer_role_rejects_missing_and_ambiguous_roles():
    with pytest.raises(PeerAuthenticationError, match="no certificate"):
        peer_role(None)
    two = {"subjectAltName": [("URI", role_uri("server0")), ("URI", role_uri("server1"))]}
    with pytest.raises(PeerAuthenticationError, match="exactly one"):
        peer_role(two)
    assert peer_role({"subjectAltName": [("URI", role_uri("clients"))]}) == "clients"


def test_plain_tcp_needs_an_explicit_flag(pki):
    with pytest.raises(ConfigError, match="insecure=True"):
        require_security(None, False, "the dealer")
    with pytest.raises(ConfigError, match="not both"):
        require_security(pki["dealer"], True, "the dealer")
    require_security(None, True, "the dealer")  # explicit: allowed


def test_trial_pki_command_writes_all_roles_and_refuses_to_overwrite(tmp_path, capsys):
    assert main([str(tmp_path / "p"), "--hosts", "10.0.0.7,server.example"]) == 0
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == sorted(
        ["ca.pem", "ca.key"] + [f"{r}.{e}" for r in ROLES for e in ("pem", "key")]
    )
    cert = x509.load_pem_x509_certificate((tmp_path / "p" / "server1.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["server.example"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert main([str(tmp_path / "p")]) == 2
    assert "already holds a CA" in capsys.readouterr().err


# ---- key-file hygiene (issue 25) --------------------------------------------------------------


@pytest.fixture
def umask_000():
    before = os.umask(0)
    yield
    os.umask(before)


def test_keys_are_0600_under_umask_000_with_a_leftover_tmp_and_a_planted_symlink(
    tmp_path, umask_000
):
    # Prepare: a leftover world-readable ca.key.tmp and a server0.key.tmp symlink planted by
    # someone else, pointing at a file they can read (the old writer reused and followed both)
    out = tmp_path / "pki"
    out.mkdir(mode=0o700)  # a 0755 directory is refused since issue 41
    leftover = out / "ca.key.tmp"
    leftover.write_bytes(b"old")
    os.chmod(leftover, 0o644)
    trap = tmp_path / "attacker-readable"
    trap.write_bytes(b"")
    os.chmod(trap, 0o666)
    (out / "server0.key.tmp").symlink_to(trap)
    # Execute
    create_trial_pki(out)
    # Assert: keys owner-only, certificates not writable by others, nothing went through the link
    for role in ("ca", *ROLES):
        assert stat.S_IMODE((out / f"{role}.key").stat().st_mode) == 0o600, role
        assert stat.S_IMODE((out / f"{role}.pem").stat().st_mode) == 0o644, role
        assert not (out / f"{role}.key").is_symlink()
    assert trap.read_bytes() == b""
    assert b"PRIVATE KEY" not in leftover.read_bytes()
    assert not list(out.glob(".*.tmp"))  # no temporary file left behind


def test_a_created_directory_is_private_and_existing_files_are_not_replaced(tmp_path, umask_000):
    out = tmp_path / "fresh" / "pki"
    create_trial_pki(out, roles=["dealer"])
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    # a role key alone (no ca.pem) is not overwritten silently either
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / "server1.key").write_bytes(b"keep me")
    with pytest.raises(ConfigError, match="server1.key"):
        create_trial_pki(other)
    assert (other / "server1.key").read_bytes() == b"keep me"
    assert not (other / "ca.key").exists()
    create_trial_pki(other, overwrite=True)
    assert b"PRIVATE KEY" in (other / "server1.key").read_bytes()


def test_a_directory_writable_by_others_is_refused(tmp_path, umask_000):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigError, match="group or others may access it.*chmod 700"):
        create_trial_pki(shared)
    assert not list(shared.iterdir())


# ---- who may touch the key material (issue 41) -------------------------------------------------


@pytest.fixture
def own_pki(tmp_path):
    """A fresh trial PKI in a 0700 directory of this user (as create_trial_pki makes it)."""
    directory = tmp_path / "pki"
    create_trial_pki(directory, roles=["server0"])
    return directory


@pytest.mark.parametrize("mode", [0o750, 0o755, 0o770, 0o701], ids=oct)
def test_a_pki_directory_group_or_others_may_access_is_refused_with_the_fix(own_pki, mode):
    # before: any mode was loaded (only create_trial_pki looked, at the world-write bit)
    Identity.from_directory(own_pki, "server0")
    os.chmod(own_pki, mode)
    with pytest.raises(ConfigError, match=f"mode {mode:04o}.*chmod 700 {own_pki}$") as caught:
        Identity.from_directory(own_pki, "server0")
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="chmod 700"):
        create_trial_pki(own_pki, roles=["server0"], overwrite=True)


def test_a_pki_directory_or_key_of_another_user_is_refused(own_pki, monkeypatch):
    # before: a directory owned by another user was accepted (that user replaced ca.pem)
    owner = own_pki.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # as if another user ran it
    with pytest.raises(ConfigError, match=f"is owned by uid {owner}, not by the user"):
        Identity.from_directory(own_pki, "server0")
    with pytest.raises(ConfigError, match="private key .* is owned by uid"):
        Identity.load(own_pki / "ca.pem", own_pki / "server0.pem", own_pki / "server0.key")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o666], ids=oct)
def test_a_key_group_or_others_may_access_is_refused_with_the_fix(own_pki, mode):
    # before: keys were loaded at any permission (0666 accepted)
    key = own_pki / "server0.key"
    os.chmod(key, mode)
    with pytest.raises(ConfigError, match=f"mode {mode:04o}.*chmod 600 {key}$"):
        Identity.load(own_pki / "ca.pem", own_pki / "server0.pem", key)
    os.chmod(key, 0o400)  # read-only for its owner is fine
    assert Identity.load(own_pki / "ca.pem", own_pki / "server0.pem", key).role == "server0"


def test_a_certificate_others_may_replace_is_refused(own_pki):
    os.chmod(own_pki / "ca.pem", 0o666)
    with pytest.raises(ConfigError, match="ca.pem has mode 0666.*chmod 644"):
        Identity.from_directory(own_pki, "server0")
