"""``check-receipt`` (issue 34): an auditor checks a result against the run it names.

An edited figure (with or without a recomputed seal), another model, a cut chain (a committed
payload or a round's rows deleted by raw SQL) and another run's result each fail with one line
(exit 1); a Retrain result, a deletion-ready ``tv_exact`` result and a Crab participation-rollback
result are replayed bit for bit (exit 0; Crab's replay proves the computation, its lineage being
approximate); a result naming parameters it did not run fails its replay; bad input exits 2.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from tests.unlearn.deletion_ready.test_tv_exact import TV as TV_RUN
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.experiments import unlearn_one, write_result
from fedunlearn.experiments.receipt_check import check_receipt
from fedunlearn.history.digest import canonical_json, seal
from fedunlearn.history.store import HistoryStore
from fedunlearn.history.store.chain import GENESIS_PREV
from fedunlearn.runs import train_run

runner = CliRunner()

RUN = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "logreg"},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 64, "executor": "serial"},
    "history": {"policy": "all"},
}
# deletion-ready (configs/mnist_deletion_ready.yaml's keys), tiny: test_tv_exact's run
TV = {**TV_RUN, "seed": 2, "history": {"policy": "none"}}


def _result(run: Path, out: Path, method: str, forget: list[int]) -> Path:
    result, summary = unlearn_one(run, forget, method, verify=False, evaluate_rounds=False)
    write_result(out, summary, result)
    return out


@pytest.fixture(scope="module")
def retrain(tmp_path_factory):
    """A run, its Retrain result and the original model saved as a .pt file."""
    base = tmp_path_factory.mktemp("receipt")
    run = base / "run"
    train_run(parse_config(RUN), run)
    path = _result(run, base / "retrain.json", "retrain", [2])
    from fedunlearn.history.store import HistoryStore

    with HistoryStore.open(run / "history") as store:
        torch.save(store.read_model(3), base / "original.pt")
    return run, path, base


def _lines(checked) -> dict[str, tuple[bool | None, str]]:
    return {f.name: (f.ok, f.line) for f in checked.findings}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_retrain_result_is_replayed_bit_for_bit(retrain):
    run, path, _ = retrain
    checked = check_receipt(path, run)
    found = _lines(checked)
    assert checked.ok
    assert [f.name for f in checked.findings] == [
        "seal",
        "run",
        "chain",
        "request",
        "verdict",
        "model",
        "figures",
        "replay",
    ]
    assert found.pop("verdict")[0] is None  # written without a receipt: no verdict to check
    assert all(ok is True for ok, _ in found.values())
    assert "bit for bit" in found["replay"][1]
    doc = json.loads(path.read_text())
    assert doc["run"]["chain"]["seq"] == 5  # genesis, rounds 0..3: the head the result names


def test_an_edited_figure_fails_with_or_without_a_new_seal(retrain, tmp_path):
    run, path, _ = retrain
    doc = json.loads(path.read_text())
    doc["test_accuracy"] = round(doc["test_accuracy"] + 0.05, 6)
    edited = tmp_path / "edited.json"
    shutil.copy(path.with_name("retrain.apply.safetensors"), tmp_path)
    edited.write_text(json.dumps(doc))
    found = _lines(check_receipt(edited, run))
    assert found["seal"][0] is False
    assert found["replay"][0] is None
    seal(doc, doc["run"])  # a forger who recomputes the checksum
    edited.write_text(json.dumps(doc))
    checked = check_receipt(edited, run)
    found = _lines(checked)
    assert not checked.ok
    assert found["seal"][0] is True
    assert found["figures"][0] is False
    assert found["figures"][1].startswith("test_accuracy is ")


def test_another_model_fails(retrain):
    run, path, base = retrain
    found = _lines(check_receipt(path, run, model=base / "original.pt"))
    assert found["model"][0] is False
    assert "is another model" in found["model"][1]


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        (
            [
                "DELETE FROM payloads WHERE round=2 AND kind='update' AND client_id=4",
                "DELETE FROM payload_prints WHERE round=2 AND client_id=4",
            ],
            "round 2 client 4: committed, but gone with no deletion record",
        ),
        (
            [f"DELETE FROM {t} WHERE round=1" for t in ("payloads", "payload_prints", "clients")]
            + ["DELETE FROM rounds WHERE round=1"],
            "round 1: committed, but its rows and 8 payload(s) are gone",
        ),
    ],
    ids=["payload", "round"],
)
def test_a_cut_chain_fails(retrain, tmp_path, statements, expected):
    run, path, _ = retrain
    cut = _copy(run, tmp_path / "run")
    con = sqlite3.connect(cut / "history" / "history.sqlite", isolation_level=None)
    for statement in statements:
        con.execute(statement)
    con.close()
    found = _lines(check_receipt(path, cut))
    assert found["chain"][0] is False
    assert expected in found["chain"][1]


def test_a_consistently_rewritten_chain_no_longer_holds_the_receipts_head(retrain, tmp_path):
    run, path, _ = retrain
    other = _copy(run, tmp_path / "run")
    con = sqlite3.connect(other / "history" / "history.sqlite", isolation_level=None)
    prev = GENESIS_PREV
    for seq, body in con.execute("SELECT seq, body FROM chain ORDER BY seq").fetchall():
        doc = json.loads(body) | {"prev": prev}
        if seq == 1:
            doc["created_at"] += 1.0  # a forger rewrites every link from the first
        text = canonical_json(doc).decode()
        prev = hashlib.sha256(text.encode()).hexdigest()
        con.execute("UPDATE chain SET body=?, link=? WHERE seq=?", (text, prev, seq))
    con.close()
    found = _lines(check_receipt(path, other))
    assert found["chain"][0] is False
    assert "is not in this run's chain" in found["chain"][1]


def test_another_runs_result_fails(retrain, tmp_path):
    run, path, _ = retrain
    other = tmp_path / "other"
    train_run(parse_config({**RUN, "seed": 9}), other)
    found = _lines(check_receipt(path, other))
    assert found["run"][0] is False
    assert found["chain"][0] is False
    assert "is not in this run's chain" in found["chain"][1]


def test_a_result_of_another_architecture_fails_the_run_instead_of_erroring(retrain, tmp_path):
    """A user review: its model was evaluated on the other run's network (exit 2, a shape)."""
    run, path, _ = retrain
    other = tmp_path / "other"
    train_run(parse_config({**RUN, "model": {"name": "mlp", "hidden": [8]}}), other)
    checked = check_receipt(path, other)
    found = _lines(checked)
    assert not checked.ok
    assert found["run"][0] is False
    assert "figures" not in found
    assert found["replay"][0] is None
    res = runner.invoke(app, ["check-receipt", str(path), "--run", str(other)])
    assert res.exit_code == 1, res.output


