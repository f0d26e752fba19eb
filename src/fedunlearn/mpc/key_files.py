"""Who may touch a deployment's key material: the running user only, as OpenSSH checks it.

Issue 41: the PKI directory check looked only at the world-write bit, so a directory owned by
another user or writable by a group was accepted (as that user, ``ca.pem`` was replaced and a
key moved away), and keys were loaded at any mode (0666 included). OpenSSH refuses a private
key that others may read and a ``~/.ssh`` that others may write; this module does the same
for the deployment's files, each refusal one ``ConfigError`` line with the command that fixes
it:

- ``check_private_directory``: a PKI directory (``--tls-dir``, ``starfish-certs``' target,
  ``starfish-local --tls-dir``) must be owned by the running user and closed to group and
  others (``chmod 700 DIR``);
- ``check_private_key``: a private key likewise (``chmod 600 KEY``);
- ``check_certificate_file``: a certificate (the CA's is the only trust anchor) must not be
  writable by group or others (``chmod 644 CERT``).

``identity.Identity`` applies them when it loads an identity; ``create_trial_pki`` to an
existing directory it writes into.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedunlearn.errors import ConfigError

__all__ = ["check_certificate_file", "check_private_directory", "check_private_key"]


def _owner_problem(info: os.stat_result) -> str | None:
    """Why a file's owner is not acceptable (None where ownership cannot be checked)."""
    if not hasattr(os, "geteuid"):  # pragma: no cover - not POSIX
        return None
    uid = os.geteuid()
    if info.st_uid != uid:
        return f"is owned by uid {info.st_uid}, not by the user running this process (uid {uid})"
    return None


def _check_private(path: Path, what: str, mode_fix: str, harm: str) -> None:
    """Refuse ``path`` unless the running user owns it and nobody else may access it."""
    info = path.stat()
    owner = _owner_problem(info)
    if owner is not None:
        raise ConfigError(
            f"{what} {path} {owner}: that user {harm}. Use one you own "
            f"(chown $USER {path}; chmod {mode_fix} {path})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{what} {path} has mode {mode:04o}: group or others may access it and {harm}. "
            f"Fix it with: chmod {mode_fix} {path}"
        )


def check_private_directory(directory: str | Path) -> None:
    """Refuse a PKI directory that another user owns or that group or others may access.

    Whoever can write there can replace ``ca.pem`` (the trust anchor) or a certificate, or move
    a key away; whoever can read or list it sees which keys it holds. As OpenSSH does for
    ``~/.ssh``.

    Raises:
        ConfigError: One line naming the directory, what is wrong and the command that fixes
            it (``chmod 700 DIR``; ``chown`` for the owner).
    """
    _check_private(
        Path(directory), "the PKI directory", "700", "could replace its CA certificate or keys"
    )


def check_private_key(key: str | Path) -> None:
    """Refuse a private key that another user owns or that group or others may access.

    Raises:
        ConfigError: One line naming the key and the command that fixes it (``chmod 600
            KEY``; ``chown`` for the owner).
    """
    _check_private(Path(key), "the private key", "600", "could read or replace it")


def check_certificate_file(cert: Path) -> None:
    """Refuse a certificate group or others may write (anyone could swap the trust anchor)."""
    mode = stat.S_IMODE(cert.stat().st_mode)
    if mode & 0o022:
        raise ConfigError(
            f"the certificate {cert} has mode {mode:04o}: group or others may replace it. "
            f"Fix it with: chmod 644 {cert}"
        )
