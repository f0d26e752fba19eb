"""Requests for a run whose clients keep their data (a user's Flower app): queued, then served.

A run recorded by ``fedunlearn.integrations.flower.Recording`` (store metadata ``flower_app``)
cannot be unlearned in the process of ``fedunlearn unlearn``: its fresh client work needs the
clients, which only the Flower app reaches. And ``flwr run --run-config`` accepts only keys the
app's ``pyproject.toml`` declares, so an app that declares none receives a request through a
file instead: ``fedunlearn unlearn`` checks the request and writes ``<run>/flower_request.json``
(``queue_request``); the app's next ``flwr run`` (its strategy wrapped in ``Recording``) finds it
(``queued_runs``), serves it and removes the file once the result is written
(``request_served``). A request that fails stays queued, so the next ``flwr run`` tries again.

``serving(meta, run_dir)`` says how a run's requests are served (``fedunlearn info``) and
``serve_command`` is the exact command that serves a queued request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError
from fedunlearn.history.store import parse_run_meta
from fedunlearn.runs.rundir import open_meta, write_json

__all__ = [
    "APP_META",
    "REQUEST_FILE",
    "AppRequest",
    "queue_request",
    "queued_request",
    "queued_runs",
    "request_served",
    "serve_command",
    "serving",
]

APP_META = "flower_app"  # store metadata key of a run recorded from a user's Flower app
REQUEST_FILE = "flower_request.json"
KINDS = ("forget", "recover")


@dataclass(frozen=True)
class AppRequest:
    """One unlearning request for a Flower-app run.

    Attributes:
        forget: Client ids to remove.
        method: A registered method that needs no server-side data (``retrain``, ...).
        params: The method's parameters.
        kind: ``forget`` or ``recover``.
        out: Absolute path of the result JSON (None: ``<run>/flower_<method>.json``).
        queued_at: When it was queued (UTC, ISO 8601).
    """

    forget: tuple[int, ...]
    method: str = "retrain"
    params: dict[str, Any] = field(default_factory=dict)
    kind: str = "forget"
    out: str | None = None
    queued_at: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "forget", tuple(sorted({int(c) for c in self.forget})))
        if not self.forget:
            raise ConfigError("an unlearning request names at least one client to forget")
        if self.kind not in KINDS:
            raise ConfigError(f"request kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.out is not None and not Path(self.out).is_absolute():
            raise ConfigError(
                f"the result path must be absolute (the app writes it); got {self.out!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> AppRequest:
        """Return the request a queued file holds.

        Raises:
            ConfigError: the file does not hold a request (named, with what is wrong).
        """
        try:
            return cls(
                forget=tuple(int(c) for c in data["forget"]),
                method=str(data.get("method") or "retrain"),
                params=dict(data.get("params") or {}),
                kind=str(data.get("kind") or "forget"),
                out=data.get("out") or None,
                queued_at=str(data.get("queued_at", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{where} does not hold an unlearning request ({err!r})") from None


def queue_request(run_dir: str | Path, request: AppRequest) -> Path:
    """Write ``request`` as the run's queued request and return the file.

    Raises:
        ConfigError: the run is not a Flower-app run, a request is already queued, or a client
            id is not one of the run's.
    """
    run_dir = Path(run_dir)
    target = run_dir / REQUEST_FILE
    if target.exists():
        waiting = queued_request(run_dir)
        raise ConfigError(
            f"{target} already queues a request (forget {list(waiting.forget) if waiting else '?'}"
            f" with {waiting.method if waiting else '?'}); serve it first "
            f"({serve_command(open_meta(run_dir), run_dir)}) or delete the file"
        )
    meta = parse_run_meta(open_meta(run_dir), str(run_dir))
    if meta.flower_app is None:
        raise ConfigError(f"{run_dir} was not recorded from a Flower app; nothing to queue")
    known = meta.client_ids
    unknown = sorted(set(request.forget) - known)
    if unknown:
        raise ConfigError(
            f"client(s) {unknown} are not in this run (its clients: {sorted(known)[:20]})"
        )
    stamped = AppRequest(
        request.forget,
        request.method,
        request.params,
        request.kind,
        request.out,
        request.queued_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    write_json(target, {**asdict(stamped), "forget": list(stamped.forget)})
    return target


def queued_request(run_dir: str | Path) -> AppRequest | None:
    """Return the run's queued request, or None.

    Raises:
        ConfigError: the queue file is not a request (unreadable JSON or fields).
    """
    path = Path(run_dir) / REQUEST_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} is not readable JSON ({err}); delete it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold an unlearning request; delete it")
    return AppRequest.from_dict(data, str(path))


def queued_runs(run_dirs: Iterable[str | Path]) -> list[Path]:
    """Return the run directories among ``run_dirs`` holding a queued request, oldest first."""
    found = {Path(d) for d in run_dirs if (Path(d) / REQUEST_FILE).exists()}
    return sorted(found, key=lambda d: ((d / REQUEST_FILE).stat().st_mtime, str(d)))


def request_served(run_dir: str | Path) -> None:
    """Remove the run's queued request (its result is written)."""
    (Path(run_dir) / REQUEST_FILE).unlink(missing_ok=True)


def serve_command(meta: Mapping[str, Any], run_dir: str | Path) -> str:
    """Return the command that serves the run's queued request: ``flwr run`` of its app."""
    app = parse_run_meta(dict(meta), str(run_dir)).flower_app or {}
    where = app.get("app_dir") or "."
    return f"flwr run {where}"


def serving(meta: Mapping[str, Any], run_dir: str | Path) -> dict[str, Any] | None:
    """Return how a run's unlearning requests are served, or None for a run served here.

    The answer for a Flower-app run: the app that serves them (``app``), the command that
    does (``command``), and the request waiting, if any (``queued``).
    """
    app = parse_run_meta(dict(meta), str(run_dir)).flower_app
    if app is None:
        return None
    problem: str | None
    try:
        waiting = queued_request(run_dir)
    except ConfigError as err:
        waiting, problem = None, str(err)
    else:
        problem = None
    return {
        "by": "flower-app",
        "app": app.get("app"),
        "command": serve_command(meta, run_dir),
        "queued": None if waiting is None else {**asdict(waiting), "forget": list(waiting.forget)},
        "problem": problem,
    }
