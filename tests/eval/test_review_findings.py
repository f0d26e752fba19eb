"""False verdicts found by the adversarial review of the issue-33 rules (seed 7 of the quickstart).

Each test reproduces one finding of ``reproductions/verification/review_issue33.py``; they fail
on the code the review judged: ``removed`` given to a model whose lineage is not exact (1-3), a
store ``deleted`` after a raw-SQL deletion that left each update rebuildable (4).
"""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from fedunlearn.config import load_config
from fedunlearn.errors import IntegrityError
from fedunlearn.eval import ReceiptOptions, open_receipts
from fedunlearn.experiments import write_result
from fedunlearn.experiments.audit import audit_model
from fedunlearn.experiments.compare import unlearn_one
from fedunlearn.history.digest import seal
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.base import Details, RunOutput, Unlearner
from fedunlearn.unlearn.registry import registered

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("review33") / "run"
    train_run(load_config(QUICKSTART, {"seed": 7}), path)
    yield path
    torch.set_num_threads(before)


def _result_file(run: Path, method: str, out: Path) -> Path:
    """What ``fedunlearn unlearn --method M --forget 0 --out out`` writes (sealed)."""
    result, summary = unlearn_one(run, [0], method, verify=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, summary, result)
    return out


def test_a_retrain_result_file_does_not_make_another_model_removed(run, tmp_path):
    # finding 1: audit --result carries the result's exact lineage to whatever model is audited;
    # the sealed result names its model (apply.model_sha256) but the audit never compares it
    retrain = _result_file(run, "retrain", tmp_path / "results" / "retrain.json")
    with UnlearnSession(run, evaluate=False) as session:
        original = session.run_view.final_params.clone()
    with pytest.raises(IntegrityError, match="result of another model"):
        audit_model(run, original, [0], result=retrain, receipt=ReceiptOptions(client_test=False))
    # the model the result wrote: its exact lineage is replayed bit for bit, so it is removed
    with UnlearnSession(run, evaluate=False) as session:
        model = session.run(make_method("retrain"), UnlearnRequest.of([0])).params
    doc = audit_model(run, model, [0], result=retrain, receipt=ReceiptOptions(client_test=False))
    assert doc["verification"]["influence"] == "removed"


def test_an_edited_and_resealed_lineage_is_not_removed(run, tmp_path):
    # finding 2: the seal is a checksum anyone can recompute; an exact lineage written into a
    # Crab result and re-sealed is accepted, and the Crab model (approximate) reads removed
    crab = _result_file(run, "crab", tmp_path / "results" / "crab.json")
    doc = json.loads(crab.read_text())
    assert doc["lineage"]["kind"] == "approximate"
    doc["lineage"]["kind"] = "exact"
    bound_to = doc.pop("integrity")["bound_to"]
    seal(doc, bound_to)
    forged = tmp_path / "results" / "forged.json"
    forged.write_text(json.dumps(doc))
    with UnlearnSession(run, evaluate=False) as session:
        request = UnlearnRequest.of([0], "forget")
        params = session.run(make_method("crab"), request).params
    try:
        got = audit_model(
            run, params, [0], result=forged, receipt=ReceiptOptions(client_test=False)
        )
    except IntegrityError:
        return  # refusing the forged claim is a right answer too
    assert got["verification"]["influence"] != "removed", got["verification"]["influence_reason"]


class _MixFinal(Unlearner):
    """Declares M_0 as its start and returns 0.999 M_T + 0.001 M_0 (M_T read unlogged)."""

    name = "review33_mix_final"

    def history_bytes_needed(self, context) -> int:
        """Nothing stored is needed."""
        return 0

    def _run(self, request, context) -> RunOutput:
        start = context.start_from(0)
        return RunOutput(0.999 * context.final_params + 0.001 * start, [], Details())


def test_a_method_that_uses_the_contexts_final_model_is_not_exact(run):
    # finding 3: UnlearnContext.final_params is M_T handed to every method outside the metered
    # history; only a bitwise copy of it counts as a read, so a blend of it is "exact"
    with (
        registered("review33_mix_final", _MixFinal),
        UnlearnSession(run, evaluate=False) as session,
    ):
        request = UnlearnRequest.of([0], "forget")
        result = session.run(make_method("review33_mix_final"), request)
    assert result.lineage is not None
    assert result.lineage.kind != "exact", result.lineage.reason


def test_raw_sql_deletion_of_a_clients_rows_is_damaged_not_deleted(run, tmp_path):
    # finding 4: delete client 0's update payloads, their fingerprint rows and its `clients`
    # rows with raw SQL (no deletion record, no secure_delete, aggregates and models kept: each
    # update is rebuildable from them); the store check reads the clients rows only and says
    # the store "never held" the client's updates, though the run's config (10 clients,
    # participation 1) says client 0 took part in every round
    work = tmp_path / "run"
    shutil.copytree(run, work)
    con = sqlite3.connect(work / "history" / "history.sqlite")
    con.execute("DELETE FROM payloads WHERE kind='update' AND client_id=0")
    con.execute("DELETE FROM payload_prints WHERE kind='update' AND client_id=0")
    con.execute("DELETE FROM clients WHERE client_id=0")
    con.commit()
    con.close()
    with UnlearnSession(work, evaluate=False) as session:
        request = UnlearnRequest.of([0], "forget")
        receipts = open_receipts(session, request, ReceiptOptions(client_test=False))
        _, receipt = receipts.audit(session.run_view.final_params, "original")
    assert receipt.store == "damaged", receipt.check("deletion").codes
