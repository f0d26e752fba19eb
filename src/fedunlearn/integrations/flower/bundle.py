"""The Flower app directory ``flwr run`` submits to a SuperLink (Deployment Engine).

``write_app(directory)`` writes ``pyproject.toml`` (Flower's app config: components and the
default run config) and ``fedunlearn_flower_app.py``, a two-line module naming fedunlearn's
ServerApp and ClientApp. A FAB carries source files only, so fedunlearn itself (with the
``flower`` extra) must be installed on the SuperLink and every SuperNode machine, and the
SuperLink must not try to install the app's dependencies
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` or ``--disable-runtime-dependency-
installation``). Every path in the run config must be absolute.

Run it with ``python -m fedunlearn.integrations.flower.bundle DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

MODULE = "fedunlearn_flower_app"

PYPROJECT = f"""\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedunlearn-flower-app"
version = "1.0.0"
description = "fedunlearn federations with history recording and unlearning on Flower"
license = "Apache-2.0"
# fedunlearn[flower] must already be installed where the app runs (no runtime installs)
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedunlearn"

[tool.flwr.app.components]
serverapp = "{MODULE}:server_app"
clientapp = "{MODULE}:client_app"

# FlowerJob keys; override with flwr run ... --run-config 'key=value ...'. Absolute paths.
[tool.flwr.app.config]
mode = "train"
run-dir = ""
config-path = ""
method = "retrain"
method-params = "{{}}"
forget = ""
kind = "forget"
result-path = ""
round-timeout = 600.0
node-timeout = 120.0
"""

APP_MODULE = '''\
"""fedunlearn's Flower apps (the installed library holds the code)."""

from fedunlearn.integrations.flower.client_app import app as client_app
from fedunlearn.integrations.flower.server_app import app as server_app

__all__ = ["client_app", "server_app"]
'''


def write_app(directory: str | Path) -> Path:
    """Write the Flower app directory for fedunlearn into ``directory`` and return its path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / f"{MODULE}.py").write_text(APP_MODULE)
    return path


if __name__ == "__main__":
    print(write_app(sys.argv[1] if len(sys.argv) > 1 else "fedunlearn-flower-app"))
