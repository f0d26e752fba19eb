"""The Flower App (examples/flower-app) and FlowerJob's run config: fast, no Flower run."""

from pathlib import Path

import pytest

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

import tomllib  # noqa: E402

from fedunlearn import load_config  # noqa: E402
from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.integrations.flower.bundle import FILES, write_app  # noqa: E402
from fedunlearn.integrations.flower.server_app import FlowerJob  # noqa: E402
from fedunlearn.integrations.flower.simulation import toml_table  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-app"


def test_example_app_is_what_write_app_writes(tmp_path):
    written = write_app(tmp_path / "app")
    for name in FILES:
        assert (EXAMPLE / name).read_text() == (written / name).read_text(), name
    shipped = {
        p.relative_to(EXAMPLE).as_posix()
        for p in EXAMPLE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert shipped == set(FILES) | {"README.md"}


def test_example_pyproject_names_fedunlearns_apps_and_every_job_key():
    app = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {
        "serverapp": "fedunlearn_app:server_app",
        "clientapp": "fedunlearn_app:client_app",
    }
    job = FlowerJob(mode="train", run_dir=Path("/r"), config_path=Path("/c.yaml"))
    assert set(app["config"]) == set(job.to_run_config())  # Flower ignores unknown keys
    # the default run config it names is shipped in the app and valid
    config = load_config(EXAMPLE / app["config"]["config-path"])
    assert config.data.dataset == "digits"


def test_relative_config_path_is_read_from_the_app_and_run_dir_defaults(tmp_path):
    job = FlowerJob.from_run_config(
        {"mode": "train", "config-path": "configs/digits.yaml", "run-dir": ""},
        base_dir=tmp_path,
        run_id=42,
    )
    assert job.config_path == tmp_path / "configs" / "digits.yaml"
    assert job.run_dir == Path.home() / "fedunlearn-runs" / "flower-42"


def test_unlearn_job_round_trips_through_the_run_config(tmp_path):
    job = FlowerJob(
        mode="unlearn",
        run_dir=tmp_path / "run",
        method="federaser",
        method_params={"calibration_ratio": 0.5},
        forget=(3, 7),
        kind="recover",
        result_path=tmp_path / "out.json",
        round_timeout=30.0,
    )
    assert FlowerJob.from_run_config(job.to_run_config()) == job
    # and through TOML, as simulate() hands it to flwr run
    assert FlowerJob.from_run_config(tomllib.loads(toml_table(job.to_run_config()))) == job
    relative = FlowerJob.from_run_config({**job.to_run_config(), "result-path": "forget.json"})
    assert relative.result_path == tmp_path / "run" / "forget.json"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"mode": "unlearn", "forget": "3"}, "mode .unlearn. needs run-dir"),
        ({"mode": "unlearn", "run-dir": "/r", "forget": "three"}, "comma-separated client ids"),
        ({"mode": "unlearn", "run-dir": "/r", "forget": "3", "method-params": "{x"}, "JSON"),
        ({"mode": "train", "run-dir": "rel/dir", "config-path": "/c.yaml"}, "absolute path"),
        ({"mode": "train", "run-dir": "/r", "config-path": "c.yaml"}, "absolute path"),
        ({"mode": "fit", "run-dir": "/r"}, "job mode must be one of"),
    ],
)
def test_bad_run_config_values_are_named(keys, message):
    with pytest.raises(ConfigError, match=message):
        FlowerJob.from_run_config(keys)
