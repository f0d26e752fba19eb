"""Issue 22's done-when, with real processes: a federation that lives through two requests."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedunlearn.runs import deletion_evidence

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"
# Rounds trained, then continued after the first request: each costs every later step (FedRecover,
# the continuation, Crab, the receipts) its share; a few of each keep every step real.
TRAINED, CONTINUED = 4, 4


def fedunlearn(*args, check=True):
    return subprocess.run(
        [sys.executable, "-m", "fedunlearn.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        check=check,
    )


@pytest.mark.slow
def test_forget_apply_continue_recover_apply_and_the_second_receipt_covers_all_three(
    tmp_path,
):
    config = yaml.safe_load(QUICKSTART.read_text())
    config["training"]["rounds"] = TRAINED
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(config))
    run = tmp_path / "q"
    fedunlearn("train", tmp_path / "q.yaml", "--out", run, "--json")

    # request 1: honest client 0, FedRecover; apply its trajectory; forget; CONTINUED more rounds
    fedunlearn("unlearn", run, "--forget", "0", "--method", "fedrecover", "--out",
               tmp_path / "fr0.json", "--no-client-test")  # fmt: skip
    first = json.loads((tmp_path / "fr0.json").read_text())
    assert first["apply"]["trajectory_rounds"] == TRAINED
    out = fedunlearn("apply", run, "--result", tmp_path / "fr0.json", "--json").stdout
    assert json.loads(out)["generation"] == 1
    fedunlearn("forget", run, "--clients", "0")
    fedunlearn("train", "--continue", run, "--rounds", CONTINUED, "--json")
    info = json.loads(fedunlearn("info", run, "--json").stdout)
    assert info["rounds_completed"] == TRAINED + CONTINUED
    assert info["complete"]
    attackers = info["malicious_clients"]
    assert len(attackers) == 2
    assert 0 not in attackers

    # request 2: recover from the attackers with Crab; client 0 is forgotten again
    fedunlearn("unlearn", run, "--forget", "malicious", "--method", "crab", "--out",
               tmp_path / "crab.json", "--no-client-test")  # fmt: skip
    second = json.loads((tmp_path / "crab.json").read_text())
    assert second["request"]["forget"] == sorted([0, *attackers])
    assert second["request"]["new"] == attackers
    assert second["request"]["earlier"] == [0]
    receipt = second["verification"]
    entries = {e["client"]: e for e in receipt["clients"]}
    assert sorted(entries) == sorted([0, *attackers])
    assert entries[0]["request"] == "earlier"
    assert entries[0]["store"]["status"] == "deleted"
    assert entries[0]["store"]["reconstructible"] == []
    assert entries[0]["influence"] in ("not_shown", "removed")  # never a pass it cannot show
    assert entries[0]["removed_by"]["method"] == "fedrecover"
    for attacker in attackers:
        assert entries[attacker]["request"] == "new"
        assert entries[attacker]["role"] == "attacker"
        assert entries[attacker]["influence"] == "not_detected"  # removed: by construction only
        assert {"check": "backdoor", "verdict": "pass"} in entries[attacker]["checks"]
    assert not [c for c in receipt["checks"] if c["verdict"] == "fail"]

    out = fedunlearn("apply", run, "--result", tmp_path / "crab.json", "--json").stdout
    assert json.loads(out)["generation"] == 2
    info = json.loads(fedunlearn("info", run, "--json").stdout)
    assert info["forgotten_clients"] == sorted([0, *attackers])
    assert [e["method"] for e in info["events"]] == ["fedrecover", "crab"]
    evidence = deletion_evidence(run, [0, *attackers])
    assert evidence["ok"]
    assert evidence["reconstructible"] == []
    again = fedunlearn("unlearn", run, "--forget", "0", "--method", "retrain", "--out",
                       tmp_path / "x.json", check=False)  # fmt: skip
    assert again.returncode == 2
    assert "nothing new to forget" in again.stderr
