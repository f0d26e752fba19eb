"""Run fedunlearn federations on Flower (``pip install "fedunlearn[flower]"``).

- ``client_app``: the ``ClientApp`` (fedunlearn's pure ``local_update`` per SuperNode);
- ``strategy``: ``HistoryStrategy``, the engine's server round with recording policies;
- ``driver``: ``FlowerClients``, the federation over a Grid, which training and every
  unlearning method's fresh client work use;
- ``server_app``: the ``ServerApp`` and ``FlowerJob`` (train a run, or unlearn from one);
- ``simulation``: ``simulate(job, num_supernodes)`` on the Simulation Engine (Ray);
- ``bundle``: ``write_app(directory)``, the app directory ``flwr run`` needs (Deployment Engine).

Deployment recipe: ``docs/deployment.md``.
"""

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'fedunlearn.integrations.flower needs Flower: pip install "fedunlearn[flower]"'
    ) from err

from fedunlearn.integrations.flower.driver import FlowerClients
from fedunlearn.integrations.flower.server_app import FlowerJob, run_job
from fedunlearn.integrations.flower.strategy import HistoryStrategy, MissingAwareRecorder

__all__ = ["FlowerClients", "FlowerJob", "HistoryStrategy", "MissingAwareRecorder", "run_job"]
