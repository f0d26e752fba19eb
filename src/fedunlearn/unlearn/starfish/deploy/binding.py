"""What a Starfish deployment's links are bound to: the session id and digests of the job.

Every link of a deployment (server 0 - server 1, each server - the dealer, each server - the
clients) opens with a hello carrying ``starfish_binding``: the session id every process was
started with and five named digests of the job, compared field by field at both ends
(``mpc.SessionBinding``; a difference stops the link with ``SessionMismatchError`` naming the
fields):

- ``run_config``: the run's configuration (``config.yaml``) without the local data path;
- ``forget_set``: the sorted target client ids;
- ``method``: Starfish's algorithm parameters and the execution options that change the 2PC
  computation (``frac_bits``, ``comparison``, ``norm_range``);
- ``trajectory``: the public record of training, round 0..T: each global model M_r (bytes and
  dtype) and who took part with how many samples;
- ``share_store``: the Stage I sharing (``sharing_id``, a random id drawn when the clients'
  uploads were split, the same in both servers' stores, the settings it was made with, and
  ``payloads``: per server, one digest over the SHA-256 of every share payload it stores).
  The binding lasts beyond the handshake: a server reads each share through
  ``PayloadManifest.check``, which refuses a payload whose SHA-256 is not the one bound into
  the session, so a share edited after the handshake stops the server instead of changing
  the result.

A server computes the trajectory and sharing digests from its own share store, the clients
from the run's public history and ``RUN/starfish/sharing.json`` (what the clients know after
Stage I: they made the shares). The dealer sees only ``binding.for_dealer()`` (session id and
one digest over the five). ``check_deployable`` refuses options no deployment may run
(``comparison: ideal``).

What a binding reveals, and to whom: docs/security.md.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError, HistoryCorruptError, UnsupportedHistoryError
from fedunlearn.history.store import ClientRecord
from fedunlearn.mpc import SessionBinding, digest
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = [
    "JOB_FIELDS",
    "PAYLOAD_DIGESTS_KEY",
    "PayloadManifest",
    "SHARING_FILE",
    "check_deployable",
    "config_digest",
    "forget_digest",
    "method_digest",
    "new_sharing_id",
    "new_session_id",
    "read_sharing",
    "sharing_digest",
    "starfish_binding",
    "trajectory_digest",
    "write_sharing",
]

JOB_FIELDS = ("run_config", "forget_set", "method", "trajectory", "share_store")
SHARING_FILE = "sharing.json"  # RUN/starfish/sharing.json: the public side of Stage I
SHARING_KEYS = (
    "sharing_id",
    "frac_bits",
    "tolerance_rate",
    "units",
    "scale",
    "num_params",
    "payloads",
)
PAYLOAD_DIGESTS_KEY = "payload_digests"  # in a store's starfish_shares metadata: its manifest
_COMPUTATION_KEYS = ("frac_bits", "comparison", "norm_range")


class PublicHistory(Protocol):
    """What the trajectory digest reads: models and participant records per round."""

    def read_model(self, round: int, kind: str = "global") -> torch.Tensor: ...  # noqa: D102

    def client_records(self, round: int) -> list[ClientRecord]: ...  # noqa: D102


def check_deployable(method: Starfish) -> None:
    """Refuse options that only the in-process test backend may run.

    Raises:
        ConfigError: ``comparison: ideal``, whose trusted functionality would hand each server
            the other's share of d = x - y (so both would see d for every comparison, e.g.
            G^2 - delta^2 of every coordinate in SecTC).
    """
    if method.execution.comparison == "ideal":
        raise ConfigError(
            "comparison=ideal is refused in a deployment: its ideal functionality sends each "
            "server the other's share of every compared difference d = x - y, so both servers "
            "would learn d (G^2 - delta^2 of every coordinate in SecTC). It exists for "
            "in-process cost sweeps only (backend: mpc in `fedunlearn unlearn`); use "
            "comparison=real."
        )


def new_session_id(prefix: str = "starfish") -> str:
    """A fresh session id: ``<prefix>-<16 random hex digits>``."""
    return f"{prefix}-{secrets.token_hex(8)}"


def new_sharing_id() -> str:
    """A fresh Stage I sharing id (32 random hex digits)."""
    return secrets.token_hex(16)


def config_digest(config: RunConfig) -> str:
    """Digest of the run configuration, leaving out the local data directory."""
    doc = config.model_dump(mode="json")
    doc.get("data", {}).pop("data_dir", None)
    return digest(doc)


def forget_digest(forget: Iterable[int]) -> str:
    """Digest of the sorted target ids."""
    return digest(sorted(int(c) for c in forget))


def method_digest(method: Starfish) -> str:
    """Digest of the algorithm and of the execution options that change the 2PC computation."""
    execution = method.execution.model_dump(mode="json")
    return digest(
        {
            "params": method.params.model_dump(mode="json"),
            "execution": {key: execution[key] for key in _COMPUTATION_KEYS},
        }
    )


def trajectory_digest(history: PublicHistory, num_rounds: int) -> str:
    """Digest of the public training record: M_0..M_T and each round's participants.

    Raises:
        UnsupportedHistoryError: A round's model is missing.
    """
    hasher = hashlib.sha256()
    for r in range(num_rounds + 1):
        model = history.read_model(r).detach().cpu().contiguous()
        hasher.update(f"M{r}:{model.dtype}:{tuple(model.shape)}:".encode())
        hasher.update(model.numpy().tobytes())
        if r > 0:
            records = sorted(
                (rec.client_id, rec.status, rec.num_samples) for rec in history.client_records(r)
            )
            hasher.update(json.dumps(records).encode())
    return hasher.hexdigest()


def sharing_digest(sharing: Mapping[str, Any]) -> str:
    """Digest of a Stage I sharing (its id and settings).

    Raises:
        UnsupportedHistoryError: The record has no sharing id (made before sharing ids).
    """
    payloads = sharing.get("payloads")
    if not isinstance(sharing.get("sharing_id"), str) or not (
        isinstance(payloads, list) and len(payloads) == 2
    ):
        raise UnsupportedHistoryError(
            "these Stage I shares carry no sharing id or payload digests (made by an older "
            "version); re-share the run with `fedunlearn starfish-share RUN --force`"
        )
    return digest({key: sharing.get(key) for key in SHARING_KEYS})


class PayloadManifest:
    """The SHA-256 of every share payload one server stores, checked on every read.

    Made when the shares are written (``add`` per payload, then ``to_json`` into the store's
    metadata, ``root`` into both stores' and the clients' sharing record); a server rebuilds
    it from the sharing record its session is bound to (``of_sharing``), so the manifest and
    its root are the ones hashed into the binding at the handshake, not whatever the store
    holds later.
    """

    def __init__(self, digests: Mapping[str, str] | None = None) -> None:
        self.digests: dict[str, str] = dict(digests or {})

    @staticmethod
    def key(round_: int, client_id: int) -> str:
        """The manifest key of one payload."""
        return f"{int(round_)}:{int(client_id)}"

    @staticmethod
    def payload_digest(payload: torch.Tensor) -> str:
        """SHA-256 of a share payload's stored bytes."""
        return hashlib.sha256(payload.detach().contiguous().numpy().tobytes()).hexdigest()

    def add(self, round_: int, client_id: int, payload: torch.Tensor) -> None:
        """Record one payload's digest."""
        self.digests[self.key(round_, client_id)] = self.payload_digest(payload)

    def root(self) -> str:
        """One digest over all payload digests (what the session binding carries)."""
        return digest(dict(self.digests))

    def to_json(self) -> dict[str, str]:
        """The manifest as JSON (sorted keys)."""
        return dict(sorted(self.digests.items()))

    @classmethod
    def of_sharing(cls, sharing: Mapping[str, Any], party_id: int) -> PayloadManifest:
        """The manifest of ``party_id`` in a store's sharing record, checked against its root.

        Raises:
            UnsupportedHistoryError: The record has no manifest (an older version made it).
            HistoryCorruptError: The manifest does not hash to the record's root for this
                server: the store's metadata was changed after Stage I.
        """
        digests, roots = sharing.get(PAYLOAD_DIGESTS_KEY), sharing.get("payloads")
        if not isinstance(digests, dict) or not isinstance(roots, list) or len(roots) != 2:
            raise UnsupportedHistoryError(
                "this share store carries no payload digests (made by an older version); "
                "re-share the run with `fedunlearn starfish-share RUN --force`"
            )
        manifest = cls(digests)
        if manifest.root() != roots[party_id]:
            raise HistoryCorruptError(
                f"server {party_id}'s share store lists payload digests that do not match the "
                "sharing it is bound to: the store was changed after Stage I. Nothing was "
                "opened; re-share the run (`fedunlearn starfish-share RUN --force`)."
            )
        return manifest

    def check(self, round_: int, client_id: int, payload: torch.Tensor) -> None:
        """Refuse a payload whose SHA-256 is not the one bound into the session.

        Raises:
            HistoryCorruptError: Missing from the manifest, or its bytes changed.
        """
        expected = self.digests.get(self.key(round_, client_id))
        if expected is None or self.payload_digest(payload) != expected:
            raise HistoryCorruptError(
                f"round {round_} client {client_id}: this server's stored share is not the one "
                "bound into the session (SHA-256 differs): the share store was changed after "
                "Stage I or during the session. Nothing was opened from it; re-share the run "
                "(`fedunlearn starfish-share RUN --force`) and start a new session."
            )


