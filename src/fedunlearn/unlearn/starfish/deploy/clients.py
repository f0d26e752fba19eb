"""Starfish's simulated clients as a service: exact updates, each share only to its server.

In Stage II a server sometimes needs a remaining client's exact update at the public model
M_hat (warm-up rounds, flagged corrections, a client without a curvature pair). In a
deployment each client would train and send each server one additive share. Here one process,
the :class:`ClientSimulator`, plays all remaining clients; a server reaches it through
:class:`RemoteClients`, and ``remote.serve_clients`` runs the process. The simulator sees the
run's data and the public models, never dealer material or the servers' Stage I shares.

Who gets what (the oracle the old service was: it answered anyone who said ``{"party": k}``,
trained at whatever model the caller sent, and answered the first asker at once):

- **Authenticated servers.** Both servers join through ``mpc.accept_peers`` (role ``clients``,
  peers ``server0`` and ``server1``; with TLS the role is the one the certificate binds, each
  role joins once) with the session binding of the job (``binding.starfish_binding``). Server
  k's share goes only to the link of server k.
- **Both servers, identically.** The service reads one message from each server and acts only
  when the two are identical (same operation, round, client ids, model digest, and for a
  model the same bytes); any difference stops the session at both servers with the reason.
  Nothing is answered before both asked.
- **Models on the public trajectory.** A server announces each new M_hat before it asks at it
  (``model``); the first must be the run's M_0, at most T' + 1 models are accepted (one per
  replayed round and M_0), each finite and of the model's shape. Exact updates are trained
  only at the latest announced model.
- **Bounded requests.** Rounds strictly increase (each round's clients are asked once); the
  clients must be remaining participants of that round (public records).

Wire format over the link's ``TcpTransport``: JSON documents as uint8 frames (at most
``MAX_MESSAGE_BYTES``, parsed by ``mpc.wire``) and arrays whose dtype and shape the receiver
checks against the model: ``{"op": "model", "digest": d}`` + float64 (m,); ``{"op": "exact",
"round": r, "clients": [...], "model": d}``, answered by ``{"accepted": [...], "rejected":
[...], "reasons": [...]}`` (one reason per rejected client) and one uint64 (m,) share per
accepted client, or by ``{"error": reason}``; ``{"op": "bye"}``. Every message is a flat
object of scalars and lists (at most 4 arrays and objects: ``mpc.wire`` caps them).

Every field is checked by type and range before it is used, at both ends
(:func:`check_request`, :func:`check_answer`): exactly the fields of its message, client ids
and rounds JSON integers in range (never strings: ``int("²")`` raised ``ValueError`` and
``int("١٢") == 12``, issue 41), digests 64 lowercase hex digits, reasons one printable line of
bounded length. A message that fails is a ``MalformedFrameError`` naming the rule, which ends
the session at both servers (one line, exit 2).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-A (clients secret-share their uploads to two servers), Alg. 4 lines 15-24.
Deviations (docs/methods/starfish.md, SF24): the clients are simulated in one process (client
uploads with the real share distribution, as ``share_history`` is for Stage I, SF18); each
server still receives only its share of an exact update.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedunlearn.errors import (
    FedUnlearnError,
    MalformedFrameError,
    SecureComputationError,
)
from fedunlearn.fl.clients import Clients, TrainTask
from fedunlearn.fl.engine import screen_update
from fedunlearn.mpc import FixedPoint, Link, Party, Prg, TcpTransport
from fedunlearn.mpc.wire import parse_object, peer_text
from fedunlearn.unlearn.starfish.backend.ranges import StepRanges
from fedunlearn.unlearn.starfish.deploy.binding import PublicHistory

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ClientSimulator",
    "RemoteClients",
    "check_answer",
    "check_request",
    "model_digest",
    "remaining_participants",
    "recv_array",
    "recv_doc",
    "send_doc",
]

MAX_MESSAGE_BYTES = 1 << 20  # a JSON message: ids of up to ~100k clients
MAX_CLIENT_ID = (1 << 63) - 1  # client ids and rounds are JSON integers in [0, 2^63)
MAX_REASON_CHARS = 200  # a rejection reason (one printable line)
MAX_ERROR_CHARS = 2000  # the reason the service gives when it stops a session
_FIELDS = {  # the fields of each request, exactly
    "model": frozenset({"op", "digest"}),
    "exact": frozenset({"op", "round", "clients", "model"}),
    "bye": frozenset({"op"}),
}
_HEX_DIGITS = frozenset("0123456789abcdef")


def send_doc(transport: TcpTransport, doc: Mapping[str, Any]) -> None:
    """Send a small JSON document as one uint8 frame."""
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    transport.send(np.frombuffer(data, dtype=np.uint8).copy())


def recv_doc(transport: TcpTransport, peer: str) -> dict[str, Any]:
    """Receive a JSON object sent by :func:`send_doc` (at most ``MAX_MESSAGE_BYTES``).

    Raises:
        MalformedFrameError: Not a uint8 frame holding a JSON object.
    """
    frame = transport.recv(MAX_MESSAGE_BYTES)
    if frame.dtype != np.uint8 or frame.ndim != 1:
        raise MalformedFrameError(
            f"{peer} sent a {frame.dtype} frame of shape {frame.shape} where a JSON message belongs"
        )
    return parse_object(frame.tobytes(), peer, max_bytes=MAX_MESSAGE_BYTES)  # bounded (mpc.wire)


def recv_array(
    transport: TcpTransport, dtype: np.dtype, shape: tuple[int, ...], peer: str
) -> np.ndarray:
    """Receive an array of exactly ``dtype`` and ``shape`` (the cap is its size).

    Raises:
        MalformedFrameError: Another dtype or shape.
    """
    wanted = np.dtype(dtype)
    frame = transport.recv(wanted.itemsize * math.prod(shape))
    if frame.dtype != wanted or frame.shape != shape:
        raise MalformedFrameError(
            f"{peer} sent a {frame.dtype} array of shape {frame.shape}; expected {wanted} {shape}"
        )
    return frame


def remaining_participants(
    history: PublicHistory, remaining: Collection[int], num_rounds: int
) -> dict[int, list[int]]:
    """Round -> the remaining clients whose round-r update was accepted (public records)."""
    return {
        r: sorted(
            rec.client_id
            for rec in history.client_records(r)
            if rec.status == "accepted" and rec.client_id in remaining
        )
        for r in range(1, num_rounds + 1)
    }


def model_digest(model: np.ndarray) -> str:
    """SHA-256 of a float64 model's bytes (how both ends name a model)."""
    return hashlib.sha256(np.ascontiguousarray(model, dtype=np.float64).tobytes()).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id(value: Any) -> bool:
    """A client id or round: a JSON integer in [0, 2^63) (never a string, never a bool)."""
    return _is_int(value) and 0 <= value <= MAX_CLIENT_ID


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX_DIGITS


