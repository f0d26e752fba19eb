"""``fedunlearn export``: a run's model (a round, or an unlearning result) as a model file.

``fedunlearn export RUN [--round N | --result R.json] --out model.safetensors`` writes the
module's ``state_dict`` with safetensors and the model spec in its metadata
(``fedunlearn.models.save_model``); ``fedunlearn.models.load_model(path)`` returns the
``torch.nn.Module``. The module is the one the run trained (rebuilt by ``build_setup`` from the
run's config, so the dataset must be reachable as when training).

- ``--round N`` (default: the last round): the global model after round N, read from the
  history store (round 0 is the initial model).
- ``--result R.json``: the model of ``fedunlearn unlearn ... --out R.json``. The JSON holds the
  method, its parameters and the request, not the weights, so the method is run again on RUN
  (same config and seed give the same model) and the export is refused unless the re-run's
  test accuracy equals the one recorded in R.json. ``unlearn --save-model`` writes the same
  file at once.

The file's metadata records where the weights came from (``fedunlearn.source``: the run's
identity, i.e. config fingerprint, generation and last round, never its path, and the round or
the request) and their evaluation (``fedunlearn.metrics``), both JSON. Exports are deterministic:
the same run (wherever it lies) and round give the same bytes, so models compare by SHA-256.
A full disk ends the command with one line and leaves no part of a file under ``--out``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.history import HistoryStore
from fedunlearn.history.digest import check_seal
from fedunlearn.models import save_model
from fedunlearn.runs import HISTORY_DIR, build_setup, load_run_config, run_fingerprint
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

SUFFIX = ".safetensors"


def check_model_path(path: Path, option: str = "--out") -> Path:
    """Return ``path`` if it names a ``.safetensors`` file, else raise ``ConfigError``."""
    if path.suffix != SUFFIX:
        raise ConfigError(
            f"{option} writes a safetensors model file; name it *{SUFFIX} (got {str(path)!r})"
        )
    return path


def model_bytes(run_dir: Path) -> int:
    """Return the bytes of one model of the run (float32), 0 if not known (no run there)."""
    try:
        with HistoryStore.open(Path(run_dir) / HISTORY_DIR) as store:
            return 4 * (store.run_meta.num_params or 0)
    except FedUnlearnError:
        return 0  # the command reports what is wrong with the run itself


def run_model(run_dir: Path) -> nn.Module:
    """Return the module a run trained (its template: structure, spec and initial weights).

    Built on the CPU whatever the run's ``training.device`` (a GPU run exports anywhere).
    """
    config = load_run_config(run_dir)
    on_cpu = config.training.model_copy(update={"device": "cpu", "executor": "serial"})
    setup = build_setup(config.model_copy(update={"training": on_cpu}))
    setup.close()
    return setup.model


def _metadata(source: dict[str, Any], metrics: dict[str, Any]) -> dict[str, str]:
    numeric = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return {
        "fedunlearn.source": json.dumps(source, sort_keys=True),
        "fedunlearn.metrics": json.dumps(numeric, sort_keys=True),
    }


def save_result_model(
    path: Path,
    run_dir: Path,
    model: nn.Module,
    params: torch.Tensor,
    summary: dict[str, Any],
) -> Path:
    """Write an unlearning result's model (``summary`` as written by ``fedunlearn unlearn``)."""
    source = {
        "run": summary.get("run"),  # the run's identity, not its path: same run, same bytes
        "method": summary["method"],
        "params": summary.get("params", {}),
        "forget": summary["request"]["forget"],
        "kind": summary["request"]["kind"],
    }
    metrics = {k: v for k, v in summary.items() if k in ("test_accuracy", "test_loss")}
    metrics.update({k: v for k, v in summary.items() if k == "backdoor_asr"})
    return save_model(path, model, params=params, metadata=_metadata(source, metrics))


def export_round(run_dir: Path, out: Path, round_: int | None = None) -> dict[str, Any]:
    """Export the global model after ``round_`` (default: the last) of a run; return a summary.

    Raises:
        ConfigError: if ``out`` is not a ``.safetensors`` path or the round is not stored.
    """
    check_model_path(out)
    model = run_model(run_dir)
    config = load_run_config(run_dir)
    with HistoryStore.open(Path(run_dir) / HISTORY_DIR) as store:
        rounds = store.rounds()
        chosen = rounds[-1] if round_ is None and rounds else round_
        if chosen not in rounds:
            shown = f"0..{rounds[-1]}" if rounds else "none"
            raise ConfigError(
                f"round {chosen} is not stored in {run_dir} (rounds {shown}); pick one of those"
            )
        params = store.read_model(chosen)
        metrics = store.round_scalars(chosen)
        identity = {  # the run as it is, not where it lies: same run, same bytes
            "fingerprint": run_fingerprint(config, store.generation(), rounds[-1]),
            "generation": store.generation(),
            "last_round": rounds[-1],
        }
    source = {"run": identity, "round": chosen}
    save_model(out, model, params=params, metadata=_metadata(source, metrics))
    done = {"out": str(out), "round": chosen, "num_params": int(params.numel()), **source}
    if "test_accuracy" not in metrics and config.training.eval_every > 1:
        done["note"] = (
            f"round {chosen} has no test metrics: training.eval_every "
            f"{config.training.eval_every} measured the rounds it divides and the last"
        )
    return done


def export_result(run_dir: Path, result_path: Path, out: Path) -> dict[str, Any]:
    """Re-run the unlearning recorded in ``result_path`` on the run and export its model.

    Raises:
        ConfigError: if ``out`` is not a ``.safetensors`` path, ``result_path`` is not the JSON
            of ``fedunlearn unlearn``, or the re-run does not reproduce its test accuracy
            (nothing is written then).
    """
    check_model_path(out)
    try:
        summary = json.loads(Path(result_path).read_text())
        method, request = summary["method"], summary["request"]
        forget, kind = [int(c) for c in request["forget"]], str(request["kind"])
    except FileNotFoundError:
        raise ConfigError(f"result file {result_path} does not exist") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"{result_path} is not the result JSON of 'fedunlearn unlearn' (needs 'method' and "
            f"'request' with 'forget' and 'kind'; {type(err).__name__}: {err})"
        ) from None
    check_seal(summary, f"--result {result_path}")
    unlearner = make_method(method, summary.get("params") or {})
    with UnlearnSession(run_dir) as session:
        result = session.run(unlearner, UnlearnRequest.of(forget, kind))
        quality = session.evaluation.evaluate(result.params)
        model = session.run_view.model
    recorded = summary.get("test_accuracy")
    if recorded is not None and quality["test_accuracy"] != recorded:
        raise ConfigError(
            f"re-running {method} on {run_dir} gives test accuracy {quality['test_accuracy']!r}, "
            f"{result_path} records {recorded!r}: the result was computed on another run, "
            "machine or device. Nothing was written; run 'fedunlearn unlearn ... --save-model' "
            "where the result was computed"
        )
    save_result_model(out, Path(run_dir), model, result.params, {**summary, **quality})
    return {
        "out": str(out),
        "method": method,
        "forget": forget,
        "kind": kind,
        "num_params": int(result.params.numel()),
        "test_accuracy": quality["test_accuracy"],
    }
