"""``fedunlearn audit`` and the receipt options of ``unlearn``: output, exit codes, errors."""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.cli.printing import human_bytes
from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.models.flat import set_flat_params
from fedunlearn.runs import build_setup, train_run

runner = CliRunner()


def text(output: str) -> str:
    """Return output with rich's line wrapping undone."""
    return " ".join(output.split())


RUN = {
    "seed": 5,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "run"
    config = parse_config(RUN)
    train_run(config, out)
    with HistoryStore.open(out / "history") as store:
        final = store.read_model(config.training.rounds)
    files = tmp_path_factory.mktemp("models")
    torch.save(final, files / "flat.pt")
    setup = build_setup(config)
    model = copy.deepcopy(setup.model)
    setup.close()
    set_flat_params(model, final)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, files / "m.safetensors")
    torch.save(torch.zeros(7), files / "wrong.pt")
    return out, files


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flat.pt", "m.safetensors"])
def test_audit_of_the_original_model_fails_with_exit_code_1(run, name, tmp_path):
    run_dir, files = run
    res = runner.invoke(
        app,
        [
            "audit",
            str(run_dir),
            "--model",
            str(files / name),
            "--forget",
            "malicious",
            "--out",
            str(tmp_path / "receipt.json"),
            "--explain",
        ],
    )
    assert res.exit_code == 1, res.output
    assert f"{name} (recover clients" in text(res.stdout)
    assert "FAIL" in res.stdout
    assert "influence REMAINS" in text(res.stdout)
    assert "no lineage" in text(res.stdout)
    assert "method warnings: none were available" in text(res.stdout)
    assert "the model is the original model, unchanged" in text(res.stdout)
    doc = json.loads((tmp_path / "receipt.json").read_text())
    assert doc["verification"]["verdict"] == "fail"
    assert doc["verification"]["influence"] == "remains"
    assert doc["subject"] == name
    assert doc["measures"]["test_accuracy"] == doc["original"]["test_accuracy"]


def test_audit_refuses_bad_input_with_one_clear_line(run, tmp_path):
    run_dir, files = run
    cases = [
        (["--model", str(files / "wrong.pt"), "--forget", "1"], "holds a tensor of shape (7,)"),
        (["--model", str(tmp_path / "none.pt"), "--forget", "1"], "does not exist"),
        (["--model", str(files / "flat.pt")], "name the clients the model should have forgotten"),
        (["--model", str(files / "flat.pt"), "--forget", "9"], "client(s) 9 not in this run"),
        # --forget is read as every other command reads it (cli.common.parse_forget)
        (["--model", str(files / "flat.pt"), "--forget", "-1"], "client ids are >= 0; got -1"),
        (["--model", str(files / "flat.pt"), "--forget", ","], "--forget is empty"),
        # a user review: '3,,4' was read as 3,4 (a typo could hide a missing id)
        (["--model", str(files / "flat.pt"), "--forget", "1,,2"], "an empty id between commas"),
        (
            ["--model", str(files / "flat.pt"), "--forget", "1", "--threshold", "utility_fail=2"],
            "invalid verification thresholds: utility_fail",
        ),
        (
            ["--model", str(files / "flat.pt"), "--forget", "1", "--reference", "best"],
            "reference must be one of original, retrain",
        ),
        (  # a band around Retrain needs Retrain: refused before any work
            ["--model", str(files / "flat.pt"), "--forget", "1", "--distance-retrains", "2"],
            "add --reference retrain",
        ),
        (
            [
                "--model",
                str(files / "flat.pt"),
                "--forget",
                "1",
                "--reference",
                "retrain",
                "--distance-retrains",
                "1",
            ],  # fmt: skip
            "at least 2 (a measured spread); got 1",
        ),
    ]
    for args, fragment in cases:
        res = runner.invoke(app, ["audit", str(run_dir), *args])
        assert res.exit_code == 2, (args, res.output)
        assert fragment in text(res.output), res.output


