"""Guarantees as typed values (issue 38): the decisions, and the JSON they render unchanged.

``guarantees_golden.json`` holds what ``artefact_guarantees``, ``unlearned_model_guarantee`` and
``result_privacy`` returned for the cases below before the decisions became ``Guarantee``
values (commit 366fa2d, where each function built its ``{"dp", "guarantee"}`` dicts itself);
the rendered dicts must stay equal, so ``privacy.json``, results and ``fedunlearn info`` keep
their bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from fedunlearn.config import PrivacyConfig
from fedunlearn.privacy.guarantee import Guarantee, GuaranteeKind, render
from fedunlearn.privacy.guarantees import (
    applied_privacy,
    artefact_claims,
    artefact_guarantees,
    result_privacy,
    unlearned_model_guarantee,
)

GOLDEN = json.loads((Path(__file__).parent / "guarantees_golden.json").read_text())

CONFIGS = {
    "off": {},
    "client_update": {"enabled": True},
    "dp_sgd": {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 1.0},
    "store_only": {"enabled": True, "dp_scope": "store_only"},
}


def _row(g, method, kind, dp, fresh=None, round_=None, reason="why"):
    return applied_privacy(
        generation=g,
        method=method,
        kind=kind,
        released_model_dp=dp,
        reason=reason,
        fresh_epsilon=fresh,
        round_=round_,
    )


APPLIED = {
    "none": ([], None),
    "plain_model": (
        [_row(1, "external", "model", False, round_=5, reason="a model made elsewhere")],
        5,
    ),
    "plain_trajectory": ([_row(1, "crab", "trajectory", False, round_=4)], 6),
    "dp_release": ([_row(1, "retrain", "trajectory", True, fresh=2.5, round_=4)], 4),
    "dp_release_trained": ([_row(1, "retrain", "trajectory", True, fresh=2.5, round_=4)], 7),
    "dp_release_no_fresh": ([_row(1, "fedadp", "trajectory", True, round_=4)], None),
    "dp_then_plain": (
        [
            _row(1, "retrain", "trajectory", True, fresh=1.0, round_=4),
            _row(2, "federaser", "trajectory", False, round_=4),
        ],
        4,
    ),
    "plain_then_dp": (
        [
            _row(1, "external", "model", False, round_=5),
            _row(2, "retrain", "trajectory", True, fresh=1.0, round_=5),
        ],
        5,
    ),
}


def _cases():
    for cname in CONFIGS:
        for aname in APPLIED:
            key = f"artefacts/{cname}/{aname}"
            if key in GOLDEN:
                yield key


@pytest.mark.parametrize("key", list(_cases()))
def test_artefact_guarantees_render_what_they_rendered_before(key):
    _, cname, aname = key.split("/")
    applied, last = APPLIED[aname]
    got = artefact_guarantees(PrivacyConfig.model_validate(CONFIGS[cname]), applied, last)
    assert got == GOLDEN[key]


@pytest.mark.parametrize("cname", list(CONFIGS))
def test_unlearned_model_and_result_statements_render_what_they_rendered_before(cname):
    cfg = PrivacyConfig.model_validate(CONFIGS[cname])
    for fresh in (False, True):
        assert list(unlearned_model_guarantee(cfg, fresh)) == GOLDEN[f"unlearned/{cname}/{fresh}"]
    ledger = {"enabled": cfg.enabled, "rounds": [], "artefacts": artefact_guarantees(cfg), "x": 1}
    got = result_privacy(ledger, released_dp=True, reason="a DP release")
    assert got == GOLDEN[f"result/{cname}"]


def test_the_decision_is_a_value_what_holds_and_since_when():
    cfg = PrivacyConfig.model_validate(CONFIGS["client_update"])
    applied, last = APPLIED["dp_then_plain"]  # a DP release, then a noise-free trajectory

    claims = artefact_claims(cfg, applied, last)

    assert claims["current_model"] == Guarantee(
        False, "ended", since=2, method="federaser", reason="why"
    )
    assert claims["stored_history"].kind == "replaced_history"
    assert claims["stored_history"].since == 2
    assert claims["uploads"].before == Guarantee(True, "mechanism", unit="client_round")
    assert claims["original_model"].dp is True


def test_a_dp_release_composes_the_runs_guarantee_with_its_releases():
    cfg = PrivacyConfig.model_validate(CONFIGS["dp_sgd"])
    applied, last = APPLIED["dp_release"]

    claims = artefact_claims(cfg, applied, last)

    assert claims["current_model"] == Guarantee(True, "dp_releases")
    assert claims["uploads"].with_releases is True
    assert claims["uploads"].unit == "example"
    assert claims["original_model"].with_releases is False


def test_every_kind_has_a_sentence_of_its_own():
    sentences = {
        render(
            Guarantee(
                False,
                kind,
                unit="example",
                since=3,
                method="m",
                reason="r",
                before=Guarantee(True, "mechanism", unit="example"),
            )
        )
        for kind in get_args(GuaranteeKind)
    }
    assert len(sentences) == len(get_args(GuaranteeKind))
    with pytest.raises(ValueError, match="no sentence"):
        render(Guarantee(False, "unknown"))  # type: ignore[arg-type]
