"""Run a fedunlearn job on Flower's Simulation Engine (Ray backend) from Python.

``simulate(job, num_supernodes)`` starts the Simulation Engine in this process with one virtual
SuperNode per client (node ``i`` hosts client ``i``: the engine sets ``partition-id``), runs the
job's ServerApp and returns when it finished; what the job wrote is on disk (``FlowerJob``).
The environment is made offline-safe first (``offline_environment``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.clientapp.typing import Mod

from fedunlearn.integrations.flower.client_app import make_client_app
from fedunlearn.integrations.flower.server_app import FlowerJob, make_server_app

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def offline_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``base`` (default: ``os.environ``) with Flower's and Ray's phoning home disabled.

    ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` stops a SuperLink from installing the
    app's dependencies (offline that fails the run); telemetry and update checks are off.
    """
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    return env


def simulate(
    job: FlowerJob,
    num_supernodes: int,
    *,
    num_cpus: int | None = None,
    client_num_cpus: float = 1.0,
    mods: Sequence[Mod] = (),
) -> None:
    """Run ``job`` on the Simulation Engine (Ray) with ``num_supernodes`` virtual SuperNodes.

    Args:
        job: What the ServerApp does (train a run, or unlearn from one).
        num_supernodes: Virtual SuperNodes; node ``i`` hosts client ``i`` (use the run's
            ``data.num_clients``).
        num_cpus: CPUs Ray may use (default: all).
        client_num_cpus: CPUs reserved per ClientApp; concurrent clients = num_cpus / this.
        mods: Flower client mods wrapped around the ClientApp (e.g. failure injection).
    """
    from flwr.simulation import run_simulation  # here: importing it starts importing Ray

    os.environ.update(OFFLINE_ENV)
    backend: dict[str, Any] = {"client_resources": {"num_cpus": client_num_cpus, "num_gpus": 0.0}}
    if num_cpus is not None:
        backend["init_args"] = {"num_cpus": num_cpus}
    run_simulation(
        server_app=make_server_app(job),
        client_app=make_client_app(mods),
        num_supernodes=num_supernodes,
        backend_config=backend,  # type: ignore[arg-type]
    )
