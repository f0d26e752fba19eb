"""The CLI by command (issue 38, item 5): one module per command, option groups defined once.

- The receipt options of ``unlearn``, ``compare`` and ``audit`` are one definition: their click
  parameters must be equal, name by name (flags, default, type, help).
- Every command, the plugins' included, answers ``--help`` with exit 0.
- The library functions take one ``ReceiptOptions`` instead of loose parameters.
- One deletion-evidence implementation: ``forget``, ``runs.deletion_evidence`` and the receipt's
  ``eval.deletion_evidence`` read the same ``HistoryStore.deletion_evidence``.
- Size limits: no module of ``cli/`` over 500 lines, no function there over 120.
"""

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from fedunlearn.cli.commands import COMMANDS
from fedunlearn.cli.main import app
from fedunlearn.cli.options import (
    DEFAULT_RECEIPT_FLAGS,
    RECEIPT_FLAGS,
    ReceiptFlags,
    receipt_options,
)
from fedunlearn.errors import ConfigError
from fedunlearn.eval.plan import ReceiptOptions

CLI_DIR = Path(__file__).resolve().parents[2] / "src" / "fedunlearn" / "cli"
RECEIPT_COMMANDS = ("unlearn", "compare", "audit")
runner = CliRunner()


def _type_name(param) -> str:
    """The parameter's type by name: click's ``param.type`` where it has one (typer < 0.26
    builds click parameters; later typers have their own without ``type``), else the Python
    annotation typer parsed it from."""
    kind = getattr(param, "type", None)
    if kind is not None:
        return str(getattr(kind, "name", kind))
    return repr(param.type_descriptor.annotation)  # typer >= 0.26: what the option parses to


def _describe(param) -> tuple:
    """What a user sees of one click parameter: flags, default, type, whether a flag, help."""
    return (
        param.name,
        tuple(param.opts),
        tuple(param.secondary_opts),
        param.default,
        _type_name(param),
        getattr(param, "is_flag", False),
        getattr(param, "help", None),
    )


def _receipt_params(command) -> dict[str, tuple]:
    """The receipt options of a click command (``--reference`` included where it has it)."""
    flags = set(RECEIPT_FLAGS) | {"--reference"}
    return {
        p.name: _describe(p)
        for p in command.params
        if set(p.opts) & flags or set(p.secondary_opts) & flags
    }


def _commands() -> dict:
    return get_command(app).commands  # type: ignore[attr-defined]


def test_the_receipt_options_of_unlearn_compare_and_audit_are_one_definition():
    commands = _commands()
    found = {name: _receipt_params(commands[name]) for name in RECEIPT_COMMANDS}

    group = {"thresholds", "threshold", "client_test", "distance_retrains", "explain"}
    for name, params in found.items():
        assert group <= set(params), name
        shown = {flag for p in params.values() for flag in (*p[1], *p[2])}
        assert set(RECEIPT_FLAGS) <= shown, name
    for key in group:
        assert found["unlearn"][key] == found["compare"][key], key
        assert found["unlearn"][key] == found["audit"][key], key
    assert found["unlearn"]["reference"] == found["audit"]["reference"]
    assert "reference" not in found["compare"]  # compare always judges against Retrain


def test_the_drift_check_sees_an_option_defined_apart():
    """A command that spells one receipt option its own way differs from the group's."""
    drifted = typer.Typer()

    @drifted.command()
    def one(
        explain: bool = typer.Option(False, "--explain", help="another help"),
    ) -> None:
        """A command with its own --explain."""

    grouped = typer.Typer()

    @grouped.command()
    @receipt_options()
    def two(receipt: ReceiptFlags = DEFAULT_RECEIPT_FLAGS) -> None:
        """A command with the group."""

    mine = _receipt_params(get_command(drifted))["explain"]
    group = _receipt_params(get_command(grouped))["explain"]

    assert mine != group
    assert group == _receipt_params(_commands()["unlearn"])["explain"]


def test_the_group_reaches_the_command_as_one_value():
    got: list[ReceiptFlags] = []
    app_ = typer.Typer()

    @app_.command()
    @receipt_options()
    def issue(
        run: str,
        receipt: ReceiptFlags = DEFAULT_RECEIPT_FLAGS,
        extra: int = 0,
    ) -> None:
        """Collect the flags."""
        got.append(receipt)

    result = runner.invoke(
        app_,
        ["r", "--threshold", "backdoor_fail=0.2", "--no-client-test", "--extra", "3"]
        + ["--reference", "retrain", "--distance-retrains", "2", "--explain"],
    )

    assert result.exit_code == 0, result.output
    (flags,) = got
    assert flags == ReceiptFlags(None, ("backdoor_fail=0.2",), False, 2, True, reference="retrain")
    options = flags.options(seed=5)
    assert options.reference == "retrain"
    assert options.client_test is False
    assert options.distance_retrains == 2
    assert options.seed == 5
    assert options.thresholds is not None
    assert options.thresholds.backdoor_fail == 0.2
    assert flags.options(reference="retrain").reference == "retrain"
    # not given on the line: the library's default
    assert options.client_test_references == ReceiptOptions().client_test_references
    assert options.client_test_references == "held_out"

    got.clear()
    result = runner.invoke(app_, ["r", "--client-test-references", "per_request"])
    assert result.exit_code == 0, result.output
    assert got[0].options().client_test_references == "per_request"


