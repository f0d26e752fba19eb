"""A living run under its recording policy and DP (runs/continuation.py, runs/apply.py).

Issue 22 item 1 asks `train --continue` to keep "the same policies, the same resume/repair
guarantees"; before this, a run recorded with Crab's or FedADP's selective policy, or trained
with DP, could not be continued at all (refused in one line), and `apply` on a DP run replaced
its DP history with noise-free updates while `info` dropped the privacy ledger.
"""

import json
import shutil

import pytest
import torch
from tests.support.results import saved_result as _result

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.history.result_file import read_result_file
from fedunlearn.history.store import HistoryStore
from fedunlearn.privacy.calibrate import gradient_clip_norm
from fedunlearn.runs import (
    apply_result,
    continue_run,
    forget_clients,
    run_info,
    run_privacy,
    train_run,
)
from fedunlearn.runs.rundir import load_run_config
from fedunlearn.runs.setup import build_setup, clients_loss, reference_set
from fedunlearn.unlearn.crab.policy import ReferenceScorer, WindowSelector

BASE = {
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
}
pytestmark = pytest.mark.slow  # each test trains a run (3-8 s on 2 cores)

DP = {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 2.0, "delta": 1e-5}
CRAB = {"policy": "crab", "crab": {"reference_size": 200, "alpha": 0.05}}


def config(rounds=3, history=None, privacy=None):
    doc = {**BASE, "training": {**BASE["training"], "rounds": rounds}}
    doc["history"] = history or {"policy": "all"}
    if privacy:
        doc["privacy"] = privacy
    return parse_config(doc)


class StopAfter:
    """Round observer that stops a continuation after a round (a crash, without a process)."""

    def __init__(self, round_):
        self.round = round_

    def on_round_end(self, record):
        if record.round == self.round:
            raise KeyboardInterrupt


def stored(run):
    """{round: (model, stored update ids, scalars)} of a run."""
    with HistoryStore.open(run / "history") as store:
        return {
            r: (store.read_model(r), sorted(c for c, _ in store.iter_updates(r)))
            for r in store.rounds()
        }


def test_a_dp_run_continued_equals_the_same_run_trained_longer(tmp_path):
    short, long = tmp_path / "short", tmp_path / "long"
    train_run(config(3, privacy=DP), short)
    train_run(config(5, privacy=DP), long)

    done = continue_run(short, 2)

    assert done["target"] == 5
    a, b = stored(short), stored(long)
    assert a.keys() == b.keys()
    for r in a:
        assert torch.equal(a[r][0], b[r][0])
        assert a[r][1] == b[r][1]
    cfg = load_run_config(short)
    with HistoryStore.open(short / "history") as s1, HistoryStore.open(long / "history") as s2:
        rows1, rows2 = run_privacy(cfg, s1)["rounds"], run_privacy(cfg, s2)["rounds"]
    assert len(rows1) == 5
    assert rows1 == rows2
    assert json.loads((short / "privacy.json").read_text())["num_rounds"] == 5


def test_a_crab_policy_continuation_selects_windows_of_its_own_rounds(tmp_path):
    crab, every = tmp_path / "crab", tmp_path / "all"
    train_run(config(3, history=CRAB), crab)
    trained = stored(crab)
    train_run(config(3), every)  # the same rounds, every update kept

    continue_run(crab, 4)
    continue_run(every, 4)

    # what the live selector keeps when its first window opens at M_3, over rounds 4..7
    cfg = load_run_config(crab)
    opts = cfg.history.options("crab")
    setup = build_setup(cfg)
    try:
        ref = reference_set(setup, opts.reference_size)
        scorer = ReferenceScorer(setup.model, ref.x, ref.y, opts.divergence)
        selector = WindowSelector(
            scorer, opts.alpha, opts.round_ratio, opts.client_ratio, opts.rounding
        )
        expected: dict[int, list[int]] = {}
        with HistoryStore.open(every / "history") as store:
            selector.start(store.read_model(3))
            for t in range(4, 8):
                updates = dict(store.iter_updates(t))
                kept = selector.observe(
                    t,
                    store.read_model(t),
                    store.read_model(t, "aggregate"),
                    lambda u=updates: u,
                    final=t == 7,
                )
                expected.update({r: sorted(ids) for r, ids in (kept or {}).items()})
    finally:
        setup.close()
    got = stored(crab)
    assert {r: got[r][1] for r in range(4, 8) if got[r][1]} == {
        r: ids for r, ids in expected.items() if ids
    }
    assert expected  # the continuation kept a selection
    for r in range(4):  # training's own selection is left as it was
        assert torch.equal(got[r][0], trained[r][0])
        assert got[r][1] == trained[r][1]


