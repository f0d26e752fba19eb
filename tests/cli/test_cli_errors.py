"""Bad input to the CLI: one line on stderr, exit code 2, no traceback, nothing written (issue 16).

Several tests name a run directory that does not exist: an output or params-file problem must be
reported first, which shows it is checked before any work.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.errors import ConfigError, OutputError

runner = CliRunner()

CONFIG = {
    "seed": 4,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [32]},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


def write_config(path: Path, cfg: dict = CONFIG) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def one_line_error(res, *fragments: str) -> str:
    """Assert exit code 2 and exactly one 'error:' line on stderr holding every fragment."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in res.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain.txt"
    path.write_text("not a directory")
    return path


def test_train_out_below_a_file_is_one_line_and_writes_nothing(tmp_path, a_file):
    cfg = write_config(tmp_path / "c.yaml")
    res = runner.invoke(app, ["train", str(cfg), "--out", str(a_file / "run")])
    one_line_error(res, "--out", str(a_file), "is a file")
    res = runner.invoke(app, ["train", str(cfg), "--out", str(a_file)])
    one_line_error(res, "--out", "is a file, not a directory")
    assert a_file.read_text() == "not a directory"


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux /sys")
def test_train_out_in_sys_is_one_line(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    res = runner.invoke(app, ["train", str(cfg), "--out", "/sys/fedunlearn-test-run"])
    one_line_error(res, "--out /sys/fedunlearn-test-run", "cannot write in /sys")


def test_unlearn_out_checks_come_before_any_work(tmp_path, a_file):
    missing_run = tmp_path / "no-such-run"
    base = ["unlearn", str(missing_run), "--forget", "1", "--method", "retrain"]
    existing_dir = tmp_path / "results"
    existing_dir.mkdir()

    res = runner.invoke(app, [*base, "--out", str(existing_dir)])
    one_line_error(res, "--out", "is a directory; give a file path")
    res = runner.invoke(app, [*base, "--out", str(a_file / "r.json")])
    one_line_error(res, "--out", "is a file, so nothing can be created below it")
    out = tmp_path / "new" / "dir" / "r.json"  # missing directories are fine: created later
    res = runner.invoke(app, [*base, "--out", str(out), "--save-model", str(a_file / "m.pt")])
    one_line_error(res, "--save-model", str(a_file))
    assert not (tmp_path / "new").exists()  # the check created nothing

    res = runner.invoke(app, [*base, "--out", str(out)])  # outputs fine: now the run is wrong
    one_line_error(res, "not a run directory", str(missing_run))


def test_compare_out_and_params_file_are_checked_before_any_work(tmp_path, a_file):
    base = ["compare", str(tmp_path / "no-such-run"), "--forget", "1"]
    res = runner.invoke(app, [*base, "--out", str(a_file / "results")])
    one_line_error(res, "--out", "is a file")

    params = tmp_path / "params.yaml"
    params.write_text("federaser: {calibration_ratio: 0.5}\nfederasr: {calibration_ratio: 0.1}\n")
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "r"), "--params-file", str(params)])
    one_line_error(res, "UnknownMethodError", "unknown method(s) federasr", "available:")
    params.write_text("federaser: 0.5\n")
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "r"), "--params-file", str(params)])
    one_line_error(res, "must map method names to parameter mappings")
    params.write_text("a: {x: 1}\na: {x: 2}\n")
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "r"), "--params-file", str(params)])
    one_line_error(res, "--params-file", "key 'a' appears twice")


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P", ("is not UTF-8 text",)),
        (b"", ("is empty", "configs", "digits_quickstart.yaml")),
        (b"training:\n  lr: .inf\n", ("training.lr (inf)", "numbers must be finite")),
        (b"seed: 1\nseed: 2\n", ("key 'seed' appears twice", "lines 1 and 2")),
        (b"training: {lr: [unclosed\n", ("is not valid YAML at line 2",)),
    ],
    ids=["binary", "empty", "inf", "duplicate", "yaml"],
)
def test_bad_config_files_are_one_line_and_leave_no_run_dir(tmp_path, content, fragments):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    res = runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "run")])
    one_line_error(res, "ConfigError", str(cfg), *fragments)
    assert not (tmp_path / "run").exists()


def test_directory_as_config_is_one_line(tmp_path):
    res = runner.invoke(app, ["train", str(tmp_path), "--out", str(tmp_path / "run")])
    one_line_error(res, "is a directory; give a YAML file")


