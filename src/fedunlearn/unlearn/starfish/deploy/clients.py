"""Starfish's simulated clients as a service: fresh exact updates, secret-shared to the servers.

In Stage II a server sometimes needs a remaining client's exact update at the public model
M_hat (warm-up rounds, flagged corrections, a client without a curvature pair). In a
deployment each client would train and send each server one additive share. Here one process,
the :class:`ClientSimulator`, plays all remaining clients: it opens the run, trains a client
once when both servers ask for it (same round, same ids, same model) and sends server k only
its share (server 0 a uniform mask r, server 1 the encoded update minus r). A server reaches
it through :class:`RemoteClients`; ``starfish_remote.serve_clients`` runs the process. The
simulator sees the run's data and the public models, never dealer material or the servers'
Stage I shares; the correlated randomness comes from the ``mpc`` dealer
(``mpc.dealer_service``), a separate process.

Protocol over one ``TcpTransport`` per server (JSON headers are uint8 frames): the server says
``{"party": k}``; then per request ``{"op": "exact", "args": [round, ids]}`` and the model
(float64), answered by ``{"accepted": [...], "rejected": {id: reason}}`` and one uint64 share
per accepted client; ``{"op": "bye"}`` ends the session.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-A (clients secret-share their uploads to two servers), Alg. 4 lines 15-24.
Deviations (docs/methods/starfish.md, D24): the clients are simulated in one process (client
uploads with the real share distribution, as ``share_history`` is for Stage I, D18); each
server still receives only its share of an exact update.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

import numpy as np
import torch

from fedunlearn.errors import PeerDisconnectedError, SecureComputationError
from fedunlearn.fl.engine import screen_update
from fedunlearn.mpc import FixedPoint, Party, Prg, TcpTransport
from fedunlearn.unlearn.context import RemainingClients

__all__ = ["ClientSimulator", "RemoteClients", "recv_json", "send_json"]


def send_json(transport: TcpTransport, doc: dict[str, Any]) -> None:
    """Send a small JSON document as one uint8 frame."""
    transport.send(np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8).copy())


def recv_json(transport: TcpTransport) -> dict[str, Any]:
    """Receive a JSON document sent by :func:`send_json`."""
    frame = transport.recv()
    if frame.dtype != np.uint8:
        raise SecureComputationError(f"expected a JSON header frame; got dtype {frame.dtype}")
    return json.loads(frame.tobytes().decode())


def _total_bytes(transport: TcpTransport) -> int:
    snapshot = transport.counters.snapshot()
    return sum(t["bytes_sent"] + t["bytes_received"] for t in snapshot.values())


class RemoteClients:
    """A server's client gateway: exact updates arrive as this server's shares.

    Args:
        transport: Connection to the client simulator (``hello`` is sent on construction).
        party: The server's party (to wrap the shares).
    """

    def __init__(self, transport: TcpTransport, party: Party) -> None:
        self.transport, self.party = transport, party
        send_json(transport, {"party": party.party_id})

    @property
    def link_bytes(self) -> int:
        """Bytes sent and received on the connection so far (headers, models, shares)."""
        return _total_bytes(self.transport)

    def exact(
        self, m_hat: torch.Tensor, client_ids: list[int], round_: int
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Ask the clients for exact updates at the public ``m_hat``; receive shares."""
        send_json(self.transport, {"op": "exact", "args": [round_, client_ids]})
        self.transport.send(m_hat.detach().cpu().to(torch.float64).numpy())
        header = recv_json(self.transport)
        if "error" in header:
            raise SecureComputationError(f"the clients failed in round {round_}: {header['error']}")
        accepted = [int(c) for c in header["accepted"]]
        arrays = [self.transport.recv() for _ in accepted]
        shares = {
            cid: self.party.tensor(np.array(a, dtype=np.uint64))
            for cid, a in zip(accepted, arrays, strict=True)
        }
        rejected = {int(c): str(reason) for c, reason in header["rejected"].items()}
        return shares, rejected

    def close(self) -> None:
        """Say goodbye and close the connection."""
        try:
            send_json(self.transport, {"op": "bye"})
        except PeerDisconnectedError:
            pass
        self.transport.close()


class ClientSimulator:
    """The remaining clients: train once per request, encode, split, hand out one share each.

    Args:
        clients: The run's remaining clients.
        scale: Pseudo-gradient scale of the method (``Starfish.scale``).
        fixed_point: Encoding of the shares.
        seed: Seed of the clients' masks (SecShare).
        dtype: Parameter dtype of the run's model.
    """

    def __init__(
        self,
        clients: RemainingClients,
        scale: float,
        fixed_point: FixedPoint,
        seed: bytes,
        dtype: torch.dtype,
    ) -> None:
        self.clients, self.scale, self.fixed_point = clients, scale, fixed_point
        self.dtype = dtype
        self.prg = Prg(seed)
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, tuple[int, ...], str], dict[str, Any]] = {}

    def exact(
        self, party_id: int, round_: int, client_ids: list[int], model: np.ndarray
    ) -> dict[str, Any]:
        """Return party ``party_id``'s answer; the first of the two requests trains."""
        key = (round_, tuple(client_ids), hashlib.sha256(model.tobytes()).hexdigest())
        with self._lock:
            entry = self._pending.get(key)
            if entry is None:
                params = torch.from_numpy(np.array(model)).to(self.dtype)
                accepted: list[int] = []
                rejected: dict[str, str] = {}
                shares: list[list[np.ndarray]] = [[], []]
                for update in self.clients.train(params, client_ids, round_):
                    reason = screen_update(update, self.clients.num_params)
                    if reason is not None:
                        rejected[str(update.client_id)] = reason
                        continue
                    gradient = update.delta.to(torch.float64).numpy() * self.scale
                    encoded = self.fixed_point.encode(gradient)
                    mask = self.prg.ring(encoded.shape)  # the client's SecShare
                    accepted.append(update.client_id)
                    shares[0].append(mask)
                    shares[1].append(encoded - mask)
                entry = {"accepted": accepted, "rejected": rejected, "shares": shares, "left": 2}
                self._pending[key] = entry
            entry["left"] -= 1
            if entry["left"] == 0:
                del self._pending[key]
        return {
            "accepted": entry["accepted"],
            "rejected": entry["rejected"],
            "arrays": entry["shares"][party_id],
        }

    def serve(self, transport: TcpTransport, party_id: int) -> int:
        """Answer one server's requests until it says ``bye``; return how many were served."""
        served = 0
        while True:
            header = recv_json(transport)
            if header.get("op") == "bye":
                return served
            if header.get("op") != "exact":
                raise SecureComputationError(f"unknown client request {header!r}; allowed: exact")
            model = transport.recv()
            round_, ids = int(header["args"][0]), [int(c) for c in header["args"][1]]
            answer = self.exact(party_id, round_, ids, model)
            arrays = answer.pop("arrays")
            send_json(transport, answer)
            for array in arrays:
                transport.send(np.ascontiguousarray(array, dtype=np.uint64))
            served += 1
