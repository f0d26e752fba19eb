"""examples/finetune-plugin: its own tests (fedunlearn.testing's checks) pass, uninstalled."""

import os
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET

import pytest
from tests.support.examples import FINETUNE_PLUGIN, finetune_class

from fedunlearn.plugins import Plugin, resolve
from fedunlearn.testing import CHECKS


def test_the_entry_point_line_resolves_to_the_plugin_declaring_the_method():
    # Prepare: the one line the distribution adds to the group fedunlearn.plugins
    project = tomllib.loads((FINETUNE_PLUGIN / "pyproject.toml").read_text())
    points = project["project"]["entry-points"]["fedunlearn.plugins"]
    FineTune = finetune_class()  # puts the example's src/ on sys.path
    # Execute: resolve it as fedunlearn does for an installed distribution
    plugin = resolve(points["finetune"], "plugin 'finetune'")
    # Assert: a Plugin named like its entry point, whose method path is the tested class
    assert list(points) == ["finetune"]
    assert isinstance(plugin, Plugin)
    assert plugin.name == "finetune"
    assert resolve(plugin.methods["finetune"], "method 'finetune'") is FineTune


@pytest.mark.slow  # a pytest process training the contract runs, ~15 s
def test_the_example_plugins_tests_pass_without_installing_it(tmp_path):
    # Prepare: the example's directory as its own pytest root; fedunlearn as this suite sees it
    report = tmp_path / "report.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    # Execute
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=FINETUNE_PLUGIN,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    # Assert: every contract check and the example's own tests ran and passed
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    assert int(suite.get("tests", "0")) == len(CHECKS) + 2
    assert int(suite.get("failures", "0")) == 0
    assert int(suite.get("errors", "0")) == 0
    assert int(suite.get("skipped", "0")) == 0
