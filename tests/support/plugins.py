"""Installed plugins under test: fake entry points, and the ones this repository declares."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from fedunlearn import plugins
from fedunlearn.plugins import ENTRY_POINT_GROUP

__all__ = ["fake_entry_points", "repository_entry_points"]

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def repository_entry_points() -> dict[str, str]:
    """Return this repository's ``fedunlearn.plugins`` entry points (pyproject.toml), by name.

    What an install of this checkout declares, whatever the installed metadata (which may be
    older) says.
    """
    project = tomllib.loads(PYPROJECT.read_text())
    points: dict[str, str] = project["project"]["entry-points"][ENTRY_POINT_GROUP]
    return dict(points)


def _clear() -> None:
    plugins.load.cache_clear()
    plugins.installed.cache_clear()
    plugins._activate.cache_clear()


@pytest.fixture
def fake_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[dict[str, str]], None]]:
    """Replace the installed plugins by ``{name: "module:attr"}`` entries, caches cleared."""

    def install(entries: dict[str, str]) -> None:
        points = [EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in entries.items()]

        def entry_points(group: str, name: str | None = None) -> list[EntryPoint]:
            return [e for e in points if e.group == group and name in (None, e.name)]

        monkeypatch.setattr(plugins, "entry_points", entry_points)
        _clear()

    yield install
    monkeypatch.undo()
    _clear()
