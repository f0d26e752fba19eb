"""Issue 37: every failure is one line with the documented exit code (docs/faults.md).

1 means damaged (and, for unlearn/compare/audit, influence remains), 2 bad input or environment;
a crash must never exit 1. Before: a damaged schema page exited 2 with advice about disk space
and permissions, a damaged ``payloads`` root page exited 2; ``training.lr: 1e308`` and
``training.batch_size: 100000000`` passed validation, crashed in ``fl/vectorized.py`` with a
traceback (exit 1) and left a half-made run directory.
"""

import json
import shutil
import sqlite3

import pytest
import yaml
from tests.support.faults import small_config
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.runs import train_run

SMALL = small_config(2)
PAGE = 16384  # the store's page size (history/store/sqlite.py)
runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def errors(res):
    return [line for line in res.output.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("exits") / "run"
    train_run(parse_config(SMALL), run)
    return run


def damaged_copy(trained, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    file = run / "history" / "history.sqlite"
    with sqlite3.connect(file) as con:
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name='payloads'").fetchone()[0]
    data = bytearray(file.read_bytes())
    damage(data, root)
    file.write_bytes(bytes(data))
    return run


def schema_page(data, root):
    """The table definitions (page 1) say 'dxta' where the payloads table has 'data'."""
    at = data.index(b"data BLOB", 0, PAGE)
    data[at : at + 4] = b"dxta"


def payloads_root(data, root):
    """The payloads table's root page: its b-tree header overwritten."""
    start = (root - 1) * PAGE
    data[start : start + 64] = bytes(range(64))


@pytest.mark.slow  # trains a run (the fixture), then three commands in-process per damage
@pytest.mark.parametrize("damage", [schema_page, payloads_root])
def test_a_damaged_store_exits_1_with_one_line_and_no_disk_space_advice(trained, tmp_path, damage):
    run = damaged_copy(trained, tmp_path, damage)
    model = tmp_path / "m.safetensors"
    for command in (["verify", run], ["info", run], ["export", run, "--out", model]):
        res = cli(*command)
        assert res.exit_code == 1, (command[0], res.output)
        assert len(errors(res)) == 1
        assert "HistoryCorruptError" in errors(res)[0]
        assert "disk space" not in res.output


def test_a_learning_rate_beyond_float32_is_refused_before_anything_is_written(tmp_path):
    config = small_config(2, lr=1e308)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))

    res = cli("train", tmp_path / "c.yaml", "--out", tmp_path / "run")

    assert res.exit_code == 2
    assert "training.lr" in errors(res)[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # trains a run on the vectorized executor (about 3 s)
def test_a_batch_larger_than_every_client_trains_on_the_vectorized_executor(tmp_path):
    config = small_config(2, batch_size=100_000_000, executor="vectorized")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))

    res = cli("train", tmp_path / "c.yaml", "--out", tmp_path / "run", "--json")

    assert res.exit_code == 0, res.output  # it asked for 25.6 GB of padding rows
    assert json.loads(res.stdout)["rounds"] == 2


@pytest.mark.slow  # builds the federation and evaluates round 0 (about 4 s on 2 cores)
def test_an_engine_failure_in_the_first_round_leaves_no_run_directory(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("value cannot be converted to type float without overflow")

    monkeypatch.setattr("fedunlearn.runs.rounds.run_rounds", fail)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(SMALL))

    res = cli("train", tmp_path / "c.yaml", "--out", tmp_path / "run")

    assert res.exit_code == 2, res.output  # never 1: for unlearn that means influence remains
    assert len(errors(res)) == 1
    assert "unexpected RuntimeError" in errors(res)[0]
    assert "Traceback" not in res.output
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # builds the federation and evaluates round 0
def test_an_interrupt_is_not_reported_as_influence_remains(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fedunlearn.runs.rounds.run_rounds", interrupted)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(SMALL))

    res = cli("train", tmp_path / "c.yaml", "--out", tmp_path / "run")

    assert res.exit_code == 130
    assert len(errors(res)) == 1
    assert not (tmp_path / "run").exists()
