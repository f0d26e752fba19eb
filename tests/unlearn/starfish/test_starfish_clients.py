"""The clients service's rules, over real sockets in this process (processes: test_*_deploy).

Issue 15 found the old service to be a plaintext-gradient oracle: it answered whoever claimed
a party, trained at any model the caller sent and answered the first asker at once. Each test
plays the two servers on the wire against one ``ClientSimulator``.
"""

from __future__ import annotations

import math
import select
import socket
import threading

import numpy as np
import pytest
import torch
from starfish_support import FORGET, LR, ROUNDS

from fedunlearn.errors import SecureComputationError
from fedunlearn.fl.clients import TrainTask
from fedunlearn.mpc import FixedPoint, Link, SessionBinding, TcpTransport
from fedunlearn.mpc.session import Hello
from fedunlearn.unlearn.starfish.deploy.clients import (
    ClientSimulator,
    model_digest,
    recv_array,
    recv_doc,
    send_doc,
)

TIMEOUT = 10.0
FP = FixedPoint(16)
SCALE = -1.0 / LR


class Service:
    """A ClientSimulator serving two socket pairs in a thread; the test holds the servers' ends."""

    def __init__(self, session, max_models=None):
        context = session.context(FORGET)
        self.context = context
        remaining = set(context.clients.client_ids)
        self.participants = {
            r: sorted(
                rec.client_id
                for rec in session.run_view.store.client_records(r)
                if rec.status == "accepted" and rec.client_id in remaining
            )
            for r in range(1, ROUNDS + 1)
        }
        self.simulator = ClientSimulator(
            context.clients,
            SCALE,
            FP,
            context.initial_params.dtype,
            initial_model=context.initial_params,
            participants=self.participants,
            max_models=max_models or math.ceil(0.6 * ROUNDS) + 1,
        )
        self.m0 = context.initial_params.to(torch.float64).numpy()
        self.servers, links = [], {}
        for k in (0, 1):
            ours, theirs = socket.socketpair()
            self.servers.append(TcpTransport(theirs, k, TIMEOUT))
            hello = Hello(f"server{k}", SessionBinding.unbound(), {})
            links[f"server{k}"] = Link(TcpTransport(ours, 0, TIMEOUT), f"server{k}", hello, True)
        self.outcome = {}
        self.thread = threading.Thread(target=self._run, args=(links,), daemon=True)
        self.thread.start()

    def _run(self, links):
        try:
            self.outcome["served"] = self.simulator.serve(links)
        except Exception as exc:  # reported to the test
            self.outcome["error"] = exc

    def model(self, k, model):
        send_doc(self.servers[k], {"op": "model", "digest": model_digest(model)})
        self.servers[k].send(np.ascontiguousarray(model, dtype=np.float64))

    def exact(self, k, round_, ids, model):
        doc = {"op": "exact", "round": round_, "clients": ids, "model": model_digest(model)}
        send_doc(self.servers[k], doc)

    def answer(self, k, m):
        doc = recv_doc(self.servers[k], "clients")
        if "error" in doc:
            return doc, []
        shares = [
            recv_array(self.servers[k], np.dtype(np.uint64), (m,), "clients")
            for _ in doc["accepted"]
        ]
        return doc, shares

    def finish(self):
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()
        for transport in self.servers:
            transport.close()
        return self.outcome


def readable(transport, seconds):
    return bool(select.select([transport.fileno()], [], [], seconds)[0])


def test_an_exact_update_goes_out_only_after_both_servers_asked_and_opens_only_together(session):
    # Prepare
    service = Service(session)
    round_ = 1
    ids = service.participants[round_]
    m = service.context.clients.num_params

    # Execute: server 0 announces M_0 and asks; nothing comes back until server 1 asks too
    service.model(0, service.m0)
    service.exact(0, round_, ids, service.m0)
    silent_before_both = not readable(service.servers[0], 0.5)
    service.model(1, service.m0)
    service.exact(1, round_, ids, service.m0)
    (doc0, shares0), (doc1, shares1) = service.answer(0, m), service.answer(1, m)
    for k in (0, 1):
        send_doc(service.servers[k], {"op": "bye"})
    outcome = service.finish()

    # Assert
    assert silent_before_both
    assert doc0 == doc1 == {"accepted": ids, "rejected": [], "reasons": []}
    assert outcome == {"served": 1}
    m0 = torch.from_numpy(service.m0).to(service.context.initial_params.dtype)
    expected = service.context.clients.train(TrainTask(m0, ids, round_))
    for update, s0, s1 in zip(expected, shares0, shares1, strict=True):
        opened = FP.decode(s0 + s1)
        np.testing.assert_allclose(opened, update.delta.double().numpy() * SCALE, atol=1e-4)
        assert abs(np.corrcoef(FP.decode(s0)[:20], opened[:20])[0, 1]) < 0.9  # one share: noise


