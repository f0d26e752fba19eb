"""What every ``fedunlearn`` command shares: one-line errors, output checks, client-id parsing.

- ``cli_errors`` wraps a command: every error ends it with one line on stderr (what is wrong,
  the path or field, what to do) and the documented exit code: 1 for a damaged store
  (``HistoryCorruptError``), 2 for everything else (bad input, the environment: a full disk,
  permissions, memory; and an unexpected error, named as one), 130 for Ctrl-C (as a shell
  reports SIGINT). No failure exits 1 by accident:
  for ``unlearn``, ``compare`` and ``audit`` 1 means the influence remains. ``fedunlearn
  --debug <command>`` re-raises instead, to show the traceback.
- ``ensure_writable_output`` checks, before any work, that an output file or directory can be
  written, without creating anything.
- ``parse_params`` reads ``--param key=value`` items (YAML values) into a dict.
- ``parse_forget`` reads ``--forget 3,7`` or ``--forget malicious`` the same way for every
  command that takes it.
- ``RunArg``, ``FinishedRunArg``, ``ForgetOption``, ``ReferenceOption``, ``ThresholdsFileOption``
  and ``ThresholdOption`` are the arguments and options several commands take, defined once so
  their names and help read the same everywhere (``run_dir: RunArg``).

This module imports no torch, so the commands stay quick to list (``fedunlearn --help``), and no
click: typer >= 0.26 carries its own copy of click and does not install it, so the CLI uses only
typer's public names (``typer.Context``, ``typer.Exit``).
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from functools import partial, wraps
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer

from fedunlearn.errors import ConfigError, FedUnlearnError, HistoryCorruptError, OutputError

__all__ = [
    "DataDirOption",
    "FinishedRunArg",
    "ForgetOption",
    "ForgetSamplesOption",
    "ReferenceOption",
    "ClientTestOption",
    "ClientTestReferencesOption",
    "DistanceRetrainsOption",
    "ExplainOption",
    "RunArg",
    "ThresholdOption",
    "ThresholdsFileOption",
    "cli_errors",
    "debug_enabled",
    "describe_os_error",
    "ensure_writable_output",
    "fail",
    "install_warning_format",
    "one_line",
    "parse_client_ids",
    "parse_forget",
    "parse_forget_samples",
    "parse_params",
    "set_debug",
]

F = TypeVar("F", bound=Callable[..., Any])

# Arguments and options shared by several commands (typer copies each one per command).
RunArg = Annotated[Path, typer.Argument(metavar="RUN", help="run directory")]
FinishedRunArg = Annotated[Path, typer.Argument(help="finished run directory")]
ForgetOption = Annotated[str, typer.Option(help="client ids '3,7', or 'malicious'")]
#: ``--data-dir`` of the commands that build a run's data (train, plan).
DataDirOption = Annotated[
    Path | None, typer.Option(help="override data.data_dir (where dataset files are)")
]
#: ``--forget-samples CLIENT:FILE``: samples a client asks to delete (sample-level requests).
ForgetSamplesOption = Annotated[
    list[str] | None,
    typer.Option(
        help="delete samples of a client that stays: CLIENT:FILE (a file of its sample ids) or "
        "CLIENT:3,17; repeatable. Served exactly by retrain, tv_exact and shard_retrain"
    ),
]
ReferenceOption = Annotated[
    str, typer.Option(help="verify against 'original' (cheap) or 'retrain' (also runs Retrain)")
]
ThresholdsFileOption = Annotated[
    Path | None, typer.Option(help="YAML file of verification thresholds")
]
ClientTestOption = Annotated[
    bool,
    typer.Option(
        "--client-test/--no-client-test",
        help="also run the client-level membership test (its null: --client-test-references; cost "
        "in the receipt)",
    ),
]
ClientTestReferencesOption = Annotated[
    str | None,
    typer.Option(
        "--client-test-references",
        help="the client-level test's null: 'held_out' (the default; no training: the run's "
        "test examples, Retrain the anchor; built-in data split at random only, else "
        "per_request and the receipt says why; states no detection limit), 'per_request' "
        "(references trained for this request, about 8 Retrains' client epochs; states one) "
        "or 'shared' (trained once per run generation, shared until the next apply)",
    ),
]
DistanceRetrainsOption = Annotated[
    int,
    typer.Option(
        "--distance-retrains",
        help="with --reference retrain (compare: always): the distance check's pass band from "
        "this many (>= 2) independent exact retrains; 0 keeps the fixed line",
    ),
]
ExplainOption = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="print every check of every receipt with its reason (default: one line per "
        "method and per check that decides its verdict)",
    ),
]
ThresholdOption = Annotated[
    list[str] | None, typer.Option(help="one verification threshold key=value (repeatable)")
]

# What to do about an OSError, by errno.
_ADVICE = {
    errno.EACCES: "permission denied; choose a location you can write, or fix its permissions",
    errno.EPERM: "operation not permitted there; choose another location",
    errno.EROFS: "the file system is read-only; choose another location",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.EISDIR: "it is a directory; give a file path",
    errno.ENOSPC: "no space left on the device; free some space or choose another disk",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another disk",
    errno.ENOENT: "no such file or directory; check the path",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
}


def one_line(text: str) -> str:
    """Return ``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(text).split())