def test_debug_flag_shows_the_traceback(tmp_path):
    res = runner.invoke(app, ["--debug", "train", str(tmp_path), "--out", str(tmp_path / "r")])
    assert isinstance(res.exception, ConfigError)
    res = runner.invoke(app, ["--debug", "unlearn", "x", "--forget", "1", "--method", "retrain",
                              "--out", str(tmp_path)])  # fmt: skip
    assert isinstance(res.exception, OutputError)


def test_missing_data_error_names_a_data_dir_flag_train_has(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDUNLEARN_DOWNLOAD", "0")
    cfg = write_config(tmp_path / "c.yaml", {**CONFIG, "data": {"dataset": "mnist"}})
    empty = tmp_path / "no-data"
    empty.mkdir()
    out = tmp_path / "run"

    res = runner.invoke(app, ["train", str(cfg), "--out", str(out), "--data-dir", str(empty)])

    line = one_line_error(res, "DataUnavailableError", str(empty), "--data-dir")
    assert "round" not in line  # no progress bar before the error
    assert not (out / "config.yaml").exists()
    assert not (out / "history" / "history.sqlite").exists()
    res = runner.invoke(app, ["train", str(cfg), "--out", str(out), "--data-dir", str(empty)])
    one_line_error(res, "DataUnavailableError")  # not "already holds a run": nothing was left


def test_demo_into_another_run_suggests_out_or_removal(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    out = tmp_path / "run"
    assert runner.invoke(app, ["train", str(cfg), "--out", str(out), "--json"]).exit_code == 0

    res = runner.invoke(app, ["demo", "--out", str(out), "--rounds", "2"])

    line = one_line_error(res, f"--out {out} holds another run", "choose another --out", "remove")
    assert "--resume" not in line


def test_piped_tables_are_markdown_and_not_wrapped():
    res = runner.invoke(app, ["methods"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0].startswith("| method | history policies | parameters (default) |")
    assert max(len(line) for line in rows) > 80  # long rows stay on one line
    assert all(line.count("|") == 4 for line in rows)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        "from fedunlearn.cli.main import main\n"
        f"sys.argv = ['fedunlearn', *{list(args)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('TORCH LOADED' if 'torch' in sys.modules else 'NO TORCH')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ
    )


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("train", "--help")])
def test_help_and_version_do_not_import_torch(args):
    done = _run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("NO TORCH"), done.stdout[-300:]
    if args == ("--version",):
        assert done.stdout.startswith("fedunlearn ")


def test_warnings_print_as_one_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import warnings\nfrom fedunlearn.cli.common import install_warning_format\n"
            "install_warning_format()\nwarnings.warn('a\\nb', stacklevel=1)\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == "warning: a b\n"


def test_read_only_file_system_is_named_with_what_to_do(tmp_path, monkeypatch):
    """A read-only mount cannot be made in a test; the probe's EROFS is what one produces."""
    import errno
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    cfg = write_config(tmp_path / "c.yaml")
    res = runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "run")])
    one_line_error(res, "--out", "the file system is read-only; choose another location")


def test_occupied_out_is_one_line_without_a_progress_bar(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    out = tmp_path / "run"
    assert runner.invoke(app, ["train", str(cfg), "--out", str(out), "--json"]).exit_code == 0

    res = runner.invoke(app, ["train", str(cfg), "--out", str(out)])

    one_line_error(res, "already holds a run", "--resume", "another --out")


def test_debug_ends_with_its_command_line(tmp_path):
    from fedunlearn.cli.common import debug_enabled

    res = runner.invoke(app, ["--debug", "train", str(tmp_path), "--out", str(tmp_path / "r")])
    assert isinstance(res.exception, ConfigError)
    assert not debug_enabled()  # a command function called directly afterwards gets one line

    res = runner.invoke(app, ["train", str(tmp_path), "--out", str(tmp_path / "r")])
    one_line_error(res, "is a directory; give a YAML file")


def test_the_cli_imports_no_click():
    """typer >= 0.26 carries its own click and does not install it (issue 20): the context and
    exceptions of ``import click`` are not the ones typer uses, and click may be absent."""
    import ast

    import fedunlearn.cli

    imports = {}
    for path in Path(fedunlearn.cli.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imports[path.name] = imports.get(path.name, []) + [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                imports[path.name] = imports.get(path.name, []) + [node.module]
    assert "main.py" in imports
    assert "typer" in imports["main.py"]
    uses_click = {name: mods for name, mods in imports.items()
                  if any(m == "click" or m.startswith("click.") for m in mods)}  # fmt: skip
    assert uses_click == {}
