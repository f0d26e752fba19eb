"""The centralised methods are plugins like the federated ones (issue 38, item 6).

Entry points come from this repository's pyproject.toml (``repository_entry_points``), not from
the installed metadata, so the tests check what an install of this checkout declares.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from central_problems import pick_forget
from pydantic import BaseModel, ConfigDict, Field
from tests.support import plugins as plugin_support
from tests.support.plugins import repository_entry_points

from fedunlearn.central import registry as central
from fedunlearn.central.base import CentralUnlearner, Outcome
from fedunlearn.central.objectives import Objective
from fedunlearn.central.trainer import TrainingRecord
from fedunlearn.errors import PluginError, UnknownMethodError
from fedunlearn.plugins import Plugin, resolve

fake_entry_points = plugin_support.fake_entry_points

BASELINES = ["amnesiac", "certified_removal", "deltagrad", "original", "replay", "retrain"]


@pytest.fixture
def forgotten_registry(monkeypatch):
    """The central registry with nothing resolved yet (earlier tests may have loaded methods)."""
    monkeypatch.setattr(central.METHODS, "_values", {})


class ShrinkParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    factor: float = Field(0.5, gt=0)


class Shrink(CentralUnlearner):
    """A third-party method: scales the final iterate (declared by the plugin ``shrinkage``)."""

    params_type = ShrinkParams

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        return Outcome(record.final * self.params.factor, 0, 0, {"forgotten": len(forget)})


SHRINKAGE = Plugin(name="shrinkage", central_methods={"shrink": f"{__name__}:Shrink"})
ONE = Plugin(name="one", central_methods={"dup": f"{__name__}:Shrink"})
TWO = Plugin(name="two", central_methods={"dup": "fedunlearn.central.baselines.retrain:Original"})


def test_the_repository_declares_every_central_method_under_its_registry_name(forgotten_registry):
    points = repository_entry_points()
    declared = {
        name: (plugin, path)
        for plugin in ("mini_unlearning", "central_baselines")
        for name, path in resolve(points[plugin]).central_methods.items()
    }
    assert sorted(declared) == sorted([*BASELINES, "mini_unlearning"])
    assert {n for n, (p, _) in declared.items() if p == "mini_unlearning"} == {"mini_unlearning"}
    classes = {resolve(path) for _, path in declared.values()}
    for name, (_, path) in declared.items():
        cls = resolve(path)
        assert issubclass(cls, CentralUnlearner)
        assert central.METHODS.add(name, cls).name == name  # one class per declared name
    # no method class of the package goes undeclared
    defined = {
        c for c in CentralUnlearner.__subclasses__() if c.__module__.startswith("fedunlearn.")
    }
    assert defined == classes


def test_without_the_mini_unlearning_plugin_the_baselines_still_work(
    fake_entry_points, forgotten_registry, logreg
):
    points = repository_entry_points()
    del points["mini_unlearning"]
    fake_entry_points(points)
    assert central.available_methods() == BASELINES
    objective, record = logreg
    result = central.make_method("replay").unlearn(objective, record, pick_forget(600, 0.05))
    assert result.method == "replay"
    assert not torch.equal(result.params, record.final)
    with pytest.raises(UnknownMethodError) as err:
        central.make_method("mini_unlearning", {"k": 10})
    assert str(err.value) == (
        "unknown central method 'mini_unlearning'; available: " + ", ".join(BASELINES)
    )


def test_a_third_party_central_method_is_found_through_its_plugin(
    fake_entry_points, forgotten_registry, logreg
):
    fake_entry_points({**repository_entry_points(), "shrinkage": f"{__name__}:SHRINKAGE"})
    assert central.available_methods() == sorted([*BASELINES, "mini_unlearning", "shrink"])
    objective, record = logreg
    forget = pick_forget(600, 0.05)
    result = central.make_method("shrink", {"factor": 0.25}).unlearn(objective, record, forget)
    assert result.method == "shrink"
    assert torch.equal(result.params, record.final * 0.25)
    assert result.details == {"forgotten": 30}
    assert central.get_method("shrink") is Shrink
    # the federated registry does not serve a centralised method
    from fedunlearn.unlearn import registry as federated

    assert "shrink" not in federated.available_methods()


def test_two_plugins_declaring_one_central_method_is_an_error_naming_both(
    fake_entry_points, forgotten_registry
):
    fake_entry_points({"one": f"{__name__}:ONE", "two": f"{__name__}:TWO"})
    with pytest.raises(PluginError, match=r"^'dup' \(central_methods\) is declared by plugins one"):
        central.make_method("dup")


def test_metadata_older_than_the_central_plugins_says_to_reinstall(
    fake_entry_points, forgotten_registry
):
    fake_entry_points({"baselines": repository_entry_points()["baselines"]})
    with pytest.raises(UnknownMethodError) as err:
        central.make_method("mini_unlearning")
    assert str(err.value) == (
        "unknown central method 'mini_unlearning'; available:  (no installed fedunlearn.plugins "
        "entry point declares a central method: reinstall fedunlearn, e.g. pip install -e . in "
        "its repository)"
    )


def test_reading_the_central_declarations_imports_neither_torch_nor_a_method():
    script = (
        "import json, sys\n"
        "from fedunlearn.central.baselines.plugin import PLUGIN as B\n"
        "from fedunlearn.central.mini_unlearning.plugin import PLUGIN as M\n"
        "assert B.central_methods and M.central_methods\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    loaded = json.loads(out.splitlines()[-1])
    central_modules = [m for m in loaded if m.startswith("fedunlearn.central")]
    assert sorted(central_modules) == [
        "fedunlearn.central",
        "fedunlearn.central.baselines",
        "fedunlearn.central.baselines.plugin",
        "fedunlearn.central.mini_unlearning",
        "fedunlearn.central.mini_unlearning.plugin",
    ]
    assert "torch" not in loaded
