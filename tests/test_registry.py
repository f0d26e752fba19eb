"""One registry type; one class-registry type for both method registries (issue 20)."""

from __future__ import annotations

import pytest

from fedunlearn.central import registry as central
from fedunlearn.errors import UnknownMethodError
from fedunlearn.registry import ClassRegistry
from fedunlearn.unlearn import registry as federated


def test_both_method_registries_are_one_class_registry_type():
    assert type(central.METHODS) is type(federated.METHODS) is ClassRegistry
    assert central.make_method.__func__ is federated.make_method.__func__
    assert "mini_unlearning" in central.available_methods()
    with pytest.raises(UnknownMethodError, match="unknown central method 'mini'; available: "):
        central.get_method("mini")


def test_registering_a_class_names_it_and_make_passes_its_params():
    registry: ClassRegistry = ClassRegistry("widget")

    @registry.register("gear")
    class Gear:
        def __init__(self, params: dict) -> None:
            self.params = params

    assert Gear.name == "gear"
    assert registry.make("gear", {"teeth": 12}).params == {"teeth": 12}
    with registry.registered("cog", Gear):
        assert registry.names() == ["cog", "gear"]
    assert registry.names() == ["gear"]
    with pytest.raises(ValueError, match="widget name 'gear' is registered twice"):
        registry.add("gear", type("Other", (), {}))
