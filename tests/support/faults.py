"""Fault injection for the slow fault suite: real ``fedunlearn`` processes, faults at chosen points.

``run(args, faults=[...])`` runs ``fedunlearn ARGS`` in a child Python process that first wraps
the named functions: at the n-th call, before or after the real call, the child is killed with
SIGKILL (``kill``), gets ``OSError(ENOSPC)`` as from a full disk (``enospc``), or pauses until
the test lets it go (``pause``: it creates ``<name>.paused`` and waits for ``<name>.go``).
``file_limit`` sets ``RLIMIT_FSIZE`` (SIGXFSZ ignored): every write past that many bytes of one
file fails with ``EFBIG``, a full disk as one file sees it, without privileges.
``small_disk(...)`` runs a script with a real tmpfs of a given size mounted in a private mount
namespace (``unshare -rm``), where the kernel allows it (``small_disk_available``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_CHILD = r"""
import errno, json, os, signal, sys, time, importlib
spec = json.loads(sys.argv[1])

def resolve(target):
    module, _, path = target.partition(":")
    owner = importlib.import_module(module)
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, name

def act(fault, args):
    if fault["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault["action"] == "enospc":
        name = next((str(a) for a in args if isinstance(a, (str, os.PathLike))), None)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
    if fault["action"] == "pause":
        open(fault["name"] + ".paused", "w").close()
        deadline = time.monotonic() + 300
        while not os.path.exists(fault["name"] + ".go") and time.monotonic() < deadline:
            time.sleep(0.02)

def wrap(fault):
    owner, name = resolve(fault["target"])
    real = getattr(owner, name)
    calls = [0]
    def wrapper(*args, **kwargs):
        calls[0] += 1
        hit = calls[0] == fault["call"]
        if hit and fault["when"] == "before":
            act(fault, args)
        out = real(*args, **kwargs)
        if hit and fault["when"] == "after":
            act(fault, args)
        return out
    setattr(owner, name, wrapper)

for fault in spec["faults"]:
    wrap(fault)
from fedunlearn.cli.main import main
sys.argv = ["fedunlearn", *spec["argv"]]
main()
"""


@dataclass(frozen=True)
class Fault:
    """Do ``action`` at the ``call``-th call of ``target`` (``module:Owner.attr``)."""

    target: str
    action: str  # kill, enospc or pause
    when: str = "before"  # before or after the real call
    call: int = 1
    name: str = ""  # pause: the path prefix of its .paused / .go files


def small_config(rounds: int = 3, hidden: int = 8, **training) -> dict:
    """The suite's run: digits, 4 clients, 400 samples, an MLP, ``all`` recording (1-3 s)."""
    return {
        "seed": 1,
        "data": {"dataset": "digits", "num_clients": 4, "max_train_samples": 400},
        "model": {"name": "mlp", "hidden": [hidden]},
        "training": {
            "rounds": rounds,
            "local_epochs": 1,
            "lr": 0.3,
            "batch_size": 32,
            "executor": "serial",
            **training,
        },  # fmt: skip
        "history": {"policy": "all"},
    }


def _limit(file_limit: int | None):
    def preexec() -> None:
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return preexec


def command(args, faults=()) -> list[str]:
    """The child's command line."""
    spec = {"argv": [str(a) for a in args], "faults": [asdict(f) for f in faults]}
    return [sys.executable, "-c", _CHILD, json.dumps(spec)]


def run(args, *, faults=(), file_limit=None, timeout=300) -> subprocess.CompletedProcess:
    """Run ``fedunlearn ARGS`` with ``faults`` and return the finished process."""
    return subprocess.run(
        command(args, faults),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit(file_limit),
        check=False,
    )


def start(args, *, faults=()) -> subprocess.Popen:
    """Start ``fedunlearn ARGS`` with ``faults`` (e.g. a pause) and return the process."""
    return subprocess.Popen(
        command(args, faults), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(path: Path, process: subprocess.Popen | None = None, timeout: float = 180) -> None:
    """Wait until ``path`` exists (a paused child arrived), failing if the child ended first."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the child ended before {path}: {process.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.05)


def error_lines(proc) -> list[str]:
    """The ``error:`` lines a command wrote on stderr (none with a traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def small_disk_available() -> bool:
    """Whether a tmpfs can be mounted in a private namespace here (``unshare -rm``)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def small_disk(mountpoint: Path, size: str, script: str, *args, timeout=300):
    """Run a Python ``script`` with a ``size`` tmpfs mounted at ``mountpoint`` (only for it).

    The mount lives in the script's private namespace: outside, ``mountpoint`` stays an empty
    directory, so the script reports what it found (e.g. as JSON on stdout).
    """
    Path(mountpoint).mkdir(parents=True, exist_ok=True)
    inner = f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", inner, str(mountpoint), sys.executable, "-c", script]
        + [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ},
    )
