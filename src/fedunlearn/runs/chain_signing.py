"""A signed chain head: the server's ed25519 signature over its committed history's head.

``sign_head(run_dir, key)`` signs ``{"format", "run", "seq", "head", "signed_at"}`` (the run's
config fingerprint and the head of ``history.store.chain``) with an ed25519 private key (PEM
PKCS#8 or OpenSSH format, unencrypted), checked first like every private key of the project
(owned by the running user, mode 0600: ``mpc.key_files``). ``check_signed_head(doc, public_key,
run_dir)`` verifies the signature with the public key the auditor holds (OpenSSH
``ssh-ed25519 ...`` line or PEM) and that the signed head is a link of the run's chain.

What a signature adds to a head: a head alone is a hash anyone with the file can recompute
after rewriting the whole history; a head signed and handed out (to the leaving client, to a
regulator) binds the server: a history rewritten later no longer contains it, and the server
cannot deny having signed it. It proves nothing about what happened before the history was
written (a server that never stored an update commits to that). docs/verification.md,
"Committed history".
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedunlearn.errors import ConfigError, IntegrityError
from fedunlearn.history.digest import canonical_json
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc.key_files import check_private_key
from fedunlearn.runs.fingerprint import run_fingerprint
from fedunlearn.runs.rundir import HISTORY_DIR, load_run_config

__all__ = ["SIGNED_HEAD_FORMAT", "check_signed_head", "sign_head", "write_signed_head"]

SIGNED_HEAD_FORMAT = "fedunlearn-chain-head-v1"


def _load_private(key: Path) -> Ed25519PrivateKey:
    if not key.is_file():
        raise ConfigError(f"--sign {key}: no such key file")
    check_private_key(key)
    data = key.read_bytes()
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY"):
            loaded: Any = serialization.load_ssh_private_key(data, password=None)
        else:
            loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise ConfigError(
            f"--sign {key}: not an unencrypted PEM or OpenSSH private key ({err}); make one "
            "with: ssh-keygen -t ed25519 -N '' -f KEY"
        ) from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ConfigError(f"--sign {key}: not an ed25519 key ({type(loaded).__name__})")
    return loaded


def _load_public(key: Path) -> Ed25519PublicKey:
    if not key.is_file():
        raise ConfigError(f"--public-key {key}: no such file")
    data = key.read_bytes()
    try:
        if data.lstrip().startswith(b"ssh-"):
            loaded: Any = serialization.load_ssh_public_key(data.strip())
        else:
            loaded = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as err:
        raise ConfigError(f"--public-key {key}: not a PEM or OpenSSH public key ({err})") from None
    if not isinstance(loaded, Ed25519PublicKey):
        raise ConfigError(f"--public-key {key}: not an ed25519 key ({type(loaded).__name__})")
    return loaded


def _store_and_fingerprint(run_dir: Path) -> tuple[HistoryStore, str]:
    config = load_run_config(run_dir)
    store = HistoryStore.open(run_dir / HISTORY_DIR)
    try:
        fingerprint = run_fingerprint(config, store.generation(), store.last_round())
    except BaseException:
        store.close()
        raise
    return store, fingerprint


def sign_head(run_dir: str | Path, key: str | Path) -> dict[str, Any]:
    """Return the signed head of the run's committed history.

    Raises:
        ConfigError: The key is missing, readable by others, not ed25519, or the run has no
            committed history (written before it).
    """
    run_dir, key = Path(run_dir), Path(key)
    private = _load_private(key)
    store, fingerprint = _store_and_fingerprint(run_dir)
    with store:
        head = store.chain_head()
    if head is None:
        raise ConfigError(
            f"{run_dir} has no committed history (written before it): nothing to sign"
        )
    statement = {
        "format": SIGNED_HEAD_FORMAT,
        "run": fingerprint,
        "seq": head.seq,
        "head": head.link,
        "signed_at": time.time(),
    }
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return {
        "statement": statement,
        "signature": base64.b64encode(private.sign(canonical_json(statement))).decode("ascii"),
        "public_key": public.decode("ascii"),
    }


def write_signed_head(doc: dict[str, Any], out: str | Path) -> Path:
    """Write a signed head as JSON (mode 0644: it is public)."""
    out = Path(out)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return out


def check_signed_head(doc: Any, public_key: str | Path, run_dir: str | Path) -> dict[str, Any]:
    """Check a signed head with the auditor's public key and find it in the run's chain.

    Returns:
        The statement.

    Raises:
        ConfigError: Not a signed head, or an unreadable key.
        IntegrityError: The signature does not verify with this key, or the signed head is not
            a link of the run's chain (rewritten since, or another run).
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("statement"), dict):
        raise ConfigError("not a signed chain head (no 'statement'); pass what verify --sign wrote")
    statement = doc["statement"]
    if statement.get("format") != SIGNED_HEAD_FORMAT:
        raise ConfigError(f"not a signed chain head (format {statement.get('format')!r})")
    key = _load_public(Path(public_key))
    try:
        key.verify(base64.b64decode(str(doc.get("signature", ""))), canonical_json(statement))
    except (InvalidSignature, ValueError):
        raise IntegrityError(
            "the signed head's signature does not verify with this public key: forged, edited, "
            "or signed by another key"
        ) from None
    store, _ = _store_and_fingerprint(Path(run_dir))
    with store:
        link = store.chain_link(int(statement.get("seq", 0)))
    if link != statement.get("head"):
        raise IntegrityError(
            f"the signed head (link {statement.get('seq')}) is not in {run_dir}'s chain: the "
            "history was rewritten after it was signed, or it is another run's"
        )
    return dict(statement)
