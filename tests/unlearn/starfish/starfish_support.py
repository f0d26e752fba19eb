"""Helpers of the Starfish tests: the shared convex run's constants, a numpy ranking, TLS files."""

from __future__ import annotations

import datetime

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedunlearn.mpc import run_two_party
from fedunlearn.unlearn import UnlearnRequest
from fedunlearn.unlearn.starfish.deploy.remote import Tls

# The shared convex run (tests/unlearn/conftest.py CONVEX_RUN): L2-regularised LR on non-IID
# blobs, strongly convex.
ROUNDS = 12
WEIGHT_DECAY = 1e-3
LR = 0.05
FORGET = UnlearnRequest.of([0, 1])
REMAINING = (2, 3, 4, 5)
BIT_EXACT = {"selection_rate": 1.0, "precision": "model", "units": "delta"}


def small_run_config(seed, rounds):
    """A small convex run for the process tests: logreg on 3-class blobs, 5 Dirichlet clients."""
    return {
        "seed": seed,
        "data": {
            "dataset": "synthetic",
            "num_clients": 5,
            "partition": "dirichlet",
            "alpha": 0.5,
            "options": {"num_samples": 400, "num_features": 10, "num_classes": 3},
        },
        "model": {"name": "logreg"},
        "training": {
            "rounds": rounds,
            "local_epochs": 2,
            "lr": 0.05,
            "batch_size": 40,
            "weight_decay": 1e-3,
            "executor": "serial",
        },
        "history": {"policy": "all"},
    }


def cosine_ranking(session, targets, rounds=range(1, ROUNDS + 1)):
    """Plain numpy ranking of rounds by cos(sum of target deltas, M_r - M_{r-1})."""
    scores = []
    for r in rounds:
        g = sum(session.store.read_update(r, t).double().numpy() for t in targets)
        y = (session.store.read_model(r) - session.store.read_model(r - 1)).double().numpy()
        scores.append(g @ y / (np.linalg.norm(g) * np.linalg.norm(y)))
    order = np.argsort(-np.asarray(scores), kind="stable")
    return [list(rounds)[i] for i in order]


def two_party(program, **kwargs):
    """Run ``program(party)`` as both 2PC parties with fixed dealer and local seeds."""
    return run_two_party(program, dealer_seed=3, local_seed=3, **kwargs)


def _name(text):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _build(subject, issuer, public_key, signing_key, is_ca):
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
    ca = _build(_name(f"{label} CA"), _name(f"{label} CA"), ca_key.public_key(), ca_key, True)
    leaf = _build(_name(f"{label} server"), ca.subject, leaf_key.public_key(), ca_key, False)
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
