"""The fault-injection suite of issue 37: real processes, full disks, kill -9, damage, overlaps.

What each fault leaves, and what brings the run back, is documented in docs/faults.md; every
case here checks one row of it. Full disks: a real tmpfs in a private mount namespace where
the kernel allows one (``unshare -rm``, skipped elsewhere), ``RLIMIT_FSIZE`` (every platform),
or ``ENOSPC`` raised at one chosen write. Kills: SIGKILL at a chosen call inside or after a
transaction (``tests/support/faults.py``).
"""

import json
import shutil

import pytest
import torch
from tests.support import faults
from tests.support.faults import Fault, error_lines, small_config
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.experiments.lifecycle import apply_file_path
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import apply_result, continue_run, forget_clients, train_run

pytestmark = pytest.mark.slow  # every case starts fedunlearn processes (5-15 s each, 2 cores)

SMALL = small_config(3, hidden=512)  # 154 kB a model: the apply file is 2.3 MB
DP = {
    **SMALL,
    "model": {"name": "mlp", "hidden": [16]},
    "history": {"policy": "fedadp", "fedadp": {"loss_samples": 64}},
    "privacy": {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 2.0, "delta": 1e-5},
}
runner = CliRunner()


def cli(*args):
    """A command in this process (the re-runs: no fault, no process start)."""
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("faults") / "run"
    train_run(parse_config(SMALL), run)
    return run


@pytest.fixture(scope="module")
def result(trained, tmp_path_factory):
    """'unlearn --forget 1 --method retrain' on the trained run: R.json + its apply file."""
    out = tmp_path_factory.mktemp("result") / "r.json"
    res = cli("unlearn", trained, "--forget", "1", "--method", "retrain", "--out", out,
              "--no-client-test")  # fmt: skip
    assert res.exit_code == 0, res.output
    return out


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def copy_result(result, folder):
    folder.mkdir(exist_ok=True)
    for path in (result, apply_file_path(result)):
        shutil.copy(path, folder / path.name)
    return folder / result.name


def state(run):
    """What a run holds: models, update ids per round, events, forgotten clients, files."""
    with HistoryStore.open(run / "history") as store:
        held = {
            "rounds": store.rounds(),
            "models": sorted(store.stored_models()),
            "updates": {r: sorted(c for c, _ in store.iter_updates(r)) for r in store.rounds()},
            "events": [(e.generation, e.forget, e.method) for e in store.events()],
            "forgotten": sorted(store.forgotten_clients()),
        }
        tensors = {key: store.read_model(*key) for key in held["models"]}
    held["metrics"] = (run / "metrics.jsonl").read_text()
    summary = json.loads((run / "summary.json").read_text())
    held["summary"] = {k: summary.get(k) for k in ("rounds", "generation", "forgotten_clients")}
    return held, tensors


def assert_same(a, b):
    (held_a, tensors_a), (held_b, tensors_b) = state(a), state(b)
    assert held_a == held_b
    assert all(torch.equal(tensors_a[k], tensors_b[k]) for k in tensors_a)


