"""The plugin seam: declarations by entry-point name, lazy lookup, one-line errors (issue 20)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.support import plugins as plugin_support

from fedunlearn import plugins
from fedunlearn.config import parse_config
from fedunlearn.errors import (
    ConfigError,
    PluginError,
    UnknownMethodError,
    UnknownNameError,
    UnknownPolicyError,
)
from fedunlearn.plugins import Plugin
from fedunlearn.registry import ClassRegistry, Registry
from fedunlearn.runs import resolve_config
from fedunlearn.unlearn import get_method
from fedunlearn.unlearn.crab.params import CrabSelectionConfig
from fedunlearn.unlearn.fedadp.params import FedADPSelectionConfig


def _loaded_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; return every module it imported."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.slow
def test_a_crab_config_is_assembled_without_importing_starfish_or_mpc():
    # Prepare / Execute: parse and assemble a config naming Crab's policy and its options
    loaded = _loaded_after(
        "from fedunlearn.config import parse_config\n"
        "from fedunlearn.runs import resolve_config\n"
        "crab = {'history': {'policy': 'crab', 'crab': {'alpha': 0.4}}}\n"
        "c = resolve_config(parse_config(crab))\n"
        "assert c.history.options('crab').alpha == 0.4\n"
    )
    # Assert: Crab's policy module was imported, nothing of Starfish nor of the MPC layer
    assert "fedunlearn.unlearn.crab.policy" in loaded
    assert not [m for m in loaded if m.startswith("fedunlearn.unlearn.starfish")]
    assert not [m for m in loaded if m.startswith("fedunlearn.mpc")]
    # nothing of FedADP: a run without DP resolves no budget schedule (the core names no paper)
    assert not [m for m in loaded if m.startswith("fedunlearn.unlearn.fedadp")]


def test_parsing_a_config_imports_no_plugin():
    loaded = _loaded_after(
        "from fedunlearn.config import parse_config\n"
        "parse_config({'history': {'policy': 'fedadp', 'fedadp': {'beta': 0.1}}})\n"
    )
    assert not [m for m in loaded if m.startswith(("fedunlearn.unlearn", "fedunlearn.plugins"))]


def test_reading_every_declaration_imports_no_method_package():
    loaded = _loaded_after(
        "from fedunlearn.plugins import installed\n"
        "assert set(installed()) >= {'baselines', 'crab', 'fedadp', 'starfish'}\n"
    )
    # only the declarations and their (lazy) packages: no method, no torch
    implementation = [m for m in loaded if m.startswith("fedunlearn.unlearn.")]
    assert implementation
    assert all(m.endswith(".plugin") or m.count(".") == 2 for m in implementation)
    assert "torch" not in loaded


def test_a_typo_in_a_policy_or_method_is_one_line_listing_the_names():
    with pytest.raises(UnknownPolicyError) as err:
        resolve_config(parse_config({"history": {"policy": "crabb"}}))
    assert str(err.value) == (
        "history.policy: unknown history policy 'crabb'; available: all, crab, every, fedadp, none"
    )
    with pytest.raises(UnknownMethodError) as err:
        get_method("crabb")
    assert "\n" not in str(err.value)
    assert "unknown unlearning method 'crabb'; available: crab, fedadp, federaser" in str(err.value)


def test_policy_options_are_validated_at_assembly_with_the_field_named():
    raw = parse_config({"history": {"policy": "crab", "crab": {"alpha": -1}}})  # stored as given
    assert raw.history.sections == {"crab": {"alpha": -1}}
    with pytest.raises(ConfigError, match=r"^invalid configuration: history\.crab\.alpha: "):
        resolve_config(raw)
    with pytest.raises(ConfigError, match="unknown history section 'crap'; sections are the "):
        resolve_config(parse_config({"history": {"crap": {}}}))
    resolved = resolve_config(parse_config({"history": {"policy": "crab"}}))
    assert resolved.history.sections == {"crab": CrabSelectionConfig()}  # defaults named
    assert resolve_config(resolved) == resolved
    absent = resolved.history.options("fedadp", FedADPSelectionConfig)
    assert absent == FedADPSelectionConfig()  # absent: the model's defaults
    with pytest.raises(ConfigError, match="has not been validated; assemble the config"):
        raw.history.options("crab")


# ----- declarations (fake entry points) -------------------------------------------------------

fake_entry_points = plugin_support.fake_entry_points


ONE = Plugin(name="one", methods={"dup": "fedunlearn.unlearn.baselines.none:NoUnlearning"})
TWO = Plugin(name="two", methods={"dup": "fedunlearn.unlearn.baselines.retrain:Retrain"})
NAMED_WRONG = Plugin(name="other")
NOT_A_PLUGIN = {"methods": {}}
MISSING = Plugin(name="missing", methods={"gone": "fedunlearn.no_such_module:Thing"})


def test_two_plugins_declaring_one_name_is_an_error_naming_both(fake_entry_points):
    fake_entry_points({"one": f"{__name__}:ONE", "two": f"{__name__}:TWO"})
    registry: ClassRegistry = ClassRegistry("unlearning method", UnknownMethodError, "methods")
    with pytest.raises(PluginError, match=r"'dup' \(methods\) is declared by plugins one, two"):
        registry.get("dup")


def test_bad_declarations_are_one_line_plugin_errors(fake_entry_points):
    fake_entry_points({"wrong": f"{__name__}:NAMED_WRONG"})
    with pytest.raises(PluginError, match="declares the name 'other'; use one name"):
        plugins.installed()
    fake_entry_points({"odd": f"{__name__}:NOT_A_PLUGIN"})
    with pytest.raises(PluginError, match="is a dict; it must name a fedunlearn.plugins.Plugin"):
        plugins.installed()
    fake_entry_points({"missing": f"{__name__}:MISSING"})
    registry: Registry = Registry("thing", plugin_kind="methods")
    assert registry.names() == ["gone"]  # declared names are listed without importing
    with pytest.raises(PluginError, match="cannot be loaded: ModuleNotFoundError") as err:
        registry.get("gone")
    assert "\n" not in str(err.value)
    with pytest.raises(PluginError, match="give a 'module:attr' path"):
        Plugin(name="x", methods={"y": "no_colon"})


SOLO = Plugin(name="solo", methods={"solo": "fedunlearn.unlearn.baselines.none:NoUnlearning"})


def test_a_plugin_named_like_the_name_is_read_alone(fake_entry_points):
    fake_entry_points({"solo": f"{__name__}:SOLO", "broken": f"{__name__}:NOT_DEFINED"})
    # "solo" is found in the plugin named "solo": the broken declaration is never read
    found = plugins.provider("methods", "solo")
    assert found == (SOLO, "fedunlearn.unlearn.baselines.none:NoUnlearning")
    # a name no plugin is named after reads every declaration, the broken one too
    with pytest.raises(PluginError, match="entry point fedunlearn.plugins: broken = "):
        plugins.provider("methods", "elsewhere")


MODULES = Plugin(
    name="mods",
    methods={"m": "fedunlearn.unlearn.baselines.none:NoUnlearning"},
    modules=("fedunlearn.no_such_module",),
)


def test_a_plugins_modules_are_imported_before_its_contributions(fake_entry_points):
    fake_entry_points({"mods": f"{__name__}:MODULES"})
    with pytest.raises(PluginError, match="module fedunlearn.no_such_module of plugin 'mods'"):
        plugins.provider("methods", "m")


def test_a_lazy_registry_entry_is_resolved_on_first_lookup():
    registry: Registry = Registry("codec", lazy={"json": "json:dumps"})
    assert registry.names() == ["json"]
    assert "json" in registry
    import json

    assert registry.get("json") is json.dumps


def test_with_no_plugin_installed_the_error_says_how_to_install(fake_entry_points):
    fake_entry_points({})
    with pytest.raises(UnknownPolicyError, match="no fedunlearn.plugins entry points are instal"):
        Registry("history policy", UnknownPolicyError, plugin_kind="policies").get("crab")


def test_without_the_fedadp_plugin_a_non_dp_run_trains_and_unlearns(
    fake_entry_points, tmp_path, monkeypatch
):
    """The core names no paper: privacy.budget.schedule is resolved for DP runs only (issue 38)."""
    from fedunlearn.config import parse_config
    from fedunlearn.privacy.training import BUDGET_SCHEDULES
    from fedunlearn.runs import train_run
    from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

    fake_entry_points({"baselines": "fedunlearn.unlearn.baselines.plugin:PLUGIN"})
    # an earlier test in this process may have loaded FedADP's schedule: forget it too
    monkeypatch.setattr(BUDGET_SCHEDULES, "_values", {})
    config = parse_config(
        {
            "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "logreg"},
            "training": {"rounds": 2, "lr": 0.3, "executor": "serial"},
        }
    )
    train_run(config, tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        result = session.run(make_method("retrain"), UnlearnRequest.of([1]))
    assert result.lineage.kind == "exact"
    dp = parse_config({"privacy": {"enabled": True}})
    with pytest.raises(UnknownNameError, match="privacy.budget.schedule"):
        train_run(dp, tmp_path / "dp")