@pytest.mark.parametrize(
    "history,privacy",
    [(CRAB, None), ({"policy": "fedadp"}, DP)],
    ids=["crab", "fedadp-dp"],
)
def test_an_interrupted_continuation_resumes_to_the_uninterrupted_one(tmp_path, history, privacy):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train_run(config(3, history=history, privacy=privacy), whole)
    shutil.copytree(whole, cut)
    continue_run(whole, 5)

    with pytest.raises(KeyboardInterrupt):
        continue_run(cut, 5, observers=[StopAfter(6)])
    with HistoryStore.open(cut / "history") as store:
        assert store.last_round() == 6
    continue_run(cut, None)  # finishes the recorded continuation to round 8

    a, b = stored(whole), stored(cut)
    assert a.keys() == b.keys() == set(range(9))
    for r in a:
        assert torch.equal(a[r][0], b[r][0]), r
        assert a[r][1] == b[r][1], r
    assert any(a[r][1] for r in range(4, 9))  # the policy stored a selection of new rounds
    if privacy:
        cfg = load_run_config(whole)
        with HistoryStore.open(whole / "history") as s1, HistoryStore.open(cut / "history") as s2:
            assert run_privacy(cfg, s1)["rounds"] == run_privacy(cfg, s2)["rounds"]


def test_apply_on_a_dp_run_refuses_a_noise_free_model_unless_accepted_and_keeps_the_ledger(
    tmp_path,
):
    """The defect: apply put Retrain's noise-free updates into a DP store, and info's ledger
    vanished (no round kept its ε); the result was accepted without a word."""
    run = tmp_path / "run"
    train_run(config(3, privacy=DP), run)
    cfg = load_run_config(run)
    with HistoryStore.open(run / "history") as store:
        before = run_privacy(cfg, store)
    path = _result(run, tmp_path, "retrain", "retrain")

    with pytest.raises(ConfigError, match="is not DP .*--accept-non-dp"):
        apply_result(run, path)
    with HistoryStore.open(run / "history") as store:
        assert store.generation() == 0  # nothing was changed

    event = apply_result(run, path, accept_non_dp=True)
    continue_run(run, 2)

    assert event["kind"] == "trajectory"
    info = run_info(run)["privacy"]
    rows = info["rounds"]
    assert [r.get("replaced_by_generation") for r in rows] == [1, 1, 1, None, None]
    assert [r["epsilon"] for r in rows[:3]] == [r["epsilon"] for r in before["rounds"]]
    assert info["epsilon_guarantee"]["rounds"] == 5  # the replaced rounds still count
    artefacts = info["artefacts"]
    assert not artefacts["current_model"]["dp"]
    assert "generation 1" in (artefacts["current_model"]["guarantee"])
    assert not artefacts["stored_history"]["dp"]
    assert not artefacts["uploads"]["dp"]
    assert json.loads((run / "privacy.json").read_text())["applied"][0]["method"] == "retrain"


def test_a_dp_release_applies_on_a_dp_run_and_composes_with_its_ledger(tmp_path):
    run = tmp_path / "run"
    train_run(config(3, history={"policy": "fedadp"}, privacy=DP), run)
    path = _result(run, tmp_path, "fedadp", "fedadp_dp", unlearn_dp=True)

    event = apply_result(run, path)  # DP: no flag needed
    continue_run(run, 1)

    assert event["kind"] == "model"
    info = run_info(run)["privacy"]
    fresh = info["applied"][0]["fresh_epsilon"]
    guarantee = info["epsilon_guarantee"]
    assert info["artefacts"]["current_model"]["dp"]
    assert fresh > 0
    assert guarantee["with_unlearning_releases"]["epsilon"] == pytest.approx(
        guarantee["pld_epsilon"] + fresh
    )
    assert info["artefacts"]["uploads"]["dp"]
    assert info["artefacts"]["stored_history"]["dp"]