def test_a_tv_exact_result_is_replayed_bit_for_bit(tmp_path):
    run = tmp_path / "tv"
    train_run(parse_config(TV), run)
    path = _result(run, tmp_path / "tv.json", "tv_exact", [3])
    checked = check_receipt(path, run)
    found = _lines(checked)
    assert checked.ok, found
    assert found["replay"][0] is True
    assert "tv_exact re-run" in found["replay"][1]


CRAB = {
    **RUN,
    "training": {**RUN["training"], "rounds": 6, "participation": 0.5},
    "history": {"policy": "crab"},
}


@pytest.fixture(scope="module")
def crab(tmp_path_factory):
    """A Crab-recorded run and Crab's participation-rollback result for client 4.

    Client 4 is first aggregated in round 3 (seed 1), so the rollback starts from M_2; the
    replay then reads stored updates of the remaining clients, an approximate lineage.
    """
    base = tmp_path_factory.mktemp("crab")
    run = base / "run"
    train_run(parse_config(CRAB), run)
    return run, _result(run, base / "crab.json", "crab", [4])


def test_a_crab_participation_rollback_result_is_replayed_bit_for_bit(crab):
    run, path = crab
    doc = json.loads(path.read_text())
    assert doc["params"]["rollback"] == "participation"
    assert doc["lineage"]["kind"] == "approximate"
    assert doc["lineage"]["start_round"] == 2  # the rollback point precedes round 3
    checked = check_receipt(path, run)
    found = _lines(checked)
    assert checked.ok, found
    assert found["replay"][0] is True
    assert "proves the computation, not the removal" in found["replay"][1]


