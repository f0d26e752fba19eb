"""Run fedunlearn federations on Flower (``pip install "fedunlearn[flower]"``).

- ``client_app``: the ``ClientApp`` (fedunlearn's pure ``local_update`` per SuperNode);
- ``strategy``: ``HistoryStrategy``, the engine's server round with recording policies;
- ``driver``: ``FlowerClients``, the federation over a Grid, which training and every
  unlearning method's fresh client work use;
- ``server_app``: the ``ServerApp`` (``make_app``) and ``FlowerJob`` (train a run, unlearn
  from it, or continue it after ``fedunlearn apply``), read from the Flower run config;
- ``bundle``: ``write_app(directory)``, the Flower App ``flwr run`` submits (the same as
  ``examples/flower-app``; ``python -m fedunlearn.integrations.flower.bundle DIR``);
- ``simulation``: ``simulate(job, num_supernodes)``: ``flwr run`` on a local Simulation Runtime
  SuperLink, from Python.

The user's own Flower app (their ClientApp, strategy and node-local data), three lines:

- ``recording``: ``Recording(strategy, context)`` wraps any Message-API strategy in the user's
  ServerApp, records every round into a fedunlearn run, and serves unlearning requests with
  the same ``start`` (``app_settings``: where the app's settings and requests are found;
  ``app_model``: which model; ``app_sampling``: deletion-ready rounds);
- ``app_protocol``: ``ClientApp`` (Flower's, its replies tagged with stable client ids, its
  training seeded by the server), ``client_id(message, context)``, ``local_batches``;
- ``app_unlearn``: ``serve_request`` / ``unlearn_over_app`` / ``unlearn_from_run_config``: an
  unlearning request over the same app, fresh training sent to the same ClientApp.

Deployment recipe: ``docs/deployment.md``.
"""

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'fedunlearn.integrations.flower needs Flower: pip install "fedunlearn[flower]"'
    ) from err

from fedunlearn.integrations.flower.app_protocol import (
    ClientApp,
    client_id,
    local_batches,
    own_client_app,
)
from fedunlearn.integrations.flower.app_unlearn import (
    AppClients,
    unlearn_from_run_config,
    unlearn_over_app,
)
from fedunlearn.integrations.flower.driver import FlowerClients
from fedunlearn.integrations.flower.recording import Recording
from fedunlearn.integrations.flower.server_app import FlowerJob, make_app, run_job
from fedunlearn.integrations.flower.simulation import FlowerRunError, simulate
from fedunlearn.integrations.flower.strategy import HistoryStrategy, MissingAwareRecorder

__all__ = [
    "AppClients",
    "ClientApp",
    "FlowerClients",
    "FlowerJob",
    "FlowerRunError",
    "HistoryStrategy",
    "MissingAwareRecorder",
    "Recording",
    "client_id",
    "local_batches",
    "make_app",
    "own_client_app",
    "run_job",
    "simulate",
    "unlearn_from_run_config",
    "unlearn_over_app",
]