def write_sharing(run_dir: str | Path, info: Mapping[str, Any]) -> Path:
    """Write ``RUN/starfish/sharing.json`` (the sharing's public side) and return its path."""
    path = Path(run_dir) / "starfish" / SHARING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({key: info.get(key) for key in SHARING_KEYS}, sort_keys=True))
    tmp.replace(path)
    return path


def read_sharing(run_dir: str | Path) -> dict[str, Any]:
    """Read ``RUN/starfish/sharing.json``.

    Raises:
        ConfigError: The file is missing or unreadable.
    """
    path = Path(run_dir) / "starfish" / SHARING_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"cannot read {path} ({exc}); share the run with `fedunlearn starfish-share RUN`"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a JSON object; re-share with --force")
    return doc


def starfish_binding(
    session_id: str,
    *,
    config: RunConfig,
    forget: Iterable[int],
    method: Starfish,
    history: PublicHistory,
    sharing: Mapping[str, Any],
) -> SessionBinding:
    """The binding of one Starfish job, the same at both servers and the clients.

    Args:
        session_id: The id every process of the session was started with.
        config: The run's configuration.
        forget: The targets.
        method: The Starfish options of the request.
        history: A store with the public models and participant records (a server's share
            store, or the run's history at the clients).
        sharing: The Stage I sharing record (a share store's ``starfish_shares`` metadata, or
            ``read_sharing``).

    Raises:
        ConfigError: A malformed session id.
        UnsupportedHistoryError: A model is missing, or the shares carry no sharing id.
    """
    digests = {
        "run_config": config_digest(config),
        "forget_set": forget_digest(forget),
        "method": method_digest(method),
        "trajectory": trajectory_digest(history, config.training.rounds),
        "share_store": sharing_digest(sharing),
    }
    try:
        return SessionBinding(session_id, digests)
    except ValueError as exc:
        raise ConfigError(f"bad --session: {exc}") from None
