"""A derived selection is kept for the next request on the same history (unlearn.derived_cache)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fedunlearn.runs.rundir import DERIVED_CACHE_DIR
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.derived_cache import DerivedCache


@pytest.fixture
def run_copy(run_all, tmp_path):
    """A private copy of the shared ``all`` run (the cache writes into the run directory)."""
    run_dir = shutil.copytree(run_all, tmp_path / "run")
    # another test's Crab may have kept one
    shutil.rmtree(run_dir / DERIVED_CACHE_DIR, ignore_errors=True)
    return run_dir


def _unlearn(run_dir, method, forget=(1,)):
    with UnlearnSession(run_dir, evaluate=False) as session:
        return session.run(make_method(method), UnlearnRequest.of(list(forget)))


def _comparable(details):
    out = details.to_dict()
    for key in ("timing", "selection_cached"):
        out.pop(key, None)
    return out


@pytest.mark.parametrize("method", ["crab", "fedadp"])
def test_a_second_request_reads_the_selection_and_gets_the_same_result(run_copy, method):
    first = _unlearn(run_copy, method)
    files = sorted((run_copy / DERIVED_CACHE_DIR).glob("*.json"))
    second = _unlearn(run_copy, method)
    assert first.details.selection_cached is False
    assert second.details.selection_cached is True
    assert len(files) == 1
    assert torch.equal(first.params, second.params)
    assert _comparable(first.details) == _comparable(second.details)
    # the lineage still counts what the derivation read; the bytes are not read again
    assert first.lineage.to_dict() == second.lineage.to_dict()
    assert second.costs.history_bytes_read < first.costs.history_bytes_read


@pytest.mark.parametrize("method", ["crab", "fedadp"])
def test_the_selection_says_it_was_cached_and_the_method_keeps_no_request_state(run_copy, method):
    unlearner = make_method(method)  # one method object serves both requests
    with UnlearnSession(run_copy, evaluate=False) as session:
        first = session.run(unlearner, UnlearnRequest.of([1]))
        second = session.run(unlearner, UnlearnRequest.of([1]))
        selected = unlearner.selection(session.context(UnlearnRequest.of([1])))
    assert (first.details.selection_cached, second.details.selection_cached) == (False, True)
    assert selected.cached is True
    assert tuple(s.round for s in selected.stored) == first.details.stored_rounds
    assert "selection_cached" not in vars(unlearner)


def test_an_edited_cache_is_ignored_and_derived_again(run_copy):
    first = _unlearn(run_copy, "crab")
    (path,) = (run_copy / DERIVED_CACHE_DIR).glob("*.json")
    doc = json.loads(path.read_text())
    doc["body"]["stored"] = doc["body"]["stored"][:1]  # keep fewer rounds, digest unchanged
    path.write_text(json.dumps(doc))
    again = _unlearn(run_copy, "crab")
    assert again.details.selection_cached is False
    assert torch.equal(first.params, again.params)
    assert json.loads(path.read_text())["body"] != doc["body"]  # rewritten from the derivation


def test_another_request_on_the_same_history_reads_it_too(run_copy):
    _unlearn(run_copy, "crab", forget=(1,))
    other = _unlearn(run_copy, "crab", forget=(2,))
    assert other.details.selection_cached is True


def test_the_cache_refuses_other_scopes_other_options_and_broken_files(tmp_path):
    cache = DerivedCache(tmp_path / "derived", "run-a:3:link")
    body = {"stored": [[1, [0, 2]]], "log": [], "reads": [["update", 1, 0]]}
    assert cache.put("crab", {"alpha": 0.1}, body) is True
    assert cache.get("crab", {"alpha": 0.1}) == body
    assert cache.get("crab", {"alpha": 0.2}) is None
    assert DerivedCache(tmp_path / "derived", "run-a:4:other").get("crab", {"alpha": 0.1}) is None
    (path,) = (tmp_path / "derived").glob("crab-*.json")
    path.write_text("{not json")
    assert cache.get("crab", {"alpha": 0.1}) is None


def test_an_unwritable_cache_loses_nothing(tmp_path):
    blocker = tmp_path / "derived"
    blocker.write_text("a file where the folder should be")
    cache = DerivedCache(blocker, "scope")
    assert cache.put("crab", {}, {"stored": []}) is False
    assert cache.get("crab", {}) is None
    assert blocker.read_text() == "a file where the folder should be"


def test_a_cache_whose_reads_were_dropped_keeps_the_lineage_approximate(run_copy):
    """An edited file with a fresh digest is not evidence: the lineage still counts the models."""
    from fedunlearn.unlearn.derived_cache import _digest

    first = _unlearn(run_copy, "crab")
    (path,) = (run_copy / DERIVED_CACHE_DIR).glob("*.json")
    doc = json.loads(path.read_text())
    doc["body"]["reads"] = []
    doc["sha256"] = _digest(doc["body"])
    path.write_text(json.dumps(doc))
    again = _unlearn(run_copy, "crab")
    assert again.details.selection_cached is True
    assert first.lineage.kind == "approximate"
    assert again.lineage.kind == "approximate"


def test_forget_deletes_the_run_directorys_caches(run_copy, tmp_path):
    """They were computed with the forgotten clients' data: reference models trained with them,
    selections scored on their updates. The next request rebuilds them."""
    from fedunlearn.runs import forget_clients

    _unlearn(run_copy, "crab")
    references = run_copy / "receipt_references"
    references.mkdir()
    (references / "manifest.json").write_text("{}")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    assert (run_copy / DERIVED_CACHE_DIR).is_dir()
    forget_clients(run_copy, [1])
    assert not (run_copy / DERIVED_CACHE_DIR).exists()
    assert not references.exists()
    (run_copy / DERIVED_CACHE_DIR).symlink_to(outside)  # a planted link: removed, its target kept
    forget_clients(run_copy, [2])
    assert not (run_copy / DERIVED_CACHE_DIR).exists()
    assert (outside / "keep.txt").read_text() == "not the run's"
