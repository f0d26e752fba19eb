"""fedunlearn's method contract, run on this distribution's method (``fedunlearn.testing``)."""

import pytest
from fedunlearn_finetune.plugin import PLUGIN
from fedunlearn_finetune.unlearner import FineTune

from fedunlearn.errors import ConfigError
from fedunlearn.testing import parametrize_with_checks


@parametrize_with_checks([FineTune])
def test_contract(method, check):
    """Every check of fedunlearn's method contract."""
    check()  # trains fedunlearn's small contract runs on first use (a few seconds)


def test_the_declaration_names_the_method_class():
    """The entry point's declaration names the class the tests check."""
    assert PLUGIN.methods == {"finetune": "fedunlearn_finetune.unlearner:FineTune"}


def test_zero_rounds_are_refused():
    """K >= 1: fine-tuning zero rounds is refused at construction."""
    with pytest.raises(ConfigError, match="rounds"):
        FineTune({"rounds": 0})
