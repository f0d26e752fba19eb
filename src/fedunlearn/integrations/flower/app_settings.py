"""What ``Recording`` reads from a user's Flower app: its settings, and the request to serve.

An app passes its ``Context`` to ``Recording`` and declares nothing for fedunlearn: each setting
is looked up where apps keep it, a keyword of ``Recording`` first (``KEYWORDS``), then the train
config the app gives ``start`` (what its ClientApp receives), then the app's run config
(``pyproject.toml``'s ``[tool.flwr.app.config]``, Flower's quickstart keeps ``local-epochs``
there), then the default:

| setting | run config / train config keys | default |
|---|---|---|
| run directory | ``run-dir`` | ``~/fedunlearn-runs/<app>/<Flower run id>`` (``$FEDUNLEARN_RUNS``) |
| local epochs | ``local-epochs`` | none: refused in one line |
| learning rate | ``lr``, ``learning-rate`` | 0.05 (said in the log) |
| batch size | ``batch-size`` | 32 |
| seed | ``seed`` | 0 |
| sampling | ``sampling`` (``fraction`` or ``tv_stable``) | the strategy's own (``fraction``) |
| local steps | ``local-steps`` (``tv_stable``) | none: refused in one line |

An unlearning request comes from the run config keys ``unlearn-*`` (``REQUEST_KEYS``) when the
app declares them, else from a request ``fedunlearn unlearn`` queued in one of the app's runs
(``fedunlearn.runs.app_requests``): in the ``run-dir`` / ``unlearn-run-dir`` named, or under
the app's runs root. ``flwr run --run-config`` accepts only keys the app's ``pyproject.toml``
declares: overriding a default means declaring its key there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.config import HistoryConfig, RunConfig, parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.runs import resolve_config
from fedunlearn.runs.app_requests import AppRequest, queued_request, queued_runs

RUNS_ENV = "FEDUNLEARN_RUNS"
SAMPLINGS = ("fraction", "tv_stable")
REQUEST_KEYS = {
    "unlearn-forget": 'client ids to forget, e.g. "1" or "1,4"; empty: no request (train)',
    "unlearn-run-dir": "absolute directory of the recorded run",
    "unlearn-method": "a registered method (retrain, fedrecover, tv_exact, ...); default retrain",
    "unlearn-params": "the method's parameters as JSON, e.g. '{\"rounds\": 3}'",
    "unlearn-out": "result JSON (default <run-dir>/flower_<method>.json)",
}
LR_KEYS = ("lr", "learning-rate")


@dataclass(frozen=True)
class TrainSettings:
    """The recorded run's training settings, and where each was found.

    Attributes:
        run_dir: The run directory.
        lr: Learning rate.
        local_epochs: Local epochs (1 under ``tv_stable``: local work is steps).
        batch_size: Batch size.
        seed: The run seed.
        sampling: ``fraction`` (the strategy samples) or ``tv_stable`` (FATS's sampling).
        local_steps: ``tv_stable``: local mini-batch steps per round.
        found: Setting -> where it came from (for the log line).
    """

    run_dir: Path
    lr: float
    local_epochs: int
    batch_size: int
    seed: int
    sampling: str
    local_steps: int | None
    found: dict[str, str]


def runs_root(app: str) -> Path:
    """Return the directory of the app's recorded runs (``$FEDUNLEARN_RUNS/<app>``)."""
    base = os.environ.get(RUNS_ENV) or str(Path.home() / "fedunlearn-runs")
    return Path(base) / app


def _text(config: Mapping[str, Any], key: str) -> str:
    return str(config.get(key, "") or "").strip()


def _lookup(
    name: str,
    given: Any,
    keys: tuple[str, ...],
    sources: list[tuple[str, Mapping[str, Any]]],
) -> tuple[Any, str] | None:
    if given is not None:
        return given, "Recording(...)"
    for where, config in sources:
        for key in keys:
            if key in config and config[key] not in ("", None):
                return config[key], f"{where} {key!r}"
    return None


def resolve_training(
    *,
    app: str,
    run_id: int | None,
    given: Mapping[str, Any],
    run_config: Mapping[str, Any],
    train_config: Mapping[str, Any],
) -> TrainSettings:
    """Return the run's settings (module docstring's table).

    Args:
        app: The app's name (its package).
        run_id: Flower's run id (names the default run directory).
        given: ``Recording``'s keywords (None: not given): ``run_dir``, ``lr``,
            ``local_epochs``, ``batch_size``, ``seed``, ``sampling``, ``local_steps``.
        run_config: The app's run config (``context.run_config``).
        train_config: The train config given to ``start``.

    Raises:
        ConfigError: the local work is unknown (no local epochs, or no local steps under
            ``tv_stable``), or a value has the wrong form.
    """
    sources = [("train config", train_config), ("run config", run_config)]
    found: dict[str, str] = {}

    def get(name: str, keys: tuple[str, ...], default: Any, kind: type) -> Any:
        hit = _lookup(name, given.get(name), keys, sources)
        if hit is None:
            found[name] = "default"
            return default
        value, found[name] = hit
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{found[name]}: {name} must be a {kind.__name__}; got {value!r}"
            ) from None

    sampling = str(get("sampling", ("sampling",), "fraction", str))
    if sampling not in SAMPLINGS:
        raise ConfigError(f"sampling must be one of {', '.join(SAMPLINGS)}; got {sampling!r}")
    local_steps = get("local_steps", ("local-steps",), None, int)
    if sampling == "tv_stable":
        if local_steps is None:
            raise ConfigError(
                "sampling tv_stable: the clients' local work is local-steps mini-batches, and "
                "neither Recording(local_steps=...) nor the run config ('local-steps') names "
                "how many"
            )
        epochs = 1
    else:
        epochs = get("local_epochs", ("local-epochs",), None, int)
        if epochs is None:
            raise ConfigError(
                "Recording: the app's local epochs are unknown (no 'local-epochs' in the train "
                "config or the run config); pass local_epochs=N to Recording, so that the "
                "recorded history states the clients' local work"
            )
        local_steps = None
    explicit = given.get("run_dir") or _text(run_config, "run-dir")
    if explicit:
        run_dir = Path(explicit)
        found["run_dir"] = "Recording(...)" if given.get("run_dir") else "run config 'run-dir'"
        if not run_dir.is_absolute():
            raise ConfigError(
                f"the run directory must be absolute (the ServerApp runs in a directory of "
                f"Flower's); got {str(run_dir)!r}"
            )
    else:
        run_dir = runs_root(app) / str(run_id if run_id is not None else "run")
        found["run_dir"] = "default"
    return TrainSettings(
        run_dir=run_dir,
        lr=float(get("lr", LR_KEYS, 0.05, float)),
        local_epochs=int(epochs),
        batch_size=int(get("batch_size", ("batch-size",), 32, int)),
        seed=int(get("seed", ("seed",), 0, int)),
        sampling=sampling,
        local_steps=None if local_steps is None else int(local_steps),
        found=found,
    )


