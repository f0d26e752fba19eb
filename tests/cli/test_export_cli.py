"""`fedunlearn export`, `unlearn --save-model` (safetensors) and `train --tensorboard/--device`."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedunlearn import parse_config, train_run
from fedunlearn.cli.main import app
from fedunlearn.history import HistoryStore
from fedunlearn.history.digest import seal
from fedunlearn.models import get_flat_params, load_model, read_metadata

runner = CliRunner()

CONFIG = {
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 3, "max_train_samples": 450},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 2, "lr": 0.2, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "run"
    train_run(parse_config(CONFIG), out)
    return out


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def text(result):
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_export_writes_a_loadable_module_of_the_last_or_a_chosen_round(run_dir, tmp_path):
    # Execute
    last = invoke("export", run_dir, "--out", tmp_path / "last.safetensors", "--json")
    first = invoke("export", run_dir, "--round", 0, "--out", tmp_path / "m0.safetensors")

    # Assert: the module's parameters are the stored global models, bit for bit
    assert last.exit_code == 0, last.output
    assert first.exit_code == 0, first.output
    assert json.loads(last.stdout)["round"] == 2
    with HistoryStore.open(run_dir / "history") as store:
        for name, round_ in (("last", 2), ("m0", 0)):
            module = load_model(tmp_path / f"{name}.safetensors")
            assert torch.equal(get_flat_params(module), store.read_model(round_))
        accuracy = store.round_scalars(2)["test_accuracy"]
    meta = read_metadata(tmp_path / "last.safetensors")
    assert json.loads(meta["fedunlearn.source"])["round"] == 2
    assert json.loads(meta["fedunlearn.metrics"])["test_accuracy"] == accuracy
    assert json.loads(meta["fedunlearn.spec"])["options"] == {"hidden": [16]}


def test_export_refuses_bad_requests_and_writes_nothing(run_dir, tmp_path):
    for args, message in (
        (["--round", 9, "--out", tmp_path / "a.safetensors"], "round 9 is not stored"),
        (["--out", tmp_path / "a.pt"], "name it \\*.safetensors"),
        (
            ["--round", 1, "--result", tmp_path / "r.json", "--out", tmp_path / "a.safetensors"],
            "not both",
        ),
        (["--result", tmp_path / "r.json", "--out", tmp_path / "a.safetensors"], "does not exist"),
    ):
        res = invoke("export", run_dir, *args)
        assert res.exit_code == 2, res.output
        assert message.replace("\\", "") in text(res)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_unlearn_save_model_and_export_result_give_the_same_file(run_dir, tmp_path):
    # Execute: unlearn with --save-model, then export the same result from its JSON
    result_json = tmp_path / "r.json"
    res = invoke(
        "unlearn",
        run_dir,
        "--forget",
        "1",
        "--method",
        "federaser",
        "--out",
        result_json,
        "--save-model",
        tmp_path / "saved.safetensors",
    )
    assert res.exit_code == 0, res.output
    res = invoke("export", run_dir, "--result", result_json, "--out", tmp_path / "exp.safetensors")
    assert res.exit_code == 0, res.output

    # Assert
    summary = json.loads(result_json.read_text())
    assert summary["model_file"] == str(tmp_path / "saved.safetensors")
    saved = load_model(tmp_path / "saved.safetensors")
    exported = load_model(tmp_path / "exp.safetensors")
    assert torch.equal(get_flat_params(saved), get_flat_params(exported))
    source = json.loads(read_metadata(tmp_path / "exp.safetensors")["fedunlearn.source"])
    assert source["method"] == "federaser"
    assert source["forget"] == [1]


def test_export_result_refuses_a_result_it_cannot_reproduce(run_dir, tmp_path):
    result_json = tmp_path / "r.json"
    assert (
        invoke(
            "unlearn", run_dir, "--forget", "0", "--method", "random", "--out", result_json
        ).exit_code
        == 0
    )
    doc = json.loads(result_json.read_text())
    doc["test_accuracy"] = 0.123
    result_json.write_text(json.dumps(doc))

    edited = invoke("export", run_dir, "--result", result_json, "--out", tmp_path / "x.safetensors")
    seal(doc, doc["run"])  # as if computed elsewhere (another machine): sealed, not reproducible
    result_json.write_text(json.dumps(doc))
    res = invoke("export", run_dir, "--result", result_json, "--out", tmp_path / "x.safetensors")

    assert edited.exit_code == 2
    assert "IntegrityError" in text(edited)
    assert res.exit_code == 2
    assert "records 0.123" in text(res)
    assert not (tmp_path / "x.safetensors").exists()


def test_unlearn_save_model_needs_a_safetensors_name_before_any_work(run_dir, tmp_path):
    res = invoke(
        "unlearn",
        run_dir,
        "--forget",
        "1",
        "--method",
        "retrain",
        "--out",
        tmp_path / "r.json",
        "--save-model",
        tmp_path / "model.pt",
    )
    assert res.exit_code == 2
    assert "--save-model writes a safetensors model file" in text(res)
    assert list(tmp_path.iterdir()) == []


def test_train_device_override_and_tensorboard_log(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    res = invoke(
        "train",
        cfg,
        "--out",
        tmp_path / "run",
        "--device",
        "cpu",
        "--tensorboard",
        tmp_path / "tb",
        "--json",
    )
    assert res.exit_code == 0, res.output
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert stored["training"]["device"] == "cpu"
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    accuracy = [(e.step, e.value) for e in events.Scalars("test_accuracy")]
    final = json.loads(res.stdout)["final_metrics"]["test_accuracy"]
    assert [step for step, _ in accuracy] == [1, 2]
    assert accuracy[-1][1] == pytest.approx(final, abs=1e-6)

    bad = invoke("train", cfg, "--out", tmp_path / "run2", "--device", "gpu")
    assert bad.exit_code == 2
    assert "training.device" in bad.output


def test_a_gpu_trained_runs_model_is_rebuilt_on_the_cpu(run_dir, monkeypatch):
    # Prepare: the run's config as if it had been trained with training.device cuda
    from fedunlearn.cli import export
    from fedunlearn.runs import load_run_config

    config = load_run_config(run_dir)
    on_gpu = config.model_copy(
        update={"training": config.training.model_copy(update={"device": "cuda"})}
    )
    monkeypatch.setattr(export, "load_run_config", lambda _: on_gpu)

    # Execute: no CUDA here, so building the run's federation on its device would fail
    model = export.run_model(run_dir)

    # Assert
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert get_flat_params(model).numel() == 64 * 16 + 16 + 16 * 10 + 10


def test_audit_reads_what_export_writes(run_dir, tmp_path):
    # the exported final model is the original: the receipt must fail it on distance
    model = tmp_path / "final.safetensors"
    assert invoke("export", run_dir, "--out", model).exit_code == 0
    audit = invoke("audit", run_dir, "--model", model, "--forget", "1", "--json")
    assert audit.exit_code == 1, audit.output
    doc = json.loads(audit.stdout)
    assert doc["verification"]["verdict"] == "fail"
    checks = {c["name"]: c for c in doc["verification"]["checks"]}
    assert checks["distance"]["verdict"] == "fail"
    assert checks["distance"]["value"] == 0.0