def leftovers(folder):
    """Temporary files a writer left (a half-written file must not exist under any name)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ----- full disks ------------------------------------------------------------------------------

_ON_SMALL_DISK = r"""
import json, os, subprocess, sys
disk, run, big = sys.argv[1], sys.argv[2], sys.argv[3] == "full"
if big:  # fill the disk
    with open(os.path.join(disk, "filler"), "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
def fedunlearn(*args):
    p = subprocess.run([sys.executable, "-m", "fedunlearn.cli.main", *args],
                       capture_output=True, text=True)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
out = {
    "unlearn": fedunlearn("unlearn", run, "--forget", "1", "--method", "retrain", "--out",
                          os.path.join(disk, "r.json"), "--no-client-test"),
}
if big:
    out["export"] = fedunlearn("export", run, "--out", os.path.join(disk, "m.safetensors"))
out["files"] = sorted(os.listdir(disk))
print(json.dumps(out))
"""


def on_small_disk(tmp_path, run, size, full):
    if not faults.small_disk_available():
        pytest.skip("no tmpfs can be mounted here (unshare -rm refused)")
    proc = faults.small_disk(
        tmp_path / "disk", size, _ON_SMALL_DISK, tmp_path / "disk", run, "full" if full else ""
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_full_disk_is_refused_before_the_work_by_unlearn_and_export(trained, tmp_path):
    found = on_small_disk(tmp_path, trained, "1m", full=True)

    for command in ("unlearn", "export"):
        res = found[command]
        lines = [line for line in res["stderr"].splitlines() if line.startswith("error:")]
        assert res["rc"] == 2, res
        assert len(lines) == 1, res
        assert "free some space" in lines[0]
        assert "Traceback" not in res["stderr"]
    assert "retrain: done" not in found["unlearn"]["stderr"]  # refused before the work
    assert found["files"] == ["filler"]  # nothing written, no temporary file left


def test_a_disk_that_fills_up_during_the_write_leaves_no_part_of_a_file(trained, tmp_path):
    found = on_small_disk(tmp_path, trained, "1500k", full=False)  # the apply file: 2.3 MB

    res = found["unlearn"]
    lines = [line for line in res["stderr"].splitlines() if line.startswith("error:")]
    assert res["rc"] == 2, res  # never 1 (influence remains)
    assert len(lines) == 1, res
    assert "no space left" in lines[0]
    assert found["files"] == []  # neither the apply file, nor the JSON, nor a temporary file


def test_a_model_file_that_cannot_be_written_keeps_the_result_json(trained, tmp_path):
    out, model = tmp_path / "r.json", tmp_path / "m.safetensors"
    args = ["unlearn", trained, "--forget", "1", "--method", "retrain", "--out", out,
            "--save-model", model, "--no-client-test"]  # fmt: skip

    res = faults.run(args, faults=[Fault("fedunlearn.models.export:_save_from", "enospc")])

    assert res.returncode == 2
    assert len(error_lines(res)) == 1
    assert "export the model later" in error_lines(res)[0]
    assert out.exists()
    assert apply_file_path(out).exists()
    assert not model.exists()
    assert leftovers(tmp_path) == []
    applied = cli("apply", copy_run(trained, tmp_path / "run"), "--result", out)
    assert applied.exit_code == 0, applied.output  # the result written first is whole and sealed


def test_a_file_size_limit_at_export_leaves_no_part_of_a_file(trained, tmp_path):
    res = faults.run(["export", trained, "--out", tmp_path / "m.safetensors"], file_limit=100_000)

    assert res.returncode == 2
    assert len(error_lines(res)) == 1
    assert "m.safetensors" in error_lines(res)[0]
    assert list(tmp_path.iterdir()) == []


def test_deterministic_exports_compare_by_hash(trained, tmp_path):
    """Before: the same run exported twice gave different bytes (metadata in a hash map's
    order, which changes per process; the run's path inside)."""
    elsewhere = copy_run(trained, tmp_path / "elsewhere")
    first = faults.run(["export", trained, "--out", tmp_path / "a.safetensors"])
    second = faults.run(["export", elsewhere, "--out", tmp_path / "b.safetensors"])

    assert first.returncode == second.returncode == 0
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


# ----- kill -9 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        Fault("fedunlearn.history.store.events:Generations._insert_round", "kill", call=2),
        Fault("fedunlearn.runs.apply:rewrite_files", "kill"),
    ],
    ids=["inside-the-transaction", "after-the-commit"],
)
def test_kill_9_during_apply_then_the_same_command_equals_an_uninterrupted_apply(
    trained, result, tmp_path, fault
):
    whole, cut = copy_run(trained, tmp_path / "whole"), copy_run(trained, tmp_path / "cut")
    apply_result(whole, copy_result(result, tmp_path / "a"))
    mine = copy_result(result, tmp_path / "b")

    killed = faults.run(["apply", cut, "--result", mine], faults=[fault])
    again = cli("apply", cut, "--result", mine)

    assert killed.returncode == -9
    assert again.exit_code == 0, again.output
    assert_same(whole, cut)
    assert not apply_file_path(mine).exists()
    assert cli("verify", cut).exit_code == 0


@pytest.mark.parametrize(
    "fault",
    [
        Fault("fedunlearn.history.store.erasure:Erasure._incremental_vacuum", "kill"),
        Fault("fedunlearn.history.store.sqlite:HistoryStore._checkpoint_truncate", "kill", call=2),
    ],
    ids=["inside-the-transaction", "after-the-commit"],
)
def test_kill_9_during_forget_then_the_same_command_equals_an_uninterrupted_forget(
    trained, tmp_path, fault
):
    whole, cut = copy_run(trained, tmp_path / "whole"), copy_run(trained, tmp_path / "cut")
    forget_clients(whole, [2])

    killed = faults.run(["forget", cut, "--clients", "2"], faults=[fault])
    again = cli("forget", cut, "--clients", "2")

    assert killed.returncode == -9
    assert again.exit_code == 0, again.output
    assert_same(whole, cut)
    with HistoryStore.open(cut / "history") as store:
        assert store.check_deletions([2]).ok


@pytest.mark.filterwarnings("ignore:this run was trained with")  # the child's thread count
def test_a_damaged_wal_holding_several_rounds_is_named_not_dropped(tmp_path):
    config = small_config(6)
    (tmp_path / "c.yaml").write_text(json.dumps(config))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train_run(parse_config(config), whole)
    write_round = "fedunlearn.history.store.sqlite:HistoryStore.write_round"
    killed = faults.run(["train", tmp_path / "c.yaml", "--out", cut],
                        faults=[Fault(write_round, "kill", "after", call=5)])  # fmt: skip
    assert killed.returncode == -9  # rounds 0..4 committed, all in the WAL (no checkpoint)
    wal = cut / "history" / "history.sqlite-wal"
    data = bytearray(wal.read_bytes())
    frame = 24 + int.from_bytes(data[8:12], "big")
    middle = (len(data) - 32) // frame // 2
    data[32 + middle * frame + 100 : 32 + middle * frame + 116] = b"\xff" * 16
    wal.write_bytes(bytes(data))

    found = cli("verify", cut)

    line = next(x for x in found.output.splitlines() if x.startswith("error:"))
    assert found.exit_code == 1
    assert "write-ahead log is damaged" in line
    offset = int(line.split("truncate -s ")[1].split()[0])
    with wal.open("r+b") as fh:  # what the message says to do
        fh.truncate(offset)
    resumed = cli("train", tmp_path / "c.yaml", "--out", cut, "--resume")
    assert resumed.exit_code == 0, resumed.output
    with HistoryStore.open(whole / "history") as a, HistoryStore.open(cut / "history") as b:
        assert a.rounds() == b.rounds() == list(range(7))
        assert all(torch.equal(a.read_model(r), b.read_model(r)) for r in a.rounds())


