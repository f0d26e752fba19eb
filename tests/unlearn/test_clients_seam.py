"""The clients seam: every implementation has the members and the ``train(task)`` of ``Clients``.

Unlearning methods read only the protocol's members: run through clients that have nothing else,
every method gives the bit-identical result.
"""

import dataclasses
import importlib
import importlib.util
import inspect

import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import Clients, ClientsWrapper, RunClients, TrainTask
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, available_methods, make_method
from fedunlearn.unlearn.context import RemainingClients
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.deploy.servers import SharedClients
from fedunlearn.unlearn.starfish.deploy.shares import PublicClients, SharedStageOneRecord
from fedunlearn.unlearn.starfish.steps import StageOneRecord, StageOneShares

CLIENTS = ("client_ids", "spec", "num_params", "num_samples", "train")
RUN_CLIENTS = (*CLIENTS, "seed", "model")


def implementations() -> dict[str, type]:
    found = {
        "Federation": Federation,
        "RemainingClients": RemainingClients,
        "PublicClients": PublicClients,
        "SharedClients": SharedClients,
        "ClientsWrapper": ClientsWrapper,
    }
    if importlib.util.find_spec("flwr") is not None:  # the Flower extra is installed
        flower = importlib.import_module("fedunlearn.integrations.flower.driver")
        found["FlowerClients"] = flower.FlowerClients
    return found


class ProtocolOnly:
    """Clients with the members of ``fl.clients.RunClients`` and nothing else."""

    def __init__(self, clients: RunClients) -> None:
        self._clients = clients

    @property
    def client_ids(self) -> tuple[int, ...]:
        return self._clients.client_ids

    @property
    def spec(self) -> LocalTrainingSpec:
        return self._clients.spec

    @property
    def num_params(self) -> int:
        return self._clients.num_params

    @property
    def seed(self) -> int:
        return self._clients.seed

    @property
    def model(self) -> torch.nn.Module:
        return self._clients.model

    def num_samples(self, client_id: int) -> int:
        return self._clients.num_samples(client_id)

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        return self._clients.train(task)


def test_every_implementation_has_the_protocols_train():
    expected = inspect.signature(Clients.train)
    assert list(expected.parameters) == ["self", "task"]
    for name, cls in implementations().items():
        assert inspect.signature(cls.train) == expected, name


def test_the_in_process_remote_and_remaining_clients_are_run_clients(run_all):
    with UnlearnSession(run_all) as session:
        remaining = session.context(UnlearnRequest.of([1])).clients
        objects = {
            "Federation": session.federation,
            "RemainingClients": remaining,
            "SharedClients": SharedClients(remaining),
        }
        for name, obj in objects.items():
            assert all(hasattr(obj, member) for member in RUN_CLIENTS), name
        assert remaining.client_ids == (0, 2, 3, 4)
        assert remaining.seed == session.federation.seed
        assert not hasattr(remaining, "ids")  # one name for the remaining clients
    assert {m for m in RUN_CLIENTS if hasattr(RunClients, m)} == set(RUN_CLIENTS)


def test_a_starfish_servers_public_clients_are_run_clients_that_refuse_model_and_training():
    spec = LocalTrainingSpec()
    public = PublicClients([0, 2], {0: 10, 1: 5, 2: 7}, spec, num_params=4, seed=3)
    assert all(hasattr(type(public), m) or m in vars(public) for m in RUN_CLIENTS)
    assert public.client_ids == (0, 2)
    assert public.num_samples(1) == 5
    assert public.seed == 3
    with pytest.raises(ConfigError, match="cannot train clients"):
        public.train(TrainTask(torch.zeros(4), [0], 1, spec=spec, salt=1))
    with pytest.raises(ConfigError, match="holds no model"):
        _ = public.model


def test_both_stage_one_records_have_the_members_stage_two_reads(run_all):
    members = {"update", "norm", "threshold"}
    assert members <= {m for m in vars(StageOneShares) if not m.startswith("_")}
    assert "dtype" in StageOneShares.__annotations__
    for cls in (StageOneRecord, SharedStageOneRecord):
        assert all(callable(getattr(cls, m)) for m in members), cls.__name__
    with UnlearnSession(run_all) as session:
        backend = PlainBackend()
        record = StageOneRecord(session.run_view.store, backend, -1 / 0.3, 0.4)
        assert record.dtype == torch.float64
        shared = backend.reveal(record.update(1, 0), "test")
        assert torch.equal(shared, record.plain_update(1, 0))


@pytest.mark.parametrize("name", available_methods())
def test_methods_read_only_the_protocol_members_of_their_clients(name, run_all):
    with UnlearnSession(run_all) as session:
        request = UnlearnRequest.of([0])
        expected = session.run(make_method(name), request)
        context = session.context(request)
        narrow = dataclasses.replace(context, clients=ProtocolOnly(context.clients))
        got = make_method(name).unlearn(request, narrow)
    assert torch.equal(got.params, expected.params)
    assert got.costs.client_epochs == expected.costs.client_epochs
