"""Every registered central method: forgetting nobody, determinism, inputs untouched, exports."""

from __future__ import annotations

import pytest
import torch
from central_problems import pick_forget

import fedunlearn.central as central
from fedunlearn.central import available_methods, make_method
from fedunlearn.errors import UnknownMethodError

FAST = {"certified_removal": {"max_iter": 200}}


@pytest.mark.parametrize("name", available_methods())
def test_contract(logreg, name):
    objective, record = logreg
    iterates = record.iterates.clone()
    method = make_method(name, FAST.get(name, {}))
    nobody = method.unlearn(objective, record, torch.tensor([], dtype=torch.int64))
    assert torch.equal(nobody.params, method.original(objective, record))
    forget = pick_forget(600, 0.05)
    a = method.unlearn(objective, record, forget)
    b = make_method(name, FAST.get(name, {})).unlearn(objective, record, forget)
    assert torch.equal(a.params, b.params)
    assert torch.equal(record.iterates, iterates)
    assert a.wall_seconds >= 0 and a.stored_bytes >= 0 and a.method == name


def test_registry_and_exports():
    assert set(available_methods()) == {
        "amnesiac", "certified_removal", "deltagrad", "mini_unlearning", "original", "replay",
        "retrain",
    }  # fmt: skip
    for name in central.__all__:
        assert hasattr(central, name)
    with pytest.raises(UnknownMethodError, match="available: amnesiac"):
        make_method("mini_unlearnin")