def test_a_result_naming_parameters_it_did_not_run_fails_the_replay(crab, tmp_path):
    # before: a result without an exact lineage was not replayed, so a server could name any
    # method parameters (here: Crab's rollback) beside a model computed otherwise
    run, path = crab
    doc = json.loads(path.read_text())
    doc["params"]["no_rollback"] = True  # claims a replay from M_0
    seal(doc, doc["run"])
    edited = tmp_path / "crab.json"
    shutil.copy(path.with_name("crab.apply.safetensors"), tmp_path)
    edited.write_text(json.dumps(doc))
    checked = check_receipt(edited, run)
    found = _lines(checked)
    assert not checked.ok
    assert found["seal"][0] is True
    assert found["model"][0] is True
    assert found["replay"][0] is False
    assert "not what crab computes" in found["replay"][1]


def test_cli_exit_codes(retrain, tmp_path):
    run, path, base = retrain
    ok = runner.invoke(app, ["check-receipt", str(path), "--run", str(run)])
    assert ok.exit_code == 0, ok.output
    assert ok.output.splitlines()[-1].startswith("ok   replay: ")
    swapped = runner.invoke(
        app, ["check-receipt", str(path), "--run", str(run), "--model", str(base / "original.pt")]
    )
    assert swapped.exit_code == 1
    assert [line for line in swapped.output.splitlines() if line.startswith("FAIL")] == [
        next(line for line in swapped.output.splitlines() if line.startswith("FAIL model: "))
    ]