@pytest.mark.parametrize(
    "second",
    [
        {"round": 1, "clients": "fewer"},  # server 1 asks for other clients
        {"round": 2, "clients": "same"},  # ... or another round
    ],
    ids=["other_clients", "other_round"],
)
def test_differing_requests_stop_the_session_at_both_servers_with_nothing_answered(session, second):
    service = Service(session)
    ids = service.participants[1]
    other = ids[:-1] if second["clients"] == "fewer" else ids
    for k in (0, 1):
        service.model(k, service.m0)
    service.exact(0, 1, ids, service.m0)
    service.exact(1, second["round"], other, service.m0)
    answers = [service.answer(k, 0) for k in (0, 1)]
    outcome = service.finish()
    for doc, shares in answers:
        assert "server 0 sent" in doc["error"]
        assert not shares
    assert isinstance(outcome["error"], SecureComputationError)


def bad_request(service, case):
    """Return (model to announce, round, client ids) of a request the service must refuse."""
    ids = service.participants[3]
    if case == "model_off_trajectory":  # "trains at whatever model the caller sends"
        return service.m0 + 0.5, 3, ids
    if case == "target_client":  # a forgotten client is not a remaining participant
        return service.m0, 3, sorted([*ids, 0])
    if case == "unsorted":
        return service.m0, 3, ids[::-1]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["model_off_trajectory", "target_client", "unsorted"])
def test_requests_outside_the_public_trajectory_or_participants_are_refused(session, case):
    service = Service(session)
    model, round_, ids = bad_request(service, case)
    for k in (0, 1):
        service.model(k, model)
        service.exact(k, round_, ids, model)
    answers = [service.answer(k, 0)[0] for k in (0, 1)]
    outcome = service.finish()
    assert all("refused" in doc["error"] for doc in answers), answers
    assert isinstance(outcome["error"], SecureComputationError)


def test_each_round_is_answered_once_and_models_are_bounded(session):
    # Prepare: at most two models on the trajectory
    service = Service(session, max_models=2)
    m = service.context.clients.num_params
    first, later = service.participants[2], service.participants[3]

    # Execute: round 2 at M_0 is answered; round 2 again is refused
    for k in (0, 1):
        service.model(k, service.m0)
        service.exact(k, 2, first, service.m0)
    answered = [service.answer(k, m)[0] for k in (0, 1)]
    for k in (0, 1):
        service.exact(k, 2, first, service.m0)
    repeated = [service.answer(k, 0)[0] for k in (0, 1)]
    outcome = service.finish()

    # Assert
    assert answered[0] == answered[1] == {"accepted": first, "rejected": [], "reasons": []}
    assert all("rounds must increase" in doc["error"] for doc in repeated)
    assert isinstance(outcome["error"], SecureComputationError)

    # a third model is refused when two are allowed
    service = Service(session, max_models=2)
    for step in (0.0, 0.01, 0.02):
        for k in (0, 1):
            service.model(k, service.m0 + step if step else service.m0)
    for k in (0, 1):
        service.exact(k, 3, later, service.m0 + 0.02)
    refused = [service.answer(k, 0)[0] for k in (0, 1)]
    assert all("more than 2 models" in doc["error"] for doc in refused)
    assert isinstance(service.finish()["error"], SecureComputationError)


def test_an_exact_update_outside_the_ring_range_is_refused_before_sharing(session):
    # Issue 25: the clients service checks every exact update against the steps' ring range
    # in the clear before encoding; a boosted update stops the session with the steps named,
    # no share and no coordinate leaves the service
    service = Service(session)
    service.simulator.scale = SCALE * 1e9  # every gradient coordinate far past 2^15 at f = 16
    round_ = 1
    ids = service.participants[round_]
    m = service.context.clients.num_params

    for k in (0, 1):
        service.model(k, service.m0)
        service.exact(k, round_, ids, service.m0)
    answers = [service.answer(k, m) for k in (0, 1)]
    outcome = service.finish()

    assert isinstance(outcome.get("error"), SecureComputationError), outcome
    for doc, shares in answers:
        assert shares == []
        text = doc["error"]
        assert "does not fit the 2PC ring" in text, text
        assert "TD^2 and SecTC" in text, text
        assert "\n" not in text, text
        assert "e+" not in text.split("f = 16")[0], text
