import pytest

from fedunlearn.config import dump_config, load_config, parse_config
from fedunlearn.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_yaml(tmp_path):
    cfg = parse_config({})
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        ({"data": {"num_clientz": 3}}, "data.num_clientz", "Extra inputs"),
        ({"training": {"batch_size": 0}}, "training.batch_size", "greater than or equal to 1"),
        ({"training": {"lr": "fast"}}, "training.lr", "valid number"),
        ({"data": {"dataset": "imagenet"}}, "data.dataset", "'digits'"),
        ({"training": {"participation": 1.5}}, "training.participation", "less than or equal"),
        (
            {"data": {"num_clients": 4}, "attack": {"kind": "backdoor", "num_malicious": 4}},
            "(top level)",
            "must be smaller than data.num_clients (4)",
        ),
        ({"attack": {"kind": "backdoor"}}, "attack", "num_malicious >= 1"),
        ({"model": {"name": "textcnn"}}, "(top level)", "needs data.dataset 'ag_news'"),
    ],
)
def test_invalid_configs_name_the_field(data, field, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "test.yaml")
    text = str(err.value)
    assert "test.yaml" in text and field in text and fragment in text


def test_config_is_frozen():
    cfg = parse_config({})
    with pytest.raises(Exception, match="frozen"):
        cfg.seed = 3  # type: ignore[misc]


def test_load_config_applies_dotted_overrides_and_reports_bad_files(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\ntraining: {rounds: 3}\n")
    cfg = load_config(path, {"seed": 9, "training.lr": 0.2})
    assert (cfg.seed, cfg.training.rounds, cfg.training.lr) == (9, 3, 0.2)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)
    path.write_text("seed: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_shipped_configs_are_valid():
    from pathlib import Path

    configs = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        load_config(path)
