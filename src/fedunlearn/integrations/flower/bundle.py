"""The Flower App directory ``flwr run`` submits: fedunlearn's ServerApp and ClientApp.

``write_app(directory)`` writes the app that ``examples/flower-app/`` holds (a test keeps the two
identical):

- ``pyproject.toml``: Flower's app config, ``[tool.flwr.app]``: the components (``serverapp``,
  ``clientapp``) and the default run config, whose keys are ``FlowerJob``'s (``mode``,
  ``config-path``, ``run-dir``, ``method``, ``forget``, ...);
- ``fedunlearn_app.py``: a few lines naming fedunlearn's ClientApp and a ServerApp that resolves
  a relative ``config-path`` against the app directory (the FAB carries ``*.yaml`` files);
- ``configs/digits.yaml``: the default run config (scikit-learn digits, no download).

A FAB carries source files only, so fedunlearn itself (with the ``flower`` extra) must be
installed wherever the app runs, and the SuperLink must not install the app's dependencies
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, or ``flower-superlink
--disable-runtime-dependency-installation``).

Run it with ``python -m fedunlearn.integrations.flower.bundle DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

MODULE = "fedunlearn_app"
DEFAULT_CONFIG = "configs/digits.yaml"

PYPROJECT = f"""\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedunlearn-flower-app"
version = "1.0.0"
description = "fedunlearn on Flower: federated training with history recording, then unlearning"
license = "Apache-2.0"
# fedunlearn[flower] must already be installed where the app runs: set
# FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 so that no SuperLink tries to install it
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedunlearn"

[tool.flwr.app.components]
serverapp = "{MODULE}:server_app"
clientapp = "{MODULE}:client_app"

# What the ServerApp does (fedunlearn.integrations.flower.FlowerJob). Override per run:
#   flwr run . local --run-config 'mode="unlearn" run-dir="/abs/run" forget="3"'
[tool.flwr.app.config]
mode = "train"                    # "train": a new run; "unlearn": a method on a finished run;
                                  # "continue": `rounds` more rounds of it (after fedunlearn apply)
config-path = "{DEFAULT_CONFIG}"  # fedunlearn run config (YAML); relative = in this app
run-dir = ""                      # absolute; "" = ~/fedunlearn-runs/flower-<run id> (train)
method = "federaser"              # unlearn: a registered method (fedunlearn methods)
method-params = "{{}}"              # unlearn: the method's parameters as JSON
forget = ""                       # unlearn: client ids, e.g. "3,7"
kind = "forget"                   # unlearn: "forget" or "recover" (poisoning recovery)
result-path = ""                  # unlearn: result JSON; "" = <run-dir>/flower_<method>.json
round-timeout = 600.0             # seconds to wait for a round's replies
node-timeout = 120.0              # seconds to wait for the SuperNodes to connect
rounds = 0                        # continue: rounds to add; 0 = finish an interrupted continue
"""

APP_MODULE = '''\
"""This Flower App's components: fedunlearn's ServerApp and ClientApp.

The code is the installed fedunlearn[flower]; a relative config-path in the run config is read
from this app's directory.
"""

from pathlib import Path

from fedunlearn.integrations.flower.client_app import app as client_app
from fedunlearn.integrations.flower.server_app import make_app

server_app = make_app(base_dir=Path(__file__).parent)

__all__ = ["client_app", "server_app"]
'''

DIGITS_CONFIG = """\
# The Flower App's default run: scikit-learn digits (bundled, no download), 10 IID clients,
# two of which plant a backdoor; every update is recorded for later unlearning.
seed: 0
data:
  dataset: digits
  num_clients: 10
  partition: iid
model:
  name: mlp
  hidden: [64]
training:
  rounds: 10
  local_epochs: 2
  lr: 0.1
  batch_size: 32
  executor: serial
attack:
  kind: backdoor
  num_malicious: 2
  target_label: 0
  trigger_size: 3
history:
  policy: all
"""

FILES = {
    "pyproject.toml": PYPROJECT,
    f"{MODULE}.py": APP_MODULE,
    DEFAULT_CONFIG: DIGITS_CONFIG,
}


def write_app(directory: str | Path) -> Path:
    """Write fedunlearn's Flower App into ``directory`` (created) and return its path."""
    path = Path(directory)
    for name, text in FILES.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return path


if __name__ == "__main__":
    print(write_app(sys.argv[1] if len(sys.argv) > 1 else "fedunlearn-flower-app"))