def test_bad_input_exits_2(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    res = runner.invoke(app, ["check-receipt", str(bad), "--run", str(tmp_path)])
    assert res.exit_code == 2
    assert "not readable JSON" in " ".join(res.output.split())
    bad.write_text(json.dumps({"method": "retrain"}))
    res = runner.invoke(app, ["check-receipt", str(bad), "--run", str(tmp_path)])
    assert res.exit_code == 2
    assert "no 'request'" in res.output


def _forged(path: Path, tmp_path: Path, edit) -> Path:
    doc = json.loads(path.read_text())
    edit(doc)
    seal(doc, doc["run"])  # a forger who recomputes the checksum
    shutil.copy(path.with_name(path.stem + ".apply.safetensors"), tmp_path)
    forged = tmp_path / path.name
    forged.write_text(json.dumps(doc))
    return forged


def _clean_lineage(doc):
    doc["lineage"]["tainted_reads"] = {"updates": [], "aggregates": [], "models": []}
    doc["lineage"]["reason"] = "read nothing of client 4"


def _removed_verdict(doc):
    doc["verification"] = {
        "influence": "removed",
        "influence_basis": "exact_lineage",
        "lineage": {**doc["lineage"], "kind": "exact"},
    }


def _removed_word(basis):
    def edit(doc):  # the lineage left approximate, as the replay finds it
        doc["verification"] = {"influence": "removed", "influence_basis": basis}

    return edit


FORGERIES = [_clean_lineage, _removed_verdict, _removed_word("no_limit"), _removed_word("x")]


@pytest.mark.parametrize(
    ("edit", "caught_by"),
    zip(FORGERIES, ["replay", "verdict", "verdict", "verdict"], strict=True),
    ids=["lineage", "verdict", "word", "word_basis"],
)
def test_a_forged_lineage_or_removed_verdict_under_a_new_seal_fails_the_replay(
    crab, tmp_path, edit, caught_by
):
    # before: only the model was compared, so an approximate result could claim it read nothing
    # of the client, or carry an 'influence removed by exact lineage' verdict, and get ok
    run, path = crab
    checked = check_receipt(_forged(path, tmp_path, edit), run)
    found = _lines(checked)
    assert not checked.ok
    assert found["seal"][0] is True
    assert found["model"][0] is True
    assert found[caught_by][0] is False
    assert ("lineage" if caught_by == "replay" else "not a verdict a receipt gives") in found[
        caught_by
    ][1]


def _receipt(run: Path, model: Path, out: Path, *extra: str) -> Path:
    res = runner.invoke(
        app,
        ["audit", str(run), "--model", str(model), "--forget", "2", "--no-client-test"]
        + ["--out", str(out), *extra],
    )
    assert res.exit_code in (0, 1), res.output
    return out


def test_an_audit_receipt_is_checked_with_nothing_to_replay(retrain, tmp_path):
    # before: every `audit --out` receipt exited 2 (it names `result_method`, not `method`)
    run, _, base = retrain
    receipt = _receipt(run, base / "original.pt", tmp_path / "receipt.json")
    checked = check_receipt(receipt, run, model=base / "original.pt")
    found = _lines(checked)
    assert checked.ok, found
    assert found["replay"][0] is None


def test_a_receipt_claiming_removal_by_an_exact_lineage_fails_without_a_result(retrain, tmp_path):
    run, _, base = retrain
    receipt = _receipt(run, base / "original.pt", tmp_path / "receipt.json")
    doc = json.loads(receipt.read_text())
    doc["verification"]["influence"] = "removed"
    doc["verification"]["influence_basis"] = "exact_lineage"
    seal(doc, doc["run"])  # a forger who recomputes the checksum
    receipt.write_text(json.dumps(doc))
    checked = check_receipt(receipt, run, model=base / "original.pt")
    found = _lines(checked)
    assert not checked.ok
    assert found["verdict"][0] is False  # no lineage stated: no exact one to rest on
    assert found["replay"][0] is None
    # with an exact lineage stated too, the claim passes the static rule; nothing can re-run it
    doc["verification"]["lineage"] = {"kind": "exact"}
    seal(doc, doc["run"])
    receipt.write_text(json.dumps(doc))
    found = _lines(check_receipt(receipt, run, model=base / "original.pt"))
    assert found["verdict"][0] is True
    assert found["replay"][0] is False
    assert "cannot be shown from it" in found["replay"][1]


def test_after_the_clients_stored_updates_are_forgotten_crab_says_it_cannot_replay(crab, tmp_path):
    # before: the replay's UnsupportedHistoryError escaped the check (exit 2)
    run, path = crab
    copy = _copy(run, tmp_path / "run")
    shutil.copy(path, tmp_path / "crab.json")
    shutil.copy(path.with_name("crab.apply.safetensors"), tmp_path)
    res = runner.invoke(app, ["forget", str(copy), "--clients", "4"])  # the result's own client
    assert res.exit_code == 0, res.output
    checked = check_receipt(tmp_path / "crab.json", copy)
    found = _lines(checked)
    assert found["request"][0] is True
    assert found["replay"][0] is None
    assert "cannot be replayed on this run as it is now" in found["replay"][1]


@pytest.mark.parametrize("claim", ["privacy", "warnings", "kind"])
def test_a_privacy_statement_warnings_or_lineage_kind_edited_under_a_new_seal_fail(
    crab, tmp_path, claim
):
    # before: only the model and the lineage were compared with the re-run (review of 1c1ab72)
    run, path = crab
    doc = json.loads(path.read_text())
    if claim == "privacy":
        doc["privacy"]["enabled"] = not doc["privacy"]["enabled"]
    elif claim == "warnings":
        doc["details"]["warnings"] = [*doc["details"]["warnings"], "an invented warning"]
    else:
        doc["lineage"]["kind"] = "Exact"  # not a kind: was read as approximate
    seal(doc, doc["run"])
    edited = tmp_path / "crab.json"
    shutil.copy(path.with_name("crab.apply.safetensors"), tmp_path)
    edited.write_text(json.dumps(doc))
    if claim == "kind":
        res = runner.invoke(app, ["check-receipt", str(edited), "--run", str(run)])
        assert res.exit_code == 2
        assert "neither 'exact' nor 'approximate'" in " ".join(res.output.split())
        return
    checked = check_receipt(edited, run)
    found = _lines(checked)
    assert not checked.ok
    assert found["replay"][0] is False
    assert claim in found["replay"][1]


def test_a_client_forgotten_after_the_head_is_not_required_in_the_request(retrain, tmp_path):
    # before: `forget --clients 3` after a Retrain result for client 2 failed its request check
    # ("does not forget client(s) [3], forgotten earlier"); client 3 was forgotten later
    run, path, _ = retrain
    copy = _copy(run, tmp_path / "run")
    shutil.copy(path, tmp_path / "retrain.json")
    shutil.copy(path.with_name("retrain.apply.safetensors"), tmp_path)
    res = runner.invoke(app, ["forget", str(copy), "--clients", "3"])
    assert res.exit_code == 0, res.output
    found = _lines(check_receipt(tmp_path / "retrain.json", copy))
    assert found["request"][0] is True
    assert found["chain"][0] is True
    assert found["replay"][0] is False  # an exact claim that cannot be re-run on the run now
    assert "forgotten after the document's head" in found["replay"][1]


@pytest.mark.parametrize("basis", ["no_limit", "construction"])
def test_apply_refuses_a_removed_word_its_lineage_does_not_give(crab, tmp_path, basis):
    """A user review: apply printed "its receipt: influence removed" for an edited verdict."""
    run, path = crab
    forged = _forged(path, tmp_path, _removed_word(basis))
    copy = _copy(run, tmp_path / "run")
    res = runner.invoke(app, ["apply", str(copy), "--result", str(forged)])
    assert res.exit_code == 2, res.output
    assert "a receipt says removed only by an exact lineage" in " ".join(res.output.split())
    with HistoryStore.open(copy / "history") as store:
        assert store.events() == []  # nothing applied


def test_apply_without_its_apply_file_says_why_it_may_be_gone_and_what_to_run(retrain, tmp_path):
    """A user review: after forget deleted it, apply said only "its apply file ... is missing"."""
    run, path, _ = retrain
    copy = _copy(run, tmp_path / "run")
    result = tmp_path / path.name
    shutil.copy(path, result)  # its apply file not copied
    res = runner.invoke(app, ["apply", str(copy), "--result", str(result)])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "deleted by 'fedunlearn forget'" in said
    assert "run the request again with 'fedunlearn unlearn'" in said
    with HistoryStore.open(copy / "history") as store:
        assert store.events() == []


def _powered_removed(doc):
    doc["verification"] = {"influence": "removed", "influence_basis": "powered_pass"}


def test_a_forged_removed_fails_even_when_nothing_can_be_replayed(crab, tmp_path):
    """A review: after a later forget (replay n/a) a forged removed passed with every line ok."""
    run, path = crab
    forged = _forged(path, tmp_path, _powered_removed)
    copy = _copy(run, tmp_path / "run")
    with HistoryStore.open(copy / "history", writable=True) as store:
        store.forget([2])  # a client forgotten after the document's head: no replay
    checked = check_receipt(forged, copy)
    found = _lines(checked)
    assert not checked.ok
    assert found["verdict"][0] is False
    assert "only by an exact lineage" in found["verdict"][1]


def test_a_forged_clients_entry_fails(crab, tmp_path):
    """A review: a per-client entry edited to removed by exact lineage passed."""
    run, path = crab

    def edit(doc):
        doc["verification"] = {
            "influence": "not_shown",
            "influence_basis": "no_limit",
            "clients": [{"client": 4, "influence": "removed", "basis": "exact_lineage"}],
        }

    found = _lines(check_receipt(_forged(path, tmp_path, edit), run))
    assert found["verdict"][0] is False
    assert "its entry for client 4" in found["verdict"][1]