def _is_line(value: Any, limit: int) -> bool:
    """One printable line of at most ``limit`` characters."""
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def _fields(doc: Mapping[str, Any]) -> str:
    names = sorted(doc)
    shown = ", ".join(repr(name[:20]) for name in names[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def check_request(doc: Mapping[str, Any], where: str) -> str:
    """Check a server's request field by field (types and ranges); return its operation.

    Whether it is *answerable* (a round of this run, remaining participants, the latest
    model) is the service's check (``SecureComputationError``); this one is the form.

    Raises:
        MalformedFrameError: An unknown operation, missing or extra fields, a round or client
            id that is not a JSON integer in range, a client list that is not a list, or a
            digest that is not 64 lowercase hex digits.
    """
    op = doc.get("op")
    if not isinstance(op, str) or op not in _FIELDS:
        raise MalformedFrameError(
            f"{where} sent a request whose op is not one of {', '.join(_FIELDS)}"
        )
    if set(doc) != _FIELDS[op]:
        raise MalformedFrameError(
            f"{where} sent a {op!r} request with fields {_fields(doc)}; expected "
            f"{', '.join(sorted(_FIELDS[op]))}"
        )
    digests = [doc[key] for key in ("digest", "model") if key in doc]
    if not all(_is_digest(d) for d in digests):
        raise MalformedFrameError(
            f"{where} sent a {op!r} request whose model digest is not 64 lowercase hex digits"
        )
    if op == "exact":
        ids = doc["clients"]
        if not _is_id(doc["round"]):
            raise MalformedFrameError(
                f"{where} sent an 'exact' request whose round is not an integer in [0, 2^63)"
            )
        if not isinstance(ids, list) or not all(_is_id(c) for c in ids):
            raise MalformedFrameError(
                f"{where} sent an 'exact' request whose clients are not a list of integer "
                "client ids in [0, 2^63)"
            )
    return op


def check_answer(
    answer: Mapping[str, Any], ids: Sequence[int], where: str, round_: int
) -> tuple[list[int], dict[int, str]]:
    """Check the clients service's answer to a request for ``ids``, field by field.

    Returns:
        The accepted client ids (in the order their shares follow) and client id -> reason
        of each rejected one.

    Raises:
        SecureComputationError: The service stopped the session (``{"error": reason}``).
        MalformedFrameError: Anything else than exactly ``accepted`` and ``rejected`` (lists
            of integer ids that together name each requested client exactly once) and
            ``reasons`` (one per rejected client, each one printable line of at most
            ``MAX_REASON_CHARS``).
    """
    if set(answer) == {"error"}:
        reason = answer["error"]
        if not isinstance(reason, str) or len(reason) > MAX_ERROR_CHARS:
            raise MalformedFrameError(
                f"{where} stopped the session with a reason that is not a string of at most "
                f"{MAX_ERROR_CHARS} characters"
            )
        raise SecureComputationError(
            f"the clients service refused round {round_}: {peer_text(reason, MAX_ERROR_CHARS)}"
        )
    if set(answer) != {"accepted", "rejected", "reasons"}:
        raise MalformedFrameError(
            f"{where} answered with fields {_fields(answer)}; expected accepted, rejected and "
            "reasons, or error"
        )
    accepted, rejected, reasons = answer["accepted"], answer["rejected"], answer["reasons"]
    for name, value in (("accepted", accepted), ("rejected", rejected)):
        if not isinstance(value, list) or not all(_is_id(c) for c in value):
            raise MalformedFrameError(
                f"{where} answered {name!r} that is not a list of integer client ids"
            )
    if (
        not isinstance(reasons, list)
        or len(reasons) != len(rejected)
        or not all(_is_line(r, MAX_REASON_CHARS) for r in reasons)
    ):
        raise MalformedFrameError(
            f"{where} answered 'reasons' that are not one printable line of at most "
            f"{MAX_REASON_CHARS} characters per rejected client"
        )
    named = [*accepted, *rejected]
    if len(named) != len(ids) or sorted(named) != sorted(ids):
        raise MalformedFrameError(
            f"{where} answered for {len(accepted)} accepted and {len(rejected)} rejected "
            f"clients that are not the {len(ids)} clients asked for, each once"
        )
    return list(accepted), dict(zip(rejected, reasons, strict=True))


class RemoteClients:
    """A server's client gateway: exact updates arrive as this server's shares.

    Args:
        link: The authenticated link to the clients service (``mpc.connect_peer``).
        party: The server's party (to wrap the shares).
        num_params: m, the length of an update.
    """

    def __init__(self, link: Link, party: Party, num_params: int) -> None:
        self.link, self.party, self.num_params = link, party, int(num_params)
        self.transport: TcpTransport = link.transport
        self._head: str | None = None

    @property
    def link_bytes(self) -> dict[str, int]:
        """Bytes on the link so far: ``sent`` and ``received`` (frames, headers included)."""
        return {
            "sent": self.transport.wire_bytes_sent,
            "received": self.transport.wire_bytes_received,
        }

    def exact(
        self, m_hat: torch.Tensor, client_ids: list[int], round_: int
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Ask the clients for exact updates at the public ``m_hat``; receive shares.

        Raises:
            SecureComputationError: The service refused the request (its reason: e.g. the
                other server asked for something else).
            MalformedFrameError: The answer does not fit the request.
        """
        where = self.link.where
        model = np.ascontiguousarray(m_hat.detach().cpu().to(torch.float64).numpy())
        name = model_digest(model)
        if name != self._head:  # a new model on the trajectory: announce it first
            send_doc(self.transport, {"op": "model", "digest": name})
            self.transport.send(model)
            self._head = name
        ids = [int(c) for c in client_ids]
        request = {"op": "exact", "round": int(round_), "clients": ids, "model": name}
        send_doc(self.transport, request)
        accepted, rejected = check_answer(recv_doc(self.transport, where), ids, where, round_)
        shares = {
            cid: self.party.tensor(
                recv_array(self.transport, np.dtype(np.uint64), (self.num_params,), where)
            )
            for cid in accepted
        }
        return shares, rejected

    def close(self, goodbye: bool = True) -> None:
        """Say goodbye (after a finished run) and close the connection."""
        if goodbye:
            try:
                send_doc(self.transport, {"op": "bye"})
            except FedUnlearnError:
                pass
        self.transport.close(1.0 if goodbye else 0.0)


class ClientSimulator:
    """The remaining clients: answer both servers' identical requests, one share each.

    Args:
        clients: The run's remaining clients.
        scale: Pseudo-gradient scale of the method (``Starfish.scale``).
        fixed_point: Encoding of the shares.
        dtype: Parameter dtype of the run's model.
        initial_model: The run's M_0 (the first model of the trajectory).
        participants: Round r -> remaining clients whose round-r update was accepted (public).
        max_models: At most this many models on the trajectory (T' + 1).
        seed: Seed of the clients' masks (SecShare); None draws a fresh one.
    """

    def __init__(
        self,
        clients: Clients,
        scale: float,
        fixed_point: FixedPoint,
        dtype: torch.dtype,
        *,
        initial_model: torch.Tensor,
        participants: Mapping[int, Sequence[int]],
        max_models: int,
        seed: bytes | None = None,
    ) -> None:
        self.clients, self.scale, self.fixed_point = clients, scale, fixed_point
        self.dtype = dtype
        self.num_params = int(clients.num_params)
        self.prg = Prg(secrets.token_bytes(16) if seed is None else seed)
        self.participants = {int(r): frozenset(ids) for r, ids in participants.items()}
        self.max_models = int(max_models)
        self._first = np.ascontiguousarray(initial_model.detach().cpu().to(torch.float64).numpy())
        self.trajectory: list[str] = []  # digests of the accepted models, in order
        self._model: np.ndarray | None = None
        self._last_round = 0
        self.requests = 0

    # ---- one message from each server ---------------------------------------------------

    def _read(self, link: Link) -> tuple[dict[str, Any], np.ndarray | None]:
        where = link.where
        doc = recv_doc(link.transport, where)
        op = check_request(doc, where)
        frame = None
        if op == "model":
            frame = recv_array(link.transport, np.dtype(np.float64), (self.num_params,), where)
        return doc, frame

    def _refuse(self, reason: str) -> SecureComputationError:
        return SecureComputationError(f"the clients service refused the servers' request: {reason}")

    def _advance(self, doc: Mapping[str, Any], model: np.ndarray) -> None:
        """Accept a new model onto the trajectory (both servers announced it identically)."""
        if doc.get("digest") != model_digest(model):
            raise self._refuse("a model's digest does not match its bytes")
        if not np.all(np.isfinite(model)):
            raise self._refuse("the announced model is not finite")
        if not self.trajectory and not np.array_equal(model, self._first):
            raise self._refuse("the trajectory must start at the run's initial model M_0")
        if len(self.trajectory) >= self.max_models:
            raise self._refuse(
                f"more than {self.max_models} models announced (T' + 1: one per replayed round "
                "and M_0)"
            )
        self.trajectory.append(str(doc["digest"]))
        self._model = model

    def _check_exact(self, doc: Mapping[str, Any]) -> tuple[int, list[int]]:
        round_, ids = doc["round"], doc["clients"]  # integers in range (check_request)
        if round_ not in self.participants:
            raise self._refuse(f"round {round_} is not a round of this run")
        if round_ <= self._last_round:
            raise self._refuse(
                f"round {round_} after round {self._last_round}: rounds must increase (each "
                "round's clients are asked once)"
            )
        if not ids or ids != sorted(set(ids)):
            raise self._refuse(
                f"the {len(ids)} clients asked for are not a sorted list of distinct ids"
            )
        outside = sorted(set(ids) - self.participants[round_])
        if outside:
            raise self._refuse(
                f"clients {outside[:20]} are not remaining participants of round {round_}"
            )
        if self._model is None or doc.get("model") != self.trajectory[-1]:
            raise self._refuse("exact updates are trained only at the latest announced model")
        return round_, ids

    def _train(self, round_: int, ids: list[int]) -> dict[str, Any]:
        """Train the clients at the current model, encode, split; return both servers' parts."""
        params = torch.from_numpy(np.array(self._model)).to(self.dtype)
        accepted: list[int] = []
        rejected: list[int] = []  # client ids stay JSON integers (check_answer)
        reasons: list[str] = []
        shares: list[list[np.ndarray]] = [[], []]
        for update in self.clients.train(TrainTask(params, ids, round_)):
            reason = screen_update(update, self.num_params)
            if reason is not None:
                rejected.append(int(update.client_id))
                reasons.append(" ".join(reason.split())[:MAX_REASON_CHARS])
                continue
            gradient = update.delta.to(torch.float64).numpy() * self.scale
            StepRanges(self.fixed_point.frac_bits).check_client_values(gradient, "an exact update")
            encoded = self.fixed_point.encode(gradient)
            mask = self.prg.ring(encoded.shape)  # the client's SecShare
            accepted.append(int(update.client_id))
            shares[0].append(mask)
            shares[1].append(encoded - mask)
        return {"accepted": accepted, "rejected": rejected, "reasons": reasons, "shares": shares}

    # ---- the session ----------------------------------------------------------------------

    def serve(self, links: Mapping[str, Link]) -> int:
        """Serve both servers in lockstep until both say ``bye``; return requests answered.

        Raises:
            SecureComputationError: The servers asked for different things, or for something
                this service does not answer (both servers are told why).
            MalformedFrameError: A server sent a malformed message (both are told).
            PeerDisconnectedError: A server vanished (the other is told).
        """
        order = [links["server0"], links["server1"]]
        try:
            while True:
                (doc0, frame0), (doc1, frame1) = (self._read(link) for link in order)
                if doc0 != doc1:
                    raise self._refuse(f"server 0 sent {_brief(doc0)}, server 1 {_brief(doc1)}")
                op = doc0["op"]
                if op == "bye":
                    return self.requests
                if op == "model":
                    if frame0 is None or frame1 is None or frame0.tobytes() != frame1.tobytes():
                        raise self._refuse("the servers announced different models")
                    self._advance(doc0, frame0)
                    continue
                round_, ids = self._check_exact(doc0)
                answer = self._train(round_, ids)
                self._last_round = round_
                for k, link in enumerate(order):
                    send_doc(
                        link.transport,
                        {key: answer[key] for key in ("accepted", "rejected", "reasons")},
                    )
                    for array in answer["shares"][k]:
                        link.transport.send(np.ascontiguousarray(array, dtype=np.uint64))
                self.requests += 1
        except FedUnlearnError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            for link in order:
                try:
                    send_doc(link.transport, {"error": reason[:MAX_ERROR_CHARS]})
                except FedUnlearnError:
                    pass
            raise


def _brief(doc: Mapping[str, Any]) -> str:
    text = json.dumps(dict(doc), sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
