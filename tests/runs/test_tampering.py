"""Issue 37: edited results, an edited store, foreign configs (docs/faults.md, "Tampering").

Before: ``apply`` accepted a result whose ``verification.influence`` was edited from
``not_shown`` to ``removed`` (exit 0, "its receipt: influence removed") or whose
``test_accuracy`` was edited; ``verify`` blamed ``config.yaml`` after the store's own copy of
the config was edited and suggested copying the edited value into it; ``verify`` said ok when
``summary.json`` was missing; ``forget`` ran with another run's ``config.yaml``.
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
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run

pytestmark = pytest.mark.slow  # a trained run and a result (about 10 s on 2 cores)

SMALL = small_config(3)
runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line(res):
    return [line for line in res.output.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A trained run and the result of 'unlearn --forget 1 --method retrain' on it."""
    base = tmp_path_factory.mktemp("tamper")
    train_run(parse_config(SMALL), base / "run")
    res = cli("unlearn", base / "run", "--forget", "1", "--method", "retrain",
              "--out", base / "r.json", "--no-client-test")  # fmt: skip
    assert res.exit_code in (0, 1), res.output
    return base


@pytest.fixture
def copy(made, tmp_path):
    for name in ("run", "r.json", "r.apply.safetensors"):
        src, dst = made / name, tmp_path / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return tmp_path


def generation(run):
    with HistoryStore.open(run / "history") as store:
        return store.generation()


def claim_removed(doc):
    """The review's edit: a receipt that did not show the removal now claims it."""
    receipt = doc["verification"]
    receipt["influence"] = "removed" if receipt["influence"] != "removed" else "not_shown"
    doc["lineage"] = None  # (Retrain's exact lineage shows it by construction: break that too)


@pytest.mark.parametrize(
    "edit",
    [claim_removed, lambda d: d.__setitem__("test_accuracy", 0.999)],
    ids=["influence", "test_accuracy"],
)
def test_apply_refuses_an_edited_result_with_one_line(copy, edit):
    doc = json.loads((copy / "r.json").read_text())
    edit(doc)
    (copy / "r.json").write_text(json.dumps(doc, indent=2))

    res = cli("apply", copy / "run", "--result", copy / "r.json")

    assert res.exit_code == 2, res.output
    assert len(one_line(res)) == 1
    assert "IntegrityError" in one_line(res)[0]
    assert generation(copy / "run") == 0  # nothing applied
    assert (copy / "r.apply.safetensors").exists()  # nor consumed


def test_audit_refuses_an_edited_result_before_any_work(copy):
    doc = json.loads((copy / "r.json").read_text())
    doc["details"]["warnings"] = []
    (copy / "r.json").write_text(json.dumps(doc))
    model = copy / "m.safetensors"
    assert cli("export", copy / "run", "--out", model).exit_code == 0

    res = cli("audit", copy / "run", "--model", model, "--forget", "1",
              "--result", copy / "r.json", "--no-client-test")  # fmt: skip

    assert res.exit_code == 2
    assert "IntegrityError" in one_line(res)[0]


def test_a_result_of_another_run_is_refused_by_apply_and_audit(copy, made):
    other = dict(SMALL, seed=5)
    train_run(parse_config(other), copy / "other")
    model = copy / "m.safetensors"
    assert cli("export", copy / "other", "--out", model).exit_code == 0

    applied = cli("apply", copy / "other", "--result", copy / "r.json")
    audited = cli("audit", copy / "other", "--model", model, "--forget", "1",
                  "--result", copy / "r.json", "--no-client-test")  # fmt: skip

    assert applied.exit_code == 2
    assert "another run" in one_line(applied)[0]
    assert audited.exit_code == 2
    assert "another run" in one_line(audited)[0]


def edit_stored_lr(run, lr):
    """Edit the store's copy of the config directly in SQLite (as a user with sqlite3 would)."""
    con = sqlite3.connect(run / "history" / "history.sqlite")
    meta = json.loads(con.execute("SELECT value FROM info WHERE key='meta'").fetchone()[0])
    meta["config"]["training"]["lr"] = lr
    con.execute("UPDATE info SET value=? WHERE key='meta'", (json.dumps(meta),))
    con.commit()
    con.close()


def test_verify_says_the_store_copy_changed_and_never_suggests_copying_it(copy):
    run = copy / "run"
    edit_stored_lr(run, 0.9)
    before = (run / "config.yaml").read_text()

    res = cli("verify", run, "--json")
    restore = cli("verify", run, "--restore-config")
    applied = cli("apply", run, "--result", copy / "r.json")

    doc = json.loads(res.stdout)
    assert res.exit_code == 1
    assert not doc["ok"]
    assert doc["config_side"] == "store"
    assert "store's copy of the config was edited" in doc["config"]
    assert "Do not run --restore-config" in doc["config"]
    assert restore.exit_code == 1
    assert "HistoryCorruptError" in one_line(restore)[0]
    assert (run / "config.yaml").read_text() == before  # the edited value was not copied
    assert applied.exit_code == 1
    assert generation(run) == 0


def test_verify_still_blames_config_yaml_when_it_is_the_side_that_changed(copy):
    run = copy / "run"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["training"]["lr"] = 0.9
    (run / "config.yaml").write_text(yaml.safe_dump(config))

    doc = json.loads(cli("verify", run, "--json").stdout)
    restored = cli("verify", run, "--restore-config")

    assert doc["config_side"] == "config.yaml"
    assert "--restore-config" in doc["config"]
    assert restored.exit_code == 0  # the store's copy passes its checksum: copying it is right


def test_verify_reports_a_missing_summary_and_rebuild_restores_it(copy):
    run = copy / "run"
    kept = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()

    missing = cli("verify", run)
    rebuilt = cli("verify", run, "--rebuild")

    assert missing.exit_code == 1
    assert "summary.json is missing" in missing.output
    assert rebuilt.exit_code == 0, rebuilt.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == kept["rounds"] == 3
    assert summary["final_metrics"] == kept["final_metrics"]


def test_forget_refuses_a_config_yaml_of_another_run(copy):
    run = copy / "run"
    other = dict(SMALL, seed=9)
    (run / "config.yaml").write_text(yaml.safe_dump(other))

    res = cli("forget", run, "--clients", "1")

    assert res.exit_code == 2
    assert "config.yaml" in one_line(res)[0]
    with HistoryStore.open(run / "history") as store:
        assert store.forget_records() == []  # nothing erased
