"""Config by component (issue 38, item 4): one model per variant, plugin-owned budget options."""

import re
from pathlib import Path

import pytest

from fedunlearn.config import (
    BackdoorAttack,
    BudgetConfig,
    MultiKrumAggregator,
    NoAttack,
    TrimRandomAttack,
    dump_config,
    load_config,
    parse_config,
)
from fedunlearn.errors import ConfigError
from fedunlearn.privacy.budget import BUDGET_SCHEDULES, BudgetScheduleSpec, epsilon_bounds
from fedunlearn.runs import resolve_config

ROOT = Path(__file__).resolve().parents[1]

# what dump_config wrote for these sections before the split: every variant's options
LEGACY_ATTACK = {
    "kind": "backdoor",
    "num_malicious": 1,
    "target_label": 2,
    "trigger_size": 4,
    "poison_fraction": 1.0,
    "rho": 0.1,
    "sigma": 0.1,
    "p_noise": 0.8,
    "fang_b": 2.0,
    "start_round": 1,
    "join_round": 1,
}
LEGACY_AGGREGATOR = {"name": "multi_krum", "trim": 1, "krum_f": 1, "multi_krum_m": 3}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"attack": {"kind": "backdoor", "num_malicious": 1, "rho": 0.2}},
            "attack.rho is an option of attack.kind 'trim_random', not of 'backdoor' (got 0.2)",
        ),
        (
            {"attack": {"kind": "label_flip", "num_malicious": 1, "target_label": 3}},
            "attack.target_label is an option of attack.kind 'backdoor', not of 'label_flip'",
        ),
        (
            {"training": {"aggregator": {"name": "median", "trim": 3}}},
            "training.aggregator.trim is an option of training.aggregator.name 'trimmed_mean', "
            "not of 'median' (got 3)",
        ),
        (
            {"training": {"aggregator": {"name": "trimmed_mean", "krum_f": 2}}},
            "training.aggregator.krum_f is an option of training.aggregator.name 'krum' or "
            "'multi_krum', not of 'trimmed_mean'",
        ),
    ],
)
def test_an_option_of_another_variant_names_the_variant_and_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "c.yaml")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"attack": {"kind": "bd"}}, "attack.kind: Input should be 'none', 'backdoor', "),
        ({"attack": {"kind": "trim_random", "num_malicious": 1, "rhoo": 1}}, "attack.rhoo: Extra"),
        (
            {"attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 0}},
            "attack.trigger_size: Input should be greater than or equal to 1 (got 0)",
        ),
        ({"attack": {"num_malicious": 2}}, "attack.num_malicious > 0 needs an attack.kind"),
        (
            {"training": {"aggregator": {"name": "krum", "krum_f": -1}}},
            "training.aggregator.krum_f: Input should be greater than or equal to 0 (got -1)",
        ),
        ({"training": {"aggregator": {"name": None}}}, "training.aggregator.name: Input should"),
    ],
)
def test_variant_errors_are_located_at_the_key_the_user_wrote(data, message):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "c.yaml")
    text = str(err.value)
    assert message in text
    assert "\n" not in text
    # pydantic puts the variant's tag in the location; the message leaves it out
    assert not re.search(r"attack\.(backdoor|trim_random|none)\.|aggregator\.krum\.", text)


def test_each_variant_carries_only_its_own_options():
    config = parse_config(
        {
            "attack": {"kind": "trim_random", "num_malicious": 1, "rho": 0.3},
            "training": {"aggregator": {"name": "multi_krum", "multi_krum_m": 2}},
        }
    )
    assert isinstance(config.attack, TrimRandomAttack)
    assert set(type(config.attack).model_fields) == {
        "kind",
        "num_malicious",
        "start_round",
        "join_round",
        "rho",
        "sigma",
        "p_noise",
    }
    assert config.attack.rho == 0.3
    assert isinstance(config.training.aggregator, MultiKrumAggregator)
    assert config.training.aggregator.options("name") == {"krum_f": 1, "multi_krum_m": 2}
    default = parse_config({})
    assert isinstance(default.attack, NoAttack)  # no kind: 'none'
    assert default.training.aggregator.name == "fedavg"
    assert default.training.aggregator.options("name") == {}


