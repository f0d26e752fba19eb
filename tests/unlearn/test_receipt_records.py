"""The receipt's records as JSON: every field, in order, non-finite numbers as None."""

import json
import math

from fedunlearn.unlearn.receipt import BoundReport, Check


def test_bound_report_dict_has_every_field_and_no_nan():
    report = BoundReport("starfish", 0.5, observed=math.nan, note="convexity assumed")
    assert report.to_dict() == {
        "name": "starfish",
        "bound": 0.5,
        "observed": None,
        "reference": "retrain",
        "note": "convexity assumed",
    }


def test_check_dict_has_every_field_in_order_json_ready():
    check = Check(
        "membership",
        "Membership",
        "warn",
        value=math.inf,
        reference={"original": 0.9},
        threshold={"warn": 0.5},
        reason="r",
        evidence={"scores": (1.0, math.nan), 3: "x"},
        power={"original_flagged": True},
        codes=("survives", "no_power"),
    )
    out = check.to_dict()
    assert list(out) == [
        "name",
        "title",
        "verdict",
        "value",
        "reference",
        "threshold",
        "reason",
        "scope",
        "evidence",
        "aspect",
        "power",
        "decisive",
        "codes",
    ]
    assert out["value"] is None
    assert out["evidence"] == {"scores": [1.0, None], "3": "x"}
    assert out["codes"] == ["survives", "no_power"]
    assert (out["scope"], out["aspect"], out["decisive"]) == ("model", "influence", True)
    out["reference"]["original"] = 0.0  # a copy: the record is unchanged
    assert check.reference == {"original": 0.9}
    json.dumps(out, allow_nan=False)