def recorded_config(  # noqa: PLR0913 - what the stored config says
    settings: TrainSettings,
    choice: Any,
    *,
    rounds: int,
    num_clients: int,
    participation: float,
    history: HistoryConfig,
) -> RunConfig:
    """Return the run's stored config: node-local data, the model's path, the local work.

    Args:
        settings: The run's settings.
        choice: The recorded model (``app_model.ModelChoice``: ``path``, ``options``).
        rounds: The rounds to train.
        num_clients: The clients.
        participation: The share of clients the strategy samples (FedAvg's
            ``fraction_train``; K of ``tv_stable``).
        history: The recording policy.
    """
    training: dict[str, Any] = {
        "rounds": rounds,
        "lr": settings.lr,
        "batch_size": settings.batch_size,
        "participation": participation,
        "executor": "serial",
        "device": "cpu",
    }
    if settings.sampling == "tv_stable":
        training.update(sampling="tv_stable", local_steps=settings.local_steps)
    else:
        training["local_epochs"] = settings.local_epochs
    return resolve_config(
        parse_config(
            {
                "seed": settings.seed,
                "data": {"dataset": "node-local", "num_clients": num_clients},
                "model": {"factory": choice.path, "options": choice.options},
                "training": training,
                "history": history.model_dump(),
            },
            "<Recording>",
        )
    )


@dataclass(frozen=True)
class PendingRequest:
    """A request to serve instead of training.

    Attributes:
        run_dir: The recorded run.
        request: What to do.
        source: ``run config`` or ``queued`` (removed from the queue once served).
        waiting: Other runs of the app with a queued request.
    """

    run_dir: Path
    request: AppRequest
    source: str
    waiting: int = 0


def request_from_run_config(run_config: Mapping[str, Any]) -> PendingRequest | None:
    """Return the request the run config keys ``unlearn-*`` name, else None.

    Raises:
        ConfigError: a key has a value of the wrong form (named, with what is allowed).
    """
    if not _text(run_config, "unlearn-forget"):
        return None
    try:
        forget = tuple(int(c) for c in _text(run_config, "unlearn-forget").split(",") if c.strip())
    except ValueError:
        raise ConfigError(
            f'unlearn-forget takes comma-separated client ids, e.g. "1,4"; got '
            f"{_text(run_config, 'unlearn-forget')!r}"
        ) from None
    run_dir = _text(run_config, "unlearn-run-dir")
    if not run_dir or not Path(run_dir).is_absolute():
        raise ConfigError("unlearn-run-dir must be the recorded run's absolute directory")
    try:
        params = json.loads(_text(run_config, "unlearn-params") or "{}")
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"unlearn-params must be a JSON object; got {_text(run_config, 'unlearn-params')!r} "
            f"({err})"
        ) from None
    request = AppRequest(
        forget,
        _text(run_config, "unlearn-method") or "retrain",
        params,
        out=_text(run_config, "unlearn-out") or None,
    )
    return PendingRequest(Path(run_dir), request, "run config")


def pending_request(
    app: str, run_config: Mapping[str, Any], run_dir: str | Path | None = None
) -> PendingRequest | None:
    """Return the request to serve: the run config's, else the oldest queued one, else None.

    Queued requests are looked for in ``run_dir`` (``Recording(run_dir=)``), the run config's
    ``run-dir`` and ``unlearn-run-dir``, and every run under the app's runs root.

    Raises:
        ConfigError: a request key or a queue file is malformed.
    """
    named = request_from_run_config(run_config)
    if named is not None:
        return named
    places = [Path(p) for p in (run_dir, _text(run_config, "run-dir")) if p]
    places += [Path(p) for p in (_text(run_config, "unlearn-run-dir"),) if p]
    root = runs_root(app)
    if root.is_dir():
        places += [d for d in root.iterdir() if d.is_dir()]
    queued = queued_runs(places)
    if not queued:
        return None
    first = queued[0]
    request = queued_request(first)
    assert request is not None
    return PendingRequest(first, request, "queued", waiting=len(queued) - 1)