def test_a_config_dumped_before_the_split_loads_as_today(tmp_path):
    old = {"attack": LEGACY_ATTACK, "training": {"aggregator": LEGACY_AGGREGATOR}}
    config = parse_config(old)
    assert isinstance(config.attack, BackdoorAttack)
    assert config.attack.target_label == 2
    assert config.training.aggregator.options("name") == {"krum_f": 1, "multi_krum_m": 3}
    new = {
        "attack": {"kind": "backdoor", "num_malicious": 1, "target_label": 2},
        "training": {"aggregator": {"name": "multi_krum", "multi_krum_m": 3}},
    }
    assert config == parse_config(new)
    # the dump keeps the stored layout (config.yaml, the store's copy, the run fingerprint)
    assert config.attack.model_dump() == LEGACY_ATTACK
    assert list(config.attack.model_dump()) == list(LEGACY_ATTACK)
    assert config.training.aggregator.model_dump() == LEGACY_AGGREGATOR
    trim = parse_config({"attack": {"kind": "trim_random", "num_malicious": 1, "rho": 0.2}})
    assert list(trim.attack.model_dump()) == list(LEGACY_ATTACK)
    assert trim.attack.model_dump()["rho"] == 0.2
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_the_core_budget_names_a_schedule_and_its_options_are_the_plugins():
    assert set(BudgetConfig.model_fields) == {"schedule"}
    spec = BUDGET_SCHEDULES.get("fedadp")
    assert spec.options_type.__module__ == "fedunlearn.unlearn.fedadp.budget"
    raw = parse_config({"privacy": {"enabled": True, "budget": {"epsilon_max": 2.5}}})
    assert type(raw.privacy.budget) is BudgetConfig  # as given until assembly
    resolved = resolve_config(raw)
    assert isinstance(resolved.privacy.budget, spec.options_type)
    assert epsilon_bounds(resolved.privacy.budget) == (1.0, 2.5)
    assert resolve_config(resolved) == resolved
    # without DP the budget is not read: no plugin is needed, the section stays as given
    no_dp = resolve_config(parse_config({"privacy": {"budget": {"epsilon_max": 2.5}}}))
    assert type(no_dp.privacy.budget) is BudgetConfig
    assert no_dp.privacy.budget.model_dump() == {"schedule": "fedadp", "epsilon_max": 2.5}
    # so the stored config of a run without DP dumps as it did (same run fingerprint)
    stored = {"schedule": "fedadp", "epsilon_initial": 1.0, "epsilon_min": 1.0}
    old = resolve_config(parse_config({"privacy": {"budget": stored}}))
    assert old.privacy.budget.model_dump() == stored
    with pytest.raises(ConfigError, match=r"privacy\.budget\.epsilon_maxx: Extra inputs"):
        resolve_config(parse_config({"privacy": {"enabled": True, "budget": {"epsilon_maxx": 2}}}))
    with pytest.raises(ConfigError, match=r"privacy\.budget\.epsilon_max: .* less than or equal"):
        resolve_config(parse_config({"privacy": {"enabled": True, "epsilon_max": 2000}}))


class _Constant(BudgetConfig):
    """A third-party schedule's options: one ε for every round."""

    model_config = {"extra": "forbid", "frozen": True}
    epsilon: float = 1.0

    def epsilon_bounds(self) -> tuple[float, float]:
        return self.epsilon, self.epsilon


class _ConstantSchedule:
    def __init__(self, options: _Constant) -> None:
        self.value = options.epsilon

    def epsilon(self, round_: int) -> float:
        return self.value

    def observe(self, round_: int, loss: float) -> None:
        pass

    def reset(self, losses, start: int = 0) -> None:
        pass


def test_a_schedule_declares_its_own_options_model():
    spec = BudgetScheduleSpec("constant", _ConstantSchedule, _Constant)
    with BUDGET_SCHEDULES.registered("constant", spec):
        config = resolve_config(
            parse_config(
                {"privacy": {"enabled": True, "budget": {"schedule": "constant", "epsilon": 2.0}}}
            )
        )
        assert isinstance(config.privacy.budget, _Constant)
        assert epsilon_bounds(config.privacy.budget) == (2.0, 2.0)
        assert "epsilon: 2.0" in dump_config(config)
        with pytest.raises(ConfigError, match=r"privacy\.budget\.epsilon_max: Extra inputs"):
            resolve_config(
                parse_config(
                    {
                        "privacy": {
                            "enabled": True,
                            "budget": {"schedule": "constant", "epsilon_max": 2},
                        }
                    }
                )
            )


def test_every_name_imported_from_fedunlearn_config_exists_and_modules_stay_small():
    import fedunlearn.config as config

    pattern = re.compile(r"from fedunlearn\.config import ((?:[A-Za-z_]\w*(?:, )?)+)")
    names = set()
    for folder in ("src", "tests", "examples", "benchmarks", "reproductions"):
        for path in (ROOT / folder).rglob("*.py"):
            for match in pattern.finditer(path.read_text(encoding="utf-8")):
                names |= {n.strip() for n in match.group(1).split(",")}
    names.discard("")
    assert {"RunConfig", "parse_config", "BudgetConfig", "HistoryConfig"} <= names
    assert sorted(n for n in names if not hasattr(config, n)) == []
    package = ROOT / "src" / "fedunlearn" / "config"
    sizes = {p.name: len(p.read_text().splitlines()) for p in package.glob("*.py")}
    assert max(sizes.values()) < 500


def test_an_override_that_switches_the_attack_drops_the_files_options_of_the_old_one():
    """Before: ``--set attack.kind=label_flip`` on the quickstart (a backdoor file) was refused."""
    quickstart = Path(__file__).resolve().parents[1] / "configs" / "digits_quickstart.yaml"

    config = load_config(quickstart, {"attack.kind": "label_flip"})

    assert config.attack.kind == "label_flip"
    assert config.attack.num_malicious == 2  # the options both variants have stay
    with pytest.raises(ConfigError, match=r"attack\.trigger_size is an option of attack\.kind"):
        load_config(quickstart, {"attack.kind": "label_flip", "attack.trigger_size": 5})