@pytest.mark.slow
def test_unlearn_prints_the_receipt_and_takes_a_thresholds_file(run, tmp_path):
    run_dir, _ = run
    limits = tmp_path / "limits.yaml"
    limits.write_text("utility_warn: 0.0\nutility_fail: 0.0\n")  # any drop at all fails
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "malicious",
            "--method",
            "random",
            "--param",
            "fraction=0.34",
            "--thresholds",
            str(limits),
            "--out",
            str(tmp_path / "r.json"),
            "--explain",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    receipt = out["verification"]
    assert receipt["thresholds"]["utility_fail"] == 0.0
    utility = next(c for c in receipt["checks"] if c["name"] == "utility")
    drop = utility["reference"]["original"] - utility["value"]
    assert utility["verdict"] == ("fail" if drop > 0 else "pass")
    assert "random verification:" in res.stdout
    assert "utility:" in text(res.stdout)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n")
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "1",
            "--method",
            "retrain",
            "--thresholds",
            str(bad),
            "--out",
            str(tmp_path / "x.json"),
        ],
    )
    assert res.exit_code == 2
    assert "must be a YAML mapping" in text(res.output)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_unlearn_with_a_retrain_reference_judges_against_it(run, tmp_path):
    run_dir, _ = run
    args = ["unlearn", str(run_dir), "--forget", "malicious", "--reference", "retrain", "--out"]
    res = runner.invoke(app, [*args, str(tmp_path / "none.json"), "--method", "none"])
    assert res.exit_code == 1, res.output  # the original model: the influence remains
    out = json.loads((tmp_path / "none.json").read_text())
    assert out["verification"]["references"] == ["original", "retrain"]
    assert out["retrain"]["client_epochs"] > 0
    cost = out["verification"]["cost"]
    assert cost["references"]["retrain"]["client_epochs"] == out["retrain"]["client_epochs"]
    assert cost["client_epochs"] >= out["retrain"]["client_epochs"]  # apart from the method's
    distance = next(c for c in out["verification"]["checks"] if c["name"] == "distance")
    assert (distance["verdict"], distance["value"]) == ("fail", 1.0)


@pytest.mark.slow
def test_an_exact_lineage_trains_no_reference_for_its_receipt(run, tmp_path):
    """Retrain's result is removed by construction: its receipt trains nothing beside it."""
    run_dir, _ = run
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "malicious",
            "--method",
            "retrain",
            "--reference",
            "retrain",
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    receipt = out["verification"]
    assert receipt["influence"] == "removed"
    assert receipt["lineage"]["kind"] == "exact"
    assert receipt["references"] == ["original"]  # no Retrain reference trained
    assert receipt["cost"]["client_epochs"] == 0
    assert receipt["cost"]["references"] == {}
    assert "exact" in receipt["cost"]["skipped"]
    checks = {c["name"]: c["verdict"] for c in receipt["checks"]}
    assert checks["client_membership"] == checks["membership"] == "n/a"  # nothing fitted
    assert "retrain" not in out


@pytest.mark.slow
def test_exit_codes_follow_the_influence_verdict(run, tmp_path):
    """unlearn exits 1 when the influence remains (it used to exit 0 on a failing receipt)."""
    run_dir, _ = run
    args = ["unlearn", str(run_dir), "--forget", "malicious", "--out"]
    res = runner.invoke(app, [*args, str(tmp_path / "none.json"), "--method", "none"])
    assert res.exit_code == 1, res.output
    out = json.loads((tmp_path / "none.json").read_text())
    assert out["verification"]["influence"] == "remains"
    assert "influence REMAINS" in text(res.stdout)
    res = runner.invoke(app, [*args, str(tmp_path / "retrain.json"), "--method", "retrain"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "retrain.json").read_text())["verification"]["influence"] != (
        "remains"
    )


@pytest.mark.slow
def test_compare_exits_1_only_when_a_real_method_leaves_the_influence(run, tmp_path):
    from fedunlearn.cli.receipt import comparison_exit_code

    run_dir, _ = run
    res = runner.invoke(
        app,
        [
            "compare",
            str(run_dir),
            "--forget",
            "malicious",
            "--methods",
            "retrain",
            "--out",
            str(tmp_path / "cmp"),
        ],
    )
    # the 'none' control's influence remains: it must not fail the comparison
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "cmp" / "results.json").read_text())
    rows = {m["method"]: m for m in doc["methods"]}
    assert rows["none"]["verification"]["influence"] == "remains"
    assert comparison_exit_code(doc) == 0
    bad = {**doc, "methods": [*doc["methods"], {**rows["none"], "method": "fedrecover"}]}
    assert comparison_exit_code(bad) == 1


@pytest.mark.slow
def test_audit_result_carries_the_methods_warnings_and_lineage(run, tmp_path):
    run_dir, _ = run
    result = tmp_path / "crab.json"
    model = tmp_path / "crab.safetensors"
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "malicious",
            "--method",
            "crab",
            "--param",
            "rollback=paper",
            "--param",
            "rule=literal",
            "--param",
            "final_rounds=0",
            "--out",
            str(result),
            "--save-model",
            str(model),
        ],
    )
    assert res.exit_code in (0, 1), res.output
    unlearned = json.loads(result.read_text())
    warnings = unlearned["details"].get("warnings") or []
    assert warnings, "paper-mode Crab warns that its rollback model contains the attacker"
    audit = ["audit", str(run_dir), "--model", str(model), "--forget", "malicious"]
    res = runner.invoke(app, [*audit, "--result", str(result), "--json"])
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    check = next(c for c in doc["verification"]["checks"] if c["name"] == "method_warnings")
    assert check["verdict"] == "warn"  # the audit used to drop it: "none"
    assert warnings[0].rstrip(".") in check["reason"]
    assert doc["result_method"] == "crab"
    assert doc["verification"]["lineage"] == unlearned["lineage"]
    res = runner.invoke(app, [*audit, "--json"])
    doc = json.loads(res.stdout)
    check = next(c for c in doc["verification"]["checks"] if c["name"] == "method_warnings")
    assert check["verdict"] == "n/a"
    assert "none were available" in check["reason"]
    assert doc["verification"]["lineage"] is None
    # a result of another request is refused with one line
    res = runner.invoke(
        app,
        ["audit", str(run_dir), "--model", str(model), "--forget", "0", "--result", str(result)],
    )
    assert res.exit_code == 2
    assert "is a result for recover clients" in text(res.output)