# ----- concurrent commands ---------------------------------------------------------------------


def test_unlearn_reading_while_apply_replaces_the_rounds_writes_nothing(trained, result, tmp_path):
    run = copy_run(trained, tmp_path / "run")
    mine = copy_result(result, tmp_path / "a")
    out = tmp_path / "b.json"
    # MeteredHistory reads through read_sized_update (the bytes each payload takes as stored)
    reading = Fault("fedunlearn.history.store.sqlite:HistoryStore.read_sized_update", "pause",
                    call=2, name=str(tmp_path / "read"))  # fmt: skip
    child = faults.start(["unlearn", run, "--forget", "2", "--method", "federaser", "--out", out,
                          "--no-client-test"], faults=[reading])  # fmt: skip
    faults.wait_for(tmp_path / "read.paused", child)

    applied = cli("apply", run, "--result", mine)
    (tmp_path / "read.go").touch()
    _, err = child.communicate(timeout=600)

    assert applied.exit_code == 0, applied.output
    assert child.returncode == 2, err
    assert "another process wrote the run" in err
    assert not out.exists()
    assert not apply_file_path(out).exists()


@pytest.mark.parametrize("command", ["forget", "continue"])
def test_two_writers_overlapping_the_second_is_refused_with_one_line(trained, tmp_path, command):
    run = copy_run(trained, tmp_path / "run")
    args = {
        "forget": (["forget", run, "--clients", "2"], "fedunlearn.runs.forget:HistoryStore.forget"),
        "continue": (
            ["train", "--continue", run, "--to-round", 4],
            "fedunlearn.runs.rounds:build_setup",
        ),
    }[command]
    hold = Fault(args[1], "pause", name=str(tmp_path / "hold"))
    first = faults.start(args[0], faults=[hold])
    faults.wait_for(tmp_path / "hold.paused", first)  # it holds the writer lock now

    second = cli(*args[0])
    (tmp_path / "hold.go").touch()
    first.communicate(timeout=600)

    lines = [x for x in second.output.splitlines() if x.startswith("error:")]
    assert second.exit_code == 2
    assert len(lines) == 1
    assert "another writer" in lines[0]
    assert first.returncode == 0
    with HistoryStore.open(run / "history") as store:  # the first one's work, done once
        if command == "forget":
            assert [r.client_id for r in store.forget_records()] == [2]
        else:
            assert store.last_round() == 4


# ----- the same faults on a DP (FedADP) run ----------------------------------------------------


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("dp") / "run"
    train_run(parse_config(DP), run)
    return run


def test_a_dp_continuation_killed_then_rerun_equals_the_uninterrupted_one(dp_run, tmp_path):
    whole, cut = copy_run(dp_run, tmp_path / "whole"), copy_run(dp_run, tmp_path / "cut")
    continue_run(whole, to_round=6)
    write_round = "fedunlearn.history.store.sqlite:HistoryStore.write_round"

    killed = faults.run(["train", "--continue", cut, "--to-round", 6],
                        faults=[Fault(write_round, "kill", "after", call=2)])  # fmt: skip
    again = cli("train", "--continue", cut, "--to-round", 6)

    assert killed.returncode == -9
    assert again.exit_code == 0, again.output
    assert_same(whole, cut)
    assert (whole / "privacy.json").read_text() == (cut / "privacy.json").read_text()


def test_a_full_disk_at_privacy_json_after_a_dp_apply_finishes_on_rerun(dp_run, tmp_path):
    whole, cut = copy_run(dp_run, tmp_path / "whole"), copy_run(dp_run, tmp_path / "cut")
    out = tmp_path / "r.json"
    made = cli("unlearn", whole, "--forget", "1", "--method", "retrain", "--param", "dp=true",
               "--out", out, "--no-client-test")  # fmt: skip
    assert made.exit_code == 0, made.output
    mine = copy_result(out, tmp_path / "b")
    apply_result(whole, out)
    write_json = "fedunlearn.runs.run_files:write_json"  # summary.json, then privacy.json

    full = faults.run(["apply", cut, "--result", mine],
                      faults=[Fault(write_json, "enospc", call=2)])  # fmt: skip
    again = cli("apply", cut, "--result", mine)

    assert full.returncode == 2
    assert "generation 1 was applied" in error_lines(full)[0]
    assert again.exit_code == 0, again.output
    assert_same(whole, cut)
    assert (whole / "privacy.json").read_text() == (cut / "privacy.json").read_text()
    assert not apply_file_path(mine).exists()
