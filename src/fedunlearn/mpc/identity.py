"""Who is who in a deployment: a local CA, per-role certificates, mutual TLS with role checks.

A two-server deployment has four roles (``ROLES``): ``dealer``, ``server0``, ``server1`` and
``clients``. Each process holds a certificate signed by the deployment's CA that names its role
in a subject-alternative-name URI, ``urn:fedunlearn:role:<role>`` (``role_uri``), next to the
DNS names and IP addresses it serves on. Every TLS link is mutual: each end presents its
certificate, requires the peer's to chain to the CA, and then checks the *role* in the peer's
certificate against the role(s) it expects on that link (``Identity.wrap_client`` and
``Identity.wrap_server``; ``PeerAuthenticationError`` otherwise). The role check replaces host
name checking (``check_hostname`` is off because a server may be reached under any address;
what must hold is "this peer is server 1 of this deployment", which the CA certifies). The
contexts are never handed out without that check.

For trials, ``create_trial_pki(directory)`` (or ``python -m fedunlearn.mpc.identity DIR``)
writes a fresh CA and one certificate per role, valid for ``days`` days, for the given hosts
(default 127.0.0.1 and localhost). A real deployment issues the certificates from a CA the two
organisations agree on; nothing here depends on how they were made, only on the role URI.

Key material is checked as OpenSSH checks it (issue 41): ``Identity.load`` refuses a private
key that is not owned by the running user or that its group or others may access (``chmod
600``), and certificates that group or others may write; ``Identity.from_directory``,
``create_trial_pki`` and ``starfish-local --tls-dir`` refuse a PKI directory not owned by the
running user or accessible to group or others (``chmod 700``): whoever can write there can
swap ``ca.pem`` (the only trust anchor) or move a key away (``mpc.key_files``). Each refusal is
one line saying how to fix the permissions.

Plain TCP exists only behind an explicit ``insecure=True`` (``require_security``), which gives
up, on every link: authentication of the peer's role (anyone who can reach a port can claim to
be a server and receive its dealer seeds or client shares), confidentiality of the traffic
(shares, openings, dealer seeds) and its integrity.

The threat model per role: docs/security.md.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import socket
import ssl
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedunlearn.atomic import write_bytes_atomic
from fedunlearn.errors import ConfigError, PeerAuthenticationError
from fedunlearn.mpc.key_files import (
    check_certificate_file,
    check_private_directory,
    check_private_key,
)

__all__ = [
    "INSECURE_WARNING",
    "ROLES",
    "ROLE_URI_PREFIX",
    "Identity",
    "create_trial_pki",
    "main",
    "party_role",
    "peer_role",
    "require_security",
    "role_uri",
]

ROLES = ("dealer", "server0", "server1", "clients")
ROLE_URI_PREFIX = "urn:fedunlearn:role:"
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
INSECURE_WARNING = (
    "plain TCP (insecure): no peer proves its role (anyone who can reach a port can claim to be a "
    "server and receive its dealer seeds or client shares), and shares, openings and dealer "
    "seeds cross the network unencrypted and unauthenticated. Use only on a trusted loopback."
)


def role_uri(role: str) -> str:
    """The SAN URI that binds ``role`` into a certificate."""
    _check_role(role)
    return ROLE_URI_PREFIX + role


def party_role(party_id: int) -> str:
    """The role of 2PC party ``party_id``: ``server0`` or ``server1``."""
    if party_id not in (0, 1):
        raise ConfigError(f"party_id must be 0 or 1; got {party_id!r}")
    return f"server{party_id}"


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")


def peer_role(certificate: dict | None, where: str = "the peer") -> str:
    """Return the role bound in a verified peer certificate (``SSLSocket.getpeercert()``).

    Raises:
        PeerAuthenticationError: No certificate, no role URI, several, or an unknown role.
    """
    if not certificate:
        raise PeerAuthenticationError(f"{where} presented no certificate; a role is required")
    uris = [v for k, v in certificate.get("subjectAltName", ()) if k == "URI"]
    roles = [u[len(ROLE_URI_PREFIX) :] for u in uris if u.startswith(ROLE_URI_PREFIX)]
    if len(roles) != 1 or roles[0] not in ROLES:
        raise PeerAuthenticationError(
            f"{where}'s certificate binds roles {roles or 'none'}; exactly one of "
            f"{', '.join(ROLES)} is required as a SAN URI {ROLE_URI_PREFIX}<role>"
        )
    return roles[0]


def _role_of_file(cert_path: Path) -> str:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = x509.SubjectAlternativeName([])
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    return peer_role({"subjectAltName": [("URI", u) for u in uris]}, f"certificate {cert_path}")


@dataclass(frozen=True)
class Identity:
    """One process's credentials: CA, its certificate and key, and the role the certificate binds.

    Build with ``Identity.load(ca, cert, key)`` (reads the role from the certificate) or from a
    trial directory with ``Identity.from_directory(dir, role)``. The TLS contexts exist only
    inside ``wrap_client``/``wrap_server``, which always check the peer's role.

    Args:
        ca: PEM certificate of the deployment's CA (the only trust anchor).
        cert: PEM certificate of this process (its role in a SAN URI).
        key: PEM private key of ``cert``.
        role: The role ``cert`` binds (checked by ``load``).
    """

    ca: Path
    cert: Path
    key: Path
    role: str

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path, key: str | Path) -> Identity:
        """Read the role from ``cert`` and check that the three files make usable contexts.

        Raises:
            ConfigError: A file is missing or unreadable, the key is not the running user's
                or group or others may access it (``check_private_key``), a certificate is
                writable by group or others, or the certificate binds no role.
        """
        ca, cert, key = Path(ca), Path(cert), Path(key)
        try:
            check_private_key(key)
            for certificate in (ca, cert):
                check_certificate_file(certificate)
            role = _role_of_file(cert)
            identity = cls(ca, cert, key, role)
            identity._context(server_side=True)
        except ConfigError:  # a permission refusal: its own line says how to fix it
            raise
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"cannot load the TLS identity (ca {ca}, cert {cert}, key {key}): {exc}. "
                "Create trial certificates with `python -m fedunlearn.mpc.identity DIR`."
            ) from exc
        except PeerAuthenticationError as exc:
            raise ConfigError(str(exc)) from exc
        return identity

    @classmethod
    def from_directory(cls, directory: str | Path, role: str) -> Identity:
        """The identity of ``role`` in a directory written by ``create_trial_pki``.

        Raises:
            ConfigError: As ``load``, or the directory is not the running user's or group or
                others may access it (``check_private_directory``).
        """
        _check_role(role)
        d = Path(directory)
        if d.is_dir():  # a missing one: ``load`` names the files it cannot read
            check_private_directory(d)
        return cls.load(d / "ca.pem", d / f"{role}.pem", d / f"{role}.key")

    def _context(self, server_side: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not server_side:
            ctx.check_hostname = False  # replaced by the role check of wrap_client
        return ctx

    def wrap_client(
        self,
        sock: socket.socket,
        expected_roles: Collection[str],
        *,
        timeout_seconds: float,
        where: str,
    ) -> tuple[ssl.SSLSocket, str]:
        """TLS-handshake a connected socket as the client and check the server's role.

        Args:
            sock: A connected TCP socket (closed on failure).
            expected_roles: Roles the peer may have on this link (e.g. ``{"dealer"}``).
            timeout_seconds: Bound on the whole handshake.
            where: How messages name the peer (``dealer at host:port``).

        Returns:
            The TLS socket and the peer's role.

        Raises:
            PeerAuthenticationError: The handshake failed (e.g. the peer's certificate is not
                from this deployment's CA) or the peer's role is not expected here.
        """
        sock.settimeout(timeout_seconds)
        try:
            tls = self._context(server_side=False).wrap_socket(sock)
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise PeerAuthenticationError(f"TLS handshake with {where} failed: {exc}") from exc
        return tls, _check_peer(tls, expected_roles, where)

    def wrap_server(
        self,
        sock: socket.socket,
        allowed_roles: Collection[str],
        *,
        timeout_seconds: float,
        where: str,
    ) -> tuple[ssl.SSLSocket, str]:
        """TLS-handshake an accepted socket as the server and check the client's role.

        Raises:
            PeerAuthenticationError: As ``wrap_client``; the socket is closed.
        """
        sock.settimeout(timeout_seconds)
        try:
            tls = self._context(server_side=True).wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise PeerAuthenticationError(f"TLS handshake with {where} failed: {exc}") from exc
        return tls, _check_peer(tls, allowed_roles, where)


def _check_peer(tls: ssl.SSLSocket, roles: Collection[str], where: str) -> str:
    try:
        role = peer_role(tls.getpeercert(), where)
        if role not in roles:
            raise PeerAuthenticationError(
                f"{where} presented a certificate for role {role!r}; this link accepts only "
                f"{', '.join(sorted(roles))}"
            )
    except PeerAuthenticationError:
        tls.close()
        raise
    return role


def require_security(identity: Identity | None, insecure: bool, what: str) -> None:
    """Refuse to run ``what`` without TLS identities unless plain TCP was asked for explicitly.

    Raises:
        ConfigError: Neither an identity nor ``insecure=True`` was given, or both were.
    """
    if identity is None and not insecure:
        raise ConfigError(
            f"{what} needs a TLS identity (mutual TLS with roles; for a trial create one with "
            "`python -m fedunlearn.mpc.identity DIR`), or insecure=True for " + INSECURE_WARNING
        )
    if identity is not None and insecure:
        raise ConfigError(f"{what}: give a TLS identity or insecure=True, not both")


# ---- a trial PKI ------------------------------------------------------------------------------


KEY_MODE = 0o600  # private keys: the owner only
CERT_MODE = 0o644  # certificates: readable, writable by the owner only
DIRECTORY_MODE = 0o700  # a directory this module creates


def _prepare_directory(out: Path, targets: Sequence[Path], overwrite: bool) -> None:
    """Create ``out`` (0700) or check it; refuse to replace any target without ``overwrite``.

    Raises:
        ConfigError: A target exists (or is a link) and ``overwrite`` is False, or ``out`` is
            another user's or group or others may access it (``check_private_directory``:
            anyone who can write there could swap the keys).
    """
    if not out.exists():
        out.mkdir(parents=True, mode=DIRECTORY_MODE)
        os.chmod(out, DIRECTORY_MODE)  # mkdir's mode is masked by the umask
    elif not out.is_dir():
        raise ConfigError(f"{out} is not a directory")
    check_private_directory(out)
    present = [t.name for t in targets if os.path.lexists(t)]
    if present and not overwrite:
        raise ConfigError(
            f"{out} already holds a CA's files ({', '.join(present)}); pass overwrite=True "
            "(--overwrite) to replace them"
        )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _alt_names(role: str, hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role_uri(role))]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def create_trial_pki(
    directory: str | Path,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    roles: Sequence[str] = ROLES,
    days: int = 30,
    overwrite: bool = False,
) -> dict[str, Identity]:
    """Create a fresh CA and one certificate per role in ``directory`` (for trials).

    Writes ``ca.pem``, ``ca.key`` and, per role, ``<role>.pem`` and ``<role>.key`` (ECDSA
    P-256, SHA-256; keys 0600 and certificates 0644 whatever the umask, each written to a fresh
    O_EXCL | O_NOFOLLOW temporary name and renamed into place; a directory it creates is 0700).
    Each certificate binds its role as ``urn:fedunlearn:role:<role>`` and lists ``hosts`` as
    DNS names or IP addresses; it allows client and server use.

    Args:
        directory: Where to write (created if missing).
        hosts: Host names and addresses the processes are reached at.
        roles: Roles to certify (default all four).
        days: Validity.
        overwrite: Replace existing files of the PKI in ``directory`` (without it, any one of
            them, or a link in its place, stops the call before anything is written).

    Returns:
        Role -> ``Identity``.

    Raises:
        ConfigError: ``directory`` already holds a file of the PKI and ``overwrite`` is False,
            it is writable by others, a role is unknown, or ``days`` is not positive.
    """
    for role in roles:
        _check_role(role)
    if days < 1:
        raise ConfigError(f"days must be >= 1; got {days}")
    out = Path(directory)
    names = ["ca.pem", "ca.key"] + [f"{role}.{ext}" for role in roles for ext in ("pem", "key")]
    _prepare_directory(out, [out / name for name in names], overwrite)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _trial_name(f"fedunlearn trial CA {os.urandom(4).hex()}")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    write_bytes_atomic(out / "ca.key", _key_pem(ca_key), KEY_MODE)
    write_bytes_atomic(out / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    identities = {}
    for role in roles:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            _builder(_trial_name(f"fedunlearn {role}"), ca_name, key.public_key(), start, end)
            .add_extension(x509.SubjectAlternativeName(_alt_names(role, hosts)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        write_bytes_atomic(out / f"{role}.key", _key_pem(key), KEY_MODE)
        write_bytes_atomic(
            out / f"{role}.pem", cert.public_bytes(serialization.Encoding.PEM), CERT_MODE
        )
        identities[role] = Identity(out / "ca.pem", out / f"{role}.pem", out / f"{role}.key", role)
    return identities


def _trial_name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedunlearn trial deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    start: datetime.datetime,
    end: datetime.datetime,
) -> x509.CertificateBuilder:
    """A certificate builder with names, key, a random serial and the validity window."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; a role's key signs and agrees keys (TLS)."""
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedunlearn.mpc.identity DIR``: a trial CA and one certificate per role."""
    parser = argparse.ArgumentParser(
        description="Create a local CA and per-role TLS certificates for a trial deployment."
    )
    parser.add_argument("directory")
    parser.add_argument("--hosts", default=",".join(DEFAULT_HOSTS), help="comma-separated")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        made = create_trial_pki(
            args.directory, hosts=hosts, days=args.days, overwrite=args.overwrite
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for role, identity in made.items():
        print(f"{role}: {identity.cert} (key {identity.key}), CA {identity.ca}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
