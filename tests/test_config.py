import pytest

from fedunlearn.config import dump_config, load_config, parse_config
from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.runs import resolve_config


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
    assert "test.yaml" in text
    assert field in text
    assert fragment in text


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

    root = Path(__file__).parents[1]
    configs = sorted(root.glob("configs/*.yaml"))
    assert configs
    others = sorted([*root.glob("examples/**/*.yaml"), *root.glob("reproductions/**/*.yaml")])
    assert others
    for path in configs + others:
        resolve_config(load_config(path))  # parsed, and its named pieces assembled


# ----- YAML that parses but cannot be meant (issue 16) ----------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("training:\n  lr: .inf\n", "training.lr (inf): numbers must be finite"),
        ("training:\n  lr: -.inf\n", "training.lr (-inf)"),
        ("privacy:\n  delta: .nan\n", "privacy.delta (nan)"),
        ("data:\n  options: {scale: [1.0, .inf]}\n", "data.options.scale.1 (inf)"),
    ],
)
def test_non_finite_numbers_are_refused_with_the_field(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="numbers must be finite") as err:
        load_config(path)
    assert fragment in str(err.value)
    assert str(path) in str(err.value)


def test_non_finite_numbers_are_refused_when_built_in_python():
    with pytest.raises(ConfigError, match=r"training\.lr \(inf\)"):
        parse_config({"training": {"lr": float("inf")}})
    from fedunlearn.config import TrainingConfig

    with pytest.raises(ValueError, match="finite"):
        TrainingConfig(lr=float("nan"))


def test_duplicate_keys_are_refused_naming_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\ntraining:\n  lr: 0.1\n  rounds: 3\n  lr: 0.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert str(path) in text
    assert "key 'lr' appears twice" in text
    assert "lines 3 and 5" in text


def test_empty_config_is_an_error_pointing_at_the_examples(tmp_path):
    for content in ("", "# only a comment\n", "---\n"):
        path = tmp_path / "empty.yaml"
        path.write_text(content)
        with pytest.raises(ConfigError, match="is empty") as err:
            load_config(path)
        assert "configs" in str(err.value)
        assert "digits_quickstart.yaml" in str(err.value)


def test_unreadable_config_files_are_config_errors(tmp_path):
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\x80")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(binary)
    with pytest.raises(ConfigError, match="is a directory; give a YAML file"):
        load_config(tmp_path)


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError) as err:
        parse_config({"training": {"batch_size": 0, "lr": -1}, "data": {"x": 1}}, "c.yaml")
    text = str(err.value)
    assert "\n" not in text
    assert "training.batch_size" in text
    assert "training.lr" in text
    assert "data.x" in text


def test_the_budget_lives_in_privacy_budget_and_the_flat_keys_still_work(tmp_path):
    # issue 12: FedADP's ε schedule left the general privacy section for privacy.budget
    flat = parse_config({"privacy": {"enabled": True, "epsilon_max": 2.5, "signed_delta": True}})
    nested = parse_config(
        {"privacy": {"enabled": True, "budget": {"epsilon_max": 2.5, "signed_delta": True}}}
    )
    assert flat == nested
    assert flat.privacy.budget.epsilon_max == 2.5
    assert flat.privacy.budget.schedule == "fedadp"
    assert flat.privacy.budget.signed_delta
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(flat))
    assert "budget:" in path.read_text()
    assert load_config(path) == flat  # dumps nested
    # a flat override applies to a nested file, a nested override to a flat one
    assert load_config(path, {"privacy.epsilon_max": 4.0}).privacy.budget.epsilon_max == 4.0
    path.write_text("privacy:\n  enabled: true\n  epsilon_max: 2.0\n")
    assert load_config(path, {"privacy.budget.epsilon_max": 5.0}).privacy.budget.epsilon_max == 5
    path.write_text("privacy:\n  epsilon_max: 2.0\n  budget: {epsilon_max: 3.0}\n")
    with pytest.raises(ConfigError, match="privacy.epsilon_max and privacy.budget.epsilon_max"):
        load_config(path)
    with pytest.raises(ConfigError, match="privacy.epsilon_min and privacy.budget.epsilon_min"):
        parse_config({"privacy": {"epsilon_min": 1.0, "budget": {"epsilon_min": 2.0}}})
    # the options are the schedule's (FedADP's model), validated where the run is assembled
    with pytest.raises(ConfigError, match="privacy.budget.epsilon_min \\(4.0\\) must not exceed"):
        resolve_config(parse_config({"privacy": {"enabled": True, "epsilon_min": 4.0}}))
    # the schedule is a plugin's training hook, looked up where the run is assembled
    typo = parse_config({"privacy": {"enabled": True, "budget": {"schedule": "constant"}}})
    with pytest.raises(
        UnknownNameError,
        match="privacy.budget.schedule: unknown budget schedule 'constant'; available: fedadp",
    ):
        resolve_config(typo)


# --- user components (issue 23) ---------------------------------------------------------------


def test_user_components_are_stored_as_strings_and_survive_the_dumped_yaml():
    import yaml

    config = parse_config(
        {
            "data": {"source": "pkg.data:load", "options": {"path": "x.npz"}},
            "model": {"factory": "pkg.nets:make", "options": {"width": 8}},
        }
    )
    assert config.model.factory == "pkg.nets:make"
    assert config.model.options == {"width": 8}
    assert parse_config(yaml.safe_load(dump_config(config))) == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": {"factory": "pkg.nets"}}, "model.factory: must name a function"),
        ({"model": {"factory": "pkg:make", "name": "cnn"}}, "model.name cannot apply"),
        ({"model": {"options": {"width": 3}}}, "give model.factory or drop model.options"),
        ({"data": {"source": "pkg:load", "partition": "dirichlet"}}, "data.partition cannot"),
        ({"data": {"source": "a b"}}, "data.source: must name a function"),
    ],
)
def test_user_components_are_refused_when_they_cannot_be_meant(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"model": {"factory": "pkg:make", "name": "cnn", "hidden": [4]}},
            "model.factory 'pkg:make' builds the model; model.hidden and model.name cannot "
            "apply to it. Drop them; the factory's options go in model.options",
        ),
        (
            {"data": {"source": "pkg:load", "alpha": 0.1, "partition": "dirichlet"}},
            "data.source 'pkg:load' returns the clients' data already split; data.alpha, "
            "data.partition cannot apply to it. Drop them; the source's own options go in "
            "data.options",
        ),
        (
            {"data": {"source": "pkg:load", "alpha": 0.1}},
            "data.alpha cannot apply to it. Drop it;",
        ),
    ],
)
def test_a_component_refuses_the_fields_it_replaces_in_one_sentence(data, message):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert message in str(err.value)


@pytest.mark.parametrize("section", ["data.source", "model.factory"])
def test_a_component_field_that_names_no_function_is_refused_at_its_place(section):
    part, field = section.split(".")
    with pytest.raises(ConfigError) as err:
        parse_config({part: {field: "not a function"}})
    assert f"{section}: must name a function as 'pkg.module:function'" in str(err.value)
    assert getattr(parse_config({part: {field: "pkg.mod:Cls.make"}}), part).model_dump()[field] == (
        "pkg.mod:Cls.make"
    )