@pytest.mark.slow
def test_exit_codes_of_real_processes(run, tmp_path):
    """The documented exit codes as a shell sees them: 1 remains, 0 otherwise (2, bad input, and
    unlearn's 1 are tested in-process above: each process here costs a torch import)."""
    import subprocess
    import sys

    run_dir, files = run

    def code(*args):
        done = subprocess.run(
            [sys.executable, "-c", "from fedunlearn.cli.main import main; main()", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.returncode, done.stdout + done.stderr

    audit = ["audit", str(run_dir), "--model", str(files / "flat.pt"), "--forget", "malicious"]
    assert code(*audit)[0] == 1  # the original: its influence remains
    unlearn = ["unlearn", str(run_dir), "--forget", "malicious", "--out"]
    returncode, output = code(*unlearn, str(tmp_path / "r.json"), "--method", "retrain")
    assert returncode == 0, output


@pytest.mark.slow
def test_unlearn_measures_the_distance_band_from_independent_retrains(run, tmp_path):
    """--distance-retrains K: the distance check's pass line from K exact retrains (issue 21)."""
    run_dir, _ = run
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "malicious",
            "--method",
            "none",
            "--reference",
            "retrain",
            "--distance-retrains",
            "2",
            "--no-client-test",
            "--out",
            str(tmp_path / "r.json"),
        ],  # fmt: skip
    )
    assert res.exit_code == 1, res.output  # the original model: still the original
    out = json.loads((tmp_path / "r.json").read_text())
    distance = next(c for c in out["verification"]["checks"] if c["name"] == "distance")
    assert len(distance["evidence"]["band"]["relative"]) == 2
    assert distance["threshold"]["pass"] == distance["evidence"]["band"]["band"]
    assert out["verification"]["cost"]["references"]["distance band"]["client_epochs"] > 0


def test_unlearn_announces_its_apply_file_and_its_costs_and_can_skip_the_file(run, tmp_path):
    """Defect (issue 35): the apply file, as large as the store, was announced in bytes only
    and could not be skipped; the method's costs were one figure."""
    run_dir, _ = run
    args = ["unlearn", str(run_dir), "--forget", "malicious", "--method", "federaser"]
    args += ["--reference", "retrain", "--no-client-test"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "r.json")])
    assert res.exit_code in (0, 1), res.output
    out = json.loads((tmp_path / "r.json").read_text())
    apply_file = tmp_path / "r.apply.safetensors"
    shown = text(res.stdout)
    assert f"apply file: {apply_file} ({apply_file.stat().st_size / 1e6:,.1f} MB" in shown
    c = out["costs"]
    assert c["server_seconds"] == pytest.approx(c["wall_seconds"] - c["client_train_seconds"])
    assert c["evaluation_seconds"] > 0
    assert c["client_train_seconds"] > 0
    assert f"method: {c['wall_seconds']:.1f} s wall (server {c['server_seconds']:.1f} s" in shown
    assert f"{human_bytes(c['history_bytes_read'])} of history read" in shown
    cost = out["verification"]["cost"]
    assert f"receipt: {cost['wall_seconds']:.1f} s wall" in shown
    retrain = out["retrain"]
    epochs = retrain["client_epochs"] / c["client_epochs"]
    seconds = retrain["wall_seconds"] / c["wall_seconds"]
    assert f"epochs saved {epochs:.2f}x, time saved {seconds:.2f}x" in shown
    assert retrain["epoch_saving_vs_retrain"] == pytest.approx(epochs)
    assert retrain["time_saving_vs_retrain"] == pytest.approx(seconds)
    # --no-apply-file: the JSON only; apply refuses it in one line, naming the file it lacks
    res = runner.invoke(
        app, [*args[:6], "--no-apply-file", "--no-client-test", "--out", str(tmp_path / "s.json")]
    )
    assert res.exit_code in (0, 1), res.output
    assert not (tmp_path / "s.apply.safetensors").exists()
    assert "apply file: none written (--no-apply-file)" in text(res.stdout)
    assert json.loads((tmp_path / "s.json").read_text())["apply"]["file"] is None
    before = (run_dir / "history").stat().st_mtime_ns
    res = runner.invoke(app, ["apply", str(run_dir), "--result", str(tmp_path / "s.json")])
    assert res.exit_code == 2, res.output
    assert "written with --no-apply-file" in text(res.output)
    assert str(tmp_path / "s.apply.safetensors") in text(res.output)
    assert (run_dir / "history").stat().st_mtime_ns == before