def test_the_group_refuses_an_unknown_client_test_null():
    with pytest.raises(ConfigError, match="client_test_references must be one of per_request"):
        ReceiptFlags(client_test_references="everyone").options()


def test_the_group_refuses_a_null_for_a_client_test_turned_off():
    # review of 6c37694: --client-test-references held_out --no-client-test ran no client test
    # and said nothing of the null asked for
    with pytest.raises(ConfigError, match="--no-client-test"):
        ReceiptFlags(client_test=False, client_test_references="held_out").options()
    with pytest.raises(ConfigError, match="--no-client-test"):
        ReceiptFlags(client_test=False, client_test_references="per_request").options()
    # not given: --no-client-test alone is accepted whatever the default null is
    assert ReceiptFlags(client_test=False).options().client_test is False


def test_the_group_refuses_a_band_without_retrain_and_bad_thresholds():
    with pytest.raises(ConfigError, match="--reference retrain"):
        ReceiptFlags(distance_retrains=2).options()
    with pytest.raises(ConfigError, match="--threshold takes key=value"):
        ReceiptFlags(threshold=("oops",)).options()


def test_receipt_options_needs_the_receipt_parameter():
    def lacks(run: str) -> None:
        """No receipt parameter."""

    with pytest.raises(TypeError, match="receipt"):
        receipt_options()(lacks)


@pytest.mark.slow
def test_every_command_answers_help_with_exit_0():
    commands = _commands()

    assert {"train", "apply", "info", "verify", "forget", "methods", "unlearn"} <= set(commands)
    assert {"compare", "export", "demo", "audit", "plan", "check-receipt", "central"} <= set(
        commands
    )
    for name in commands:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage:" in result.output, name


def test_commands_are_listed_in_the_order_they_always_were():
    names = list(_commands())

    assert names[:14] == [*COMMANDS, "plan", "check-receipt", "central"]
    assert COMMANDS[:3] == ("train", "apply", "info")
    assert COMMANDS[-4:] == ("compare", "export", "demo", "audit")


@pytest.mark.slow
def test_python_dash_m_fedunlearn_answers_like_the_console_script():
    for module in ("fedunlearn", "fedunlearn.cli.main"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("fedunlearn ")


@pytest.mark.parametrize(
    "function",
    ["fedunlearn.experiments:unlearn_one", "fedunlearn.experiments:compare_methods"]
    + ["fedunlearn.experiments.audit:audit_model"],
)
def test_the_library_takes_one_receipt_options_object(function):
    import importlib

    from fedunlearn.eval import ReceiptOptions

    module, name = function.split(":")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters

    assert "receipt" in params
    loose = {"reference", "thresholds", "client_test", "distance_retrains", "seed"}
    assert not loose & set(params)
    assert params["receipt"].default is None
    assert "ReceiptOptions" in str(params["receipt"].annotation)
    assert ReceiptOptions().reference == "original"


def _function_lengths(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_no_cli_module_over_500_lines_and_no_function_over_120():
    modules = sorted(CLI_DIR.rglob("*.py"))

    assert (CLI_DIR / "commands" / "unlearn.py") in modules
    for path in modules:
        assert len(path.read_text().splitlines()) <= 500, path
        for name, length in _function_lengths(path):
            assert length <= 120, (path, name, length)
    assert len((CLI_DIR / "main.py").read_text().splitlines()) <= 150


@pytest.mark.slow
def test_forget_and_the_receipt_read_one_deletion_evidence(tmp_path, monkeypatch):
    """``forget``'s check and rebuildable updates are the receipt's, from one reading."""
    from fedunlearn.config import parse_config
    from fedunlearn.eval import deletion_evidence as receipt_evidence
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.runs import deletion_evidence, train_run

    config = {
        "seed": 1,
        "data": {"dataset": "digits", "num_clients": 4},
        "model": {"name": "mlp", "hidden": [16]},
        "training": {"rounds": 3, "local_epochs": 1, "batch_size": 64, "executor": "serial"},
        "history": {"policy": "all"},
    }
    run = tmp_path / "r"
    train_run(parse_config(config), run)
    calls: list[list[int]] = []
    original = HistoryStore.deletion_evidence

    def spy(self, client_ids):
        ids = sorted(client_ids)
        calls.append(ids)
        return original(self, ids)

    monkeypatch.setattr(HistoryStore, "deletion_evidence", spy)

    result = runner.invoke(app, ["forget", str(run), "--clients", "1", "--json"])

    assert result.exit_code == 0, result.output
    assert calls == [[1]]  # the command read the one evidence
    doc = json.loads(result.stdout)
    library = deletion_evidence(run, [1])
    assert doc["check"] == library["check"]
    assert doc["reconstructible"] == library["reconstructible"]
    with HistoryStore.open(run / "history") as store:
        receipt = receipt_evidence(store, [1])
    assert receipt == library["evidence"]
    assert calls == [[1], [1], [1]]
    assert library["ok"] is True
