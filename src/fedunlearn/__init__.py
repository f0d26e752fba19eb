"""fedunlearn: remove a client's or a sample's influence from a trained model.

Public entry points: ``load_config``/``parse_config`` (configs), ``train_run`` (train a run
directory with history recording), ``run_info`` (what a run stored), the unlearning API
(``UnlearnSession``, ``UnlearnRequest``, ``make_method``, ``available_methods``,
``UnlearnResult``), ``HistoryStore``, and the subpackages. Names are imported on first use, so
``import fedunlearn`` stays cheap and importing one subpackage does not load the others.
"""

from __future__ import annotations

from fedunlearn.exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "FedUnlearnError": "fedunlearn.errors",
    "RunConfig": "fedunlearn.config",
    "load_config": "fedunlearn.config",
    "parse_config": "fedunlearn.config",
    "build_setup": "fedunlearn.runs",
    "run_info": "fedunlearn.runs",
    "train_run": "fedunlearn.runs",
    "HistoryStore": "fedunlearn.history",
    "UnlearnRequest": "fedunlearn.unlearn",
    "UnlearnResult": "fedunlearn.unlearn",
    "UnlearnSession": "fedunlearn.unlearn",
    "Unlearner": "fedunlearn.unlearn",
    "available_methods": "fedunlearn.unlearn",
    "make_method": "fedunlearn.unlearn",
}

__all__ = ["__version__", *sorted(_EXPORTS)]
__getattr__ = lazy_exports(__name__, _EXPORTS)