# ``--debug`` of the command line being run: set by the root callback, reset when it ends.
_DEBUG: ContextVar[bool] = ContextVar("fedunlearn_cli_debug", default=False)


def set_debug(ctx: typer.Context, debug: bool) -> None:
    """Record ``fedunlearn --debug`` for the command ``ctx`` runs; undone when ``ctx`` closes.

    The root callback calls it. A context variable rather than ``ctx.find_root().params``: the
    click context is not reachable through ``click`` on typer versions that carry their own copy.
    """
    ctx.call_on_close(partial(_DEBUG.reset, _DEBUG.set(debug)))


def debug_enabled() -> bool:
    """Whether ``fedunlearn --debug`` was given to the command line being run."""
    return _DEBUG.get()


def fail(message: str, code: int = 2) -> None:
    """Print ``error: <message>`` as one line on stderr and end the command with ``code``."""
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def describe_os_error(err: OSError) -> str:
    """Return one line naming the path of an OSError and what to do about it."""
    where = err.filename if err.filename is not None else "a file"
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    advice = _ADVICE.get(err.errno or -1, err.strerror or type(err).__name__)
    return f"{where}: {advice} ({err.strerror or err})"


#: Exit code of a damaged store or run directory (``HistoryCorruptError``).
EXIT_DAMAGED = 1


def _from_typer(err: BaseException) -> bool:
    """Whether ``err`` is typer's (or its click's) own control flow, e.g. ``typer.Exit``."""
    return type(err).__module__.split(".")[0] in ("typer", "click", "_typer")


