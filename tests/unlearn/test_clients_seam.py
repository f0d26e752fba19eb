"""The clients seam: every implementation has the members and the ``train`` of ``Clients``."""

import inspect

import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import Clients, RunClients
from fedunlearn.fl.federation import Federation
from fedunlearn.unlearn.context import RemainingClients
from fedunlearn.unlearn.starfish.deploy.shares import PublicClients

CLIENTS = ("client_ids", "spec", "num_params", "num_samples", "train")
RUN_CLIENTS = (*CLIENTS, "seed", "model")


def implementations() -> dict[str, type]:
    found = {
        "Federation": Federation,
        "RemainingClients": RemainingClients,
        "PublicClients": PublicClients,
    }
    flower = pytest.importorskip("fedunlearn.integrations.flower.driver")
    found["FlowerClients"] = flower.FlowerClients
    return found


def test_every_implementation_has_the_protocols_train():
    expected = inspect.signature(Clients.train)
    for name, cls in implementations().items():
        assert inspect.signature(cls.train) == expected, name


def test_the_in_process_remote_and_remaining_clients_are_run_clients(run_all):
    from fedunlearn.unlearn import UnlearnRequest, UnlearnSession

    with UnlearnSession(run_all) as session:
        remaining = session.context(UnlearnRequest.of([1])).clients
        objects = {"Federation": session.federation, "RemainingClients": remaining}
        for name, obj in objects.items():
            assert all(hasattr(obj, member) for member in RUN_CLIENTS), name
        assert remaining.client_ids == (0, 2, 3, 4)
        assert remaining.seed == session.federation.seed
    assert {m for m in RUN_CLIENTS if hasattr(RunClients, m)} == set(RUN_CLIENTS)


def test_a_starfish_servers_public_clients_are_clients_that_refuse_to_train():
    spec = LocalTrainingSpec()
    public = PublicClients([0, 2], {0: 10, 1: 5, 2: 7}, spec, num_params=4)
    assert all(hasattr(public, member) for member in CLIENTS)
    assert public.client_ids == (0, 2)
    assert public.num_samples(1) == 5
    with pytest.raises(ConfigError, match="cannot train clients"):
        public.train(None, [0], 1, spec=spec, salt=1)