def test_a_continuation_after_forgetting_reads_no_forgotten_clients_data(tmp_path):
    """Review defect: the continued rounds' server loss (which sets ε_t, hence σ_t, and
    FedADP's stages) averaged over every client, forgotten ones included; issue 40: an 'auto'
    clip norm stayed the one computed over every client (the forgotten one's data chose it),
    now it is recomputed at M_0 over the remaining clients."""
    run = tmp_path / "run"
    train_run(config(3, privacy={**DP, "clip_norm": "auto"}), run)
    with HistoryStore.open(run / "history") as store:
        clip = store.round_scalars(1)["dp_clip_norm"]
    path = _result(run, tmp_path, "retrain", "retrain")
    apply_result(run, path, accept_non_dp=True)
    forget_clients(run, [0])  # drops the applied rounds' models: the continuation needs none

    continue_run(run, 2)

    cfg = load_run_config(run)
    setup = build_setup(cfg)
    try:
        remaining_data = {c: setup.federation.client_data[c] for c in (1, 2, 3, 4, 5)}
        recomputed, _ = gradient_clip_norm(
            setup.federation.model, setup.initial_params, remaining_data
        )
        with HistoryStore.open(run / "history") as store:
            meta = store.meta["budget_restart"]
            for r in (4, 5):
                scalars = store.round_scalars(r)
                model = store.read_model(r)
                remaining = clients_loss(setup, model, 512, [1, 2, 3, 4, 5])
                everyone = clients_loss(setup, model, 512)
                assert scalars["clients_loss"] == remaining != everyone
                assert scalars["dp_clip_norm"] == pytest.approx(recomputed, rel=1e-12)
                assert recomputed != clip  # the forgotten client's gradients moved the median
            first = store.round_scalars(4)["dp_epsilon"]
    finally:
        setup.close()
    assert meta["round"] == 3
    assert meta["forgotten"] == [0]
    assert first == cfg.privacy.budget.epsilon_initial  # the schedule restarted at ε_0


def test_a_round_a_trajectory_keeps_is_counted_once_and_privacy_json_follows_a_rerun(tmp_path):
    """Review defects: Crab's kept prefix (round 1 carried with its ε) was counted twice in the
    ledger; a re-run of an apply after a crash left privacy.json without the new generation."""
    doc = config(4, privacy=DP).model_dump(mode="json")
    doc["attack"] = {"kind": "backdoor", "num_malicious": 1, "join_round": 3}
    run = tmp_path / "run"
    train_run(parse_config(doc), run)
    with HistoryStore.open(run / "history") as store:
        attacker = store.meta["malicious"]
    result, summary = unlearn_one(run, attacker, "crab", verify=False)
    assert result.trajectory is not None
    assert result.trajectory.rounds[0].scalars.get("dp_epsilon")
    path = tmp_path / "crab.json"
    save_for_apply(path, summary, result)
    path.write_text(json.dumps(summary))

    apply_result(run, path, accept_non_dp=True)
    (run / "privacy.json").write_text("{}")  # as if killed before privacy.json was written
    again = apply_result(run, path, accept_non_dp=True)

    assert again["already_applied"]
    ledger = json.loads((run / "privacy.json").read_text())
    assert ledger["applied"][0]["method"] == "crab"
    carried = [r["round"] for r in ledger["rounds"] if not r.get("replaced_by_generation")]
    replaced = [r["round"] for r in ledger["rounds"] if r.get("replaced_by_generation")]
    assert carried
    assert not set(carried) & set(replaced)
    assert sorted(carried + replaced) == [1, 2, 3, 4]


def test_store_only_runs_apply_a_model_freely_and_state_the_current_model_honestly(tmp_path):
    """Review defect: on dp_scope store_only, a DP release followed by continued rounds (which
    train on the clean uploads) was reported as a DP current model; the fresh releases' ε
    was the realised, data-dependent total instead of the a-priori one."""
    store_only = {
        "enabled": True,
        "mechanism": "client_update",
        "clip_norm": 1.0,
        "dp_scope": "store_only",
    }
    run = tmp_path / "run"
    train_run(config(4, history={"policy": "fedadp"}, privacy=store_only), run)
    plain = _result(run, tmp_path, "fedadp", "plain")  # not DP, no trajectory
    released = _result(run, tmp_path, "fedadp", "released", unlearn_dp=True)
    details = json.loads(released.read_text())["details"]["privacy"]["unlearning_privacy"]
    assert details["fresh_guarantee_epsilon"] >= details["fresh_total_epsilon"]

    apply_result(run, released)
    before = run_info(run)["privacy"]
    continue_run(run, 1)
    after = run_info(run)["privacy"]

    assert before["applied"][0]["fresh_epsilon"] == details["fresh_guarantee_epsilon"]
    assert before["artefacts"]["current_model"]["dp"]  # the release itself, untrained since
    assert not after["artefacts"]["current_model"]["dp"]  # trained on clean uploads since
    assert plain.exists()


