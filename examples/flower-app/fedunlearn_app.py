"""This Flower App's components: fedunlearn's ServerApp and ClientApp.

The code is the installed fedunlearn[flower]; a relative config-path in the run config is read
from this app's directory.
"""

from pathlib import Path

from fedunlearn.integrations.flower.client_app import app as client_app
from fedunlearn.integrations.flower.server_app import make_app

server_app = make_app(base_dir=Path(__file__).parent)

__all__ = ["client_app", "server_app"]
