"""Federated learning substrate: client work, aggregation, attacks and the training loop."""

from fedunlearn.fl.aggregators import AGGREGATORS, make_aggregator
from fedunlearn.fl.attacks import Trigger, UpdateAttack, choose_malicious
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.clients import Clients, RunClients, TrainTask
from fedunlearn.fl.engine import RoundObserver, run_round, run_rounds, sample_clients
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientData, ClientUpdate, RejectedUpdate, RoundRecord

__all__ = [
    "AGGREGATORS",
    "ClientData",
    "ClientUpdate",
    "Clients",
    "Federation",
    "LocalTrainingSpec",
    "RejectedUpdate",
    "RoundObserver",
    "RoundRecord",
    "RunClients",
    "TrainTask",
    "Trigger",
    "UpdateAttack",
    "choose_malicious",
    "local_update",
    "make_aggregator",
    "run_round",
    "run_rounds",
    "sample_clients",
]
