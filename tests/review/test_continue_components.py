"""Review of issues 22/23: ``--continue`` / ``--resume`` on a run whose data source changed.

``UnlearnSession`` warns in one line when a user component (``data.source``,
``model.factory``) changed since training (``runs/components.py``). ``continue_run`` built the
run's setup again and trained further rounds on the changed data without a word: the continued
rounds then mix two data sets in one history, and a resumed continuation is no longer the
uninterrupted one. ``train --resume`` had the same hole.
"""

import sys

import pytest

from fedunlearn.config import parse_config
from fedunlearn.runs import continue_run, train_run

OWN = "tests.support.own_components"


def _user_package(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mydata.py").write_text(
        f"from {OWN} import load as _load\n\n"
        "def load(num_clients, seed, **options):\n"
        "    return _load(num_clients, seed, **options)\n"
    )
    monkeypatch.syspath_prepend(str(package))
    return package


def _change_source(package, monkeypatch):
    (package / "mydata.py").write_text(
        f"from {OWN} import load as _load\n\n"
        "def load(num_clients, seed, **options):\n"
        "    return _load(num_clients, seed + 1, **options)\n"
    )
    monkeypatch.delitem(sys.modules, "mydata", raising=False)


class _Stop(Exception):
    pass


class _StopAfterRound1:
    def on_round_end(self, record):
        raise _Stop


@pytest.mark.slow
def test_resume_warns_when_the_data_source_changed_since_the_first_rounds(tmp_path, monkeypatch):
    package = _user_package(tmp_path, monkeypatch)
    config = parse_config(
        {
            "seed": 3,
            "data": {"num_clients": 4, "source": "mydata:load", "options": {"per_client": 16}},
            "model": {"factory": f"{OWN}:make_plain"},
            "training": {"rounds": 2, "batch_size": 16, "lr": 0.1, "executor": "serial"},
            "history": {"policy": "all"},
        }
    )
    with pytest.raises(_Stop):
        train_run(config, tmp_path / "run", observers=[_StopAfterRound1()])

    _change_source(package, monkeypatch)
    with pytest.warns(UserWarning) as caught:
        train_run(config, tmp_path / "run", resume=True)

    lines = [str(w.message) for w in caught if "changed since training" in str(w.message)]
    assert len(lines) == 1
    assert "data.source mydata:load changed since training" in lines[0]


@pytest.mark.slow
def test_continue_warns_when_the_data_source_changed_since_training(tmp_path, monkeypatch):
    # Prepare: the user's data module, in a directory on sys.path
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mydata.py").write_text(
        f"from {OWN} import load as _load\n\n"
        "def load(num_clients, seed, **options):\n"
        "    return _load(num_clients, seed, **options)\n"
    )
    monkeypatch.syspath_prepend(str(package))
    config = {
        "seed": 3,
        "data": {"num_clients": 4, "source": "mydata:load", "options": {"per_client": 16}},
        "model": {"factory": f"{OWN}:make_plain"},
        "training": {"rounds": 1, "batch_size": 16, "lr": 0.1, "executor": "serial"},
        "history": {"policy": "all"},
    }
    train_run(parse_config(config), tmp_path / "run")

    # Execute: the source now draws other data
    (package / "mydata.py").write_text(
        f"from {OWN} import load as _load\n\n"
        "def load(num_clients, seed, **options):\n"
        "    return _load(num_clients, seed + 1, **options)\n"
    )
    monkeypatch.delitem(sys.modules, "mydata", raising=False)
    with pytest.warns(UserWarning) as caught:
        continue_run(tmp_path / "run", 1)

    # Assert
    lines = [str(w.message) for w in caught if "changed since training" in str(w.message)]
    assert len(lines) == 1
    assert "data.source mydata:load changed since training" in lines[0]
    assert "its data" in lines[0]