def cli_errors(func: F) -> F:
    """Wrap a command: every error is one line, exit 1 if the store is damaged, else 2."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:  # the reader went away (``fedunlearn info RUN | head``)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
            raise typer.Exit(141) from None  # 128 + SIGPIPE, as a shell reports it
        except HistoryCorruptError as err:
            if debug_enabled():
                raise
            fail(f"{type(err).__name__}: {err}", EXIT_DAMAGED)
        except FedUnlearnError as err:
            if debug_enabled():
                raise
            fail(f"{type(err).__name__}: {err}")
        except OSError as err:
            if debug_enabled():
                raise
            fail(describe_os_error(err))
        except KeyboardInterrupt:  # click would make it exit 1: "influence remains"
            if debug_enabled():
                raise
            fail("interrupted; re-running the same command is safe (docs/faults.md)", 130)
        except MemoryError:
            if debug_enabled():
                raise
            fail("out of memory; use a smaller model, batch or federation, or a larger machine")
        except Exception as err:
            if debug_enabled() or _from_typer(err):
                raise
            fail(
                f"unexpected {type(err).__name__}: {err} (a fedunlearn bug, or an environment it "
                "does not handle; rerun with 'fedunlearn --debug ...' for the traceback and "
                "report it)"
            )

    return wrapper  # type: ignore[return-value]


def _warning_line(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> str:
    return f"warning: {one_line(str(message))}\n"


def install_warning_format() -> None:
    """Print warnings as one ``warning: ...`` line (no source location, no code line)."""
    warnings.formatwarning = _warning_line  # type: ignore[assignment]


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(".")


def ensure_writable_output(
    path: Path,
    kind: Literal["file", "directory"],
    option: str = "--out",
    *,
    need_bytes: int = 0,
) -> Path:
    """Check that ``path`` can be written as a ``kind``, before any work; create nothing.

    Missing directories on the way are fine (the command creates them); the nearest existing
    one must be a directory this process can create files in (checked by creating and
    removing a temporary file there, which catches permissions, read-only file systems and
    pseudo-file systems such as /sys alike), with at least ``need_bytes`` free on its file
    system (a full disk is refused before the work, not after it).

    Args:
        path: The output path.
        kind: ``"file"`` (a result file, a model) or ``"directory"`` (a run or report dir).
        option: The option that named it, for the message.
        need_bytes: What the command will write there at least (e.g. a model's bytes).

    Returns:
        ``path``.

    Raises:
        OutputError: Naming the option, the path, what is wrong and what to do.
    """
    path = Path(path)
    if kind == "file" and path.is_dir():
        raise OutputError(
            f"{option} {path} is a directory; give a file path (e.g. {path / 'result.json'})"
        )
    if kind == "directory" and path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path} is a file, not a directory; give a directory path")
    target = path.parent if kind == "file" else path
    existing = _nearest_existing(target)
    if not existing.is_dir():
        raise OutputError(
            f"{option} {path}: {existing} is a file, so nothing can be created below it; "
            "choose another path"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".fedunlearn-write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        advice = _ADVICE.get(err.errno or -1, err.strerror or str(err))
        raise OutputError(f"{option} {path}: cannot write in {existing}: {advice}") from None
    if kind == "file" and path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{option} {path} exists and is not writable; choose another path")
    if need_bytes:
        fs = os.statvfs(existing)
        free = fs.f_bavail * fs.f_frsize
        if free < need_bytes:
            raise OutputError(
                f"{option} {path}: needs at least {need_bytes:,} bytes, {free:,} free on the file "
                f"system of {existing}; free some space or choose another disk (nothing was done)"
            )
    return path


def parse_client_ids(value: str, option: str = "--clients") -> list[int]:
    """Parse ``3,7`` into sorted unique client ids.

    Raises:
        ConfigError: Not comma-separated non-negative integers, or empty.
    """
    parts = [v.strip() for v in value.split(",")]
    try:
        ids = sorted({int(v) for v in parts if v})
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated client ids; got {value!r}") from None
    if not ids:
        raise ConfigError(f"{option} is empty: name at least one client id (e.g. {option} 3,7)")
    if "" in parts[:-1]:  # '3,,4' or ',4': a typo that could hide a missing id ('3,7,' is fine)
        raise ConfigError(f"{option} has an empty id between commas; got {value!r}")
    if ids[0] < 0:
        raise ConfigError(f"{option}: client ids are >= 0; got {ids[0]}")
    return ids


def parse_forget(value: str, run_dir: Path, option: str = "--forget") -> tuple[list[int], str]:
    """Parse ``--forget``: ``3,7`` (a deletion request) or ``malicious`` (a recovery request).

    Returns:
        The client ids, and ``"forget"`` or ``"recover"``.

    Raises:
        ConfigError: Bad ids, or ``malicious`` for a run without malicious clients.
        HistoryError: ``malicious`` and ``run_dir`` is not a run directory.
    """
    if value.strip() == "malicious":
        from fedunlearn.history.store import HistoryStore
        from fedunlearn.runs import HISTORY_DIR

        run_dir = Path(run_dir)
        with HistoryStore.open(run_dir / HISTORY_DIR) as store:
            malicious = sorted(store.run_meta.malicious)
        if not malicious:
            raise ConfigError(f"{option} malicious: {run_dir} has no malicious clients")
        return malicious, "recover"
    return parse_client_ids(value, option), "forget"


def parse_forget_samples(items: Sequence[str]) -> dict[int, list[int]]:
    """Parse ``--forget-samples CLIENT:FILE`` items (or ``CLIENT:3,17,40``) into client -> ids.

    FILE holds the client's sample ids (its local training set's row numbers as the run built
    them), separated by commas, spaces or new lines; ``#`` starts a comment.

    Raises:
        ConfigError: An item is not ``CLIENT:FILE`` or ``CLIENT:ids``, the file cannot be read,
            or an id is not a non-negative decimal integer.
    """
    out: dict[int, set[int]] = {}
    for item in items:
        client, sep, rest = item.partition(":")
        if not sep or not client.strip().isascii() or not client.strip().isdigit():
            raise ConfigError(
                f"--forget-samples takes CLIENT:FILE (a file of sample ids) or CLIENT:3,17; "
                f"got {item!r}"
            )
        path = Path(rest)
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise ConfigError(f"--forget-samples {item}: cannot read {path} ({err})") from None
        else:
            text = rest
        tokens = [
            t for line in text.splitlines() for t in line.split("#", 1)[0].replace(",", " ").split()
        ]
        bad = [t for t in tokens if not (t.isascii() and t.isdigit())]
        if bad or not tokens:
            what = f"{path} (no such file, and not ids)" if not path.is_file() else str(path)
            raise ConfigError(
                f"--forget-samples {item}: {what}: sample ids are non-negative integers"
                + (f"; got {bad[0]!r}" if bad else "; none given")
            )
        out.setdefault(int(client), set()).update(int(t) for t in tokens)
    return {c: sorted(ids) for c, ids in sorted(out.items())}


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """Return ``--param key=value`` items as a dict, each value read as YAML.

    Raises:
        ConfigError: An item is not ``key=value``.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param takes key=value; got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out
