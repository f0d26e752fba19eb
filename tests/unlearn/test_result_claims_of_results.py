"""An in-memory result reads its claims as its file does (``UnlearnResult.claims``, issue 38)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedunlearn.history.result_claims import ResultClaims
from fedunlearn.unlearn.base import Details, NoDetails, UnlearnResult
from fedunlearn.unlearn.costs import Costs
from fedunlearn.unlearn.lineage import Lineage


@dataclass(frozen=True)
class _Claiming(Details):
    variant: str
    warnings: tuple[str, ...]
    estimate: torch.Tensor  # not a claim: never read, never converted


def _result(details: Details, lineage: Lineage | None = None) -> UnlearnResult:
    return UnlearnResult("mine", torch.zeros(3), Costs(), details=details, lineage=lineage)


def test_claims_read_the_details_fields_a_method_defines():
    lineage = Lineage("exact", "initial model M_0", 0, None, reason="M_0 only")
    details = _Claiming("mine-without-DP", ("kept round 3",), torch.ones(2))

    claims = _result(details, lineage).claims()

    assert claims.method == "mine"
    assert claims.variant == "mine-without-DP"
    assert claims.warnings == ("kept round 3",)
    assert claims.assumptions == ()
    assert claims.released_model_dp is None
    assert claims.lineage is not None
    assert claims.lineage["kind"] == "exact"
    assert claims.receipt is False


def test_claims_of_an_in_memory_result_equal_those_of_its_document():
    details = _Claiming("v", ("w1", "w2"), torch.ones(2))
    doc = {"method": "mine", "details": details.to_dict(), "lineage": None}

    assert _result(details).claims() == ResultClaims.from_doc(doc)


def test_a_method_without_claim_fields_claims_nothing():
    claims = _result(NoDetails()).claims()

    assert claims.variant is None
    assert claims.warnings == ()
    assert claims.lineage is None