def test_dp_retrain_is_a_dp_release_that_serves_request_after_request(tmp_path):
    """A DP run had one DP-preserving deletion (FedADP unlearn_dp, model only: after it only
    the noise-free Retrain served). Retrain dp=true retrains under the run's mechanism with
    noise of its own, applies without --accept-non-dp, and serves every later request; each
    release composes into the guarantee."""
    from fedunlearn.eval import reference_retrain
    from fedunlearn.unlearn import UnlearnRequest, UnlearnSession

    run = tmp_path / "run"
    train_run(config(3, privacy=DP), run)
    with UnlearnSession(run) as session:
        reference = reference_retrain(session, UnlearnRequest.of([0]), "retrain")
    first = _result(run, tmp_path, "retrain", "dp0", dp=True)
    doc = json.loads(first.read_text())
    assert doc["details"]["released_model_dp"] is True
    # its own noise: round 1 starts from M_0 with the same batches, so re-drawing the run's
    # noise made client 1's retrained upload equal its original one (review defect: the two
    # releases' difference was noise-free in every round); now they differ by noise
    retrained = read_result_file(tmp_path / doc["apply"]["file"]).trajectory.rounds[0]
    with HistoryStore.open(run / "history") as store:
        original = store.read_update(1, 1)
    difference = float((retrained.updates[1] - original).norm())
    assert difference > 0.5 * float(original.norm())
    assert not torch.equal(
        reference.params, read_result_file(tmp_path / doc["apply"]["file"]).params
    )

    apply_result(run, first)  # a DP release: no flag
    continue_run(run, 2)  # a session on this history used to fail: round 1 has no dp_clip_norm
    result, summary = unlearn_one(run, [1], "retrain", params={"dp": True}, verify=False)
    second = tmp_path / "dp1.json"
    save_for_apply(second, summary, result)
    second.write_text(json.dumps(summary))
    apply_result(run, second)

    info = run_info(run)["privacy"]
    fresh = [a["fresh_epsilon"] for a in info["applied"]]
    assert [a["method"] for a in info["applied"]] == ["retrain", "retrain"]
    assert all(fresh)
    releases = info["epsilon_guarantee"]["with_unlearning_releases"]
    assert releases["epsilon"] == pytest.approx(
        info["epsilon_guarantee"]["pld_epsilon"] + sum(fresh)
    )
    assert info["artefacts"]["current_model"]["dp"]
    train_run(config(2), tmp_path / "plain")
    with pytest.raises(UnsupportedHistoryError, match="not trained with DP on its uploads"):
        unlearn_one(tmp_path / "plain", [0], "retrain", params={"dp": True}, verify=False)


def test_continued_rounds_draw_new_noise_where_an_applied_trajectory_reuses_round_numbers(
    tmp_path,
):
    """Review defect: FedEraser's trajectory (every 2nd round) is 2 rounds long on a 4-round
    run, so the continuation trained rounds 3 and 4 again with the noise seeds of the original
    rounds 3 and 4, whose uploads the server had received: their difference was noise-free."""
    run = tmp_path / "run"
    train_run(config(4, history={"policy": "every", "every": 2}, privacy=DP), run)
    with HistoryStore.open(run / "history") as store:
        original = store.read_update(3, 1)
    path = _result(run, tmp_path, "federaser", "fe")
    event = apply_result(run, path, accept_non_dp=True)
    assert event["rounds_after"] == 2  # the continuation re-uses round numbers 3 and 4

    continue_run(run, 2)

    with HistoryStore.open(run / "history") as store:
        again = store.read_update(3, 1)
        info = run_privacy(load_run_config(run), store)
    assert float((again - original).norm()) > 0.5 * float(original.norm())
    assert info["epsilon_guarantee"]["ended_at_generation"] == 1  # a noise-free model applied
