"""``fl.clients``: the training request value and the pass-through wrapper of the clients seam."""

import dataclasses

import numpy as np
import pytest
import torch
from tests.fl.test_federation import SPEC, make_federation

from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import ClientsWrapper, RunClients, TrainTask


def test_a_train_task_holds_int_ids_in_order_and_takes_spec_and_salt_by_keyword():
    task = TrainTask(torch.zeros(3), np.array([4, 1]), 2, salt=7)
    assert task.client_ids == (4, 1)
    assert all(type(c) is int for c in task.client_ids)
    assert (task.round, task.spec, task.salt) == (2, None, 7)
    with pytest.raises(TypeError):
        TrainTask(torch.zeros(3), [1], 1, LocalTrainingSpec())  # spec is keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.salt = 0  # type: ignore[misc]


def test_a_train_tasks_spec_overrides_the_clients_default():
    short = dataclasses.replace(SPEC, epochs=3)
    assert TrainTask(torch.zeros(1), [0], 1).local_spec(SPEC) is SPEC
    assert TrainTask(torch.zeros(1), [0], 1, spec=short).local_spec(SPEC) is short


def test_a_wrapper_passes_every_member_and_the_training_through():
    fed = make_federation()
    wrapper: RunClients = ClientsWrapper(fed)
    assert wrapper.client_ids == fed.client_ids
    assert (wrapper.spec, wrapper.num_params, wrapper.seed) == (fed.spec, fed.num_params, fed.seed)
    assert wrapper.model is fed.model
    assert [wrapper.num_samples(c) for c in fed.client_ids] == [8, 8, 8]
    task = TrainTask(torch.zeros(fed.num_params), [2, 0], 4, salt=1)
    for got, want in zip(wrapper.train(task), fed.train(task), strict=True):
        assert got.client_id == want.client_id
        assert torch.equal(got.delta, want.delta)


def test_a_wrapper_that_overrides_train_changes_only_the_training():
    class Salted(ClientsWrapper):
        def train(self, task):
            return self._wrapped.train(dataclasses.replace(task, salt=task.salt + 9))

    fed = make_federation()
    salted = Salted(fed)
    task = TrainTask(torch.zeros(fed.num_params), [0], 1)
    assert torch.equal(
        salted.train(task)[0].delta, fed.train(dataclasses.replace(task, salt=9))[0].delta
    )
    assert not torch.equal(salted.train(task)[0].delta, fed.train(task)[0].delta)
    assert salted.client_ids == fed.client_ids
