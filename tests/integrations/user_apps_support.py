"""Our test apps of a Flower user, made deletion-ready by their diff, run in-process or by flwr.

``user_apps/`` holds two small Flower apps written for these tests in the shape of Flower's own
quickstarts (Message API; a PyTorch MLP and a NumPy linear classifier on scikit-learn's digits),
each with the diff that makes it record its runs and serve unlearning requests.
``deletion_ready_copy`` copies an app, applies its diff and returns the copy; ``changed_lines``
counts what the diff changes; ``import_app`` imports a copy's ServerApp and ClientApp modules;
``app_config`` reads its run config as Flower would (``[tool.flwr.app.config]``).
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

APPS = Path(__file__).resolve().parent / "user_apps"
PACKAGES = {"pytorch_app": "digits_torch", "numpy_app": "digits_numpy"}


def diff_of(app: str) -> Path:
    return APPS / f"{app}.deletion-ready.diff"


def changed_lines(diff: str) -> int:
    """Return the lines a unified diff changes: per hunk, max(lines added, lines removed)."""
    total, plus, minus = 0, 0, 0
    for line in diff.splitlines():
        if line.startswith(("+++", "---", "diff ")):
            continue
        if line.startswith("@@"):
            total, plus, minus = total + max(plus, minus), 0, 0
        elif line.startswith("+"):
            plus += 1
        elif line.startswith("-"):
            minus += 1
    return total + max(plus, minus)


def changed_files(diff: str) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", diff, re.M)


def deletion_ready_copy(app: str, where: Path, *, diff: bool = True) -> Path:
    """Copy ``app`` into ``where``, apply its diff (unless ``diff=False``); return the copy."""
    target = where / app
    shutil.copytree(APPS / app, target, ignore=shutil.ignore_patterns("__pycache__"))
    if diff:
        subprocess.run(
            ["git", "apply", "-p1", str(diff_of(app))],
            cwd=target,
            check=True,
            capture_output=True,
        )
    return target


def app_config(copy: Path) -> dict:
    """The app's run config (``[tool.flwr.app.config]``)."""
    return dict(
        tomllib.loads((copy / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    )


def import_app(copy: Path, app: str) -> tuple[ModuleType, ModuleType]:
    """Import a copy's ServerApp and ClientApp modules (fresh: earlier copies are unloaded)."""
    package = PACKAGES[app]
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    sys.path.insert(0, str(copy))
    try:
        server = importlib.import_module(f"{package}.server_app")
        client = importlib.import_module(f"{package}.client_app")
    finally:
        sys.path.remove(str(copy))
    return server, client


def unload(app: str) -> None:
    package = PACKAGES[app]
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
