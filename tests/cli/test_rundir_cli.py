"""Run directories through the CLI: one writer, verify and repair, forget, info (issue 16, 14)."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn.starfish.cli import _ids

runner = CliRunner()

CONFIG = {
    "seed": 4,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [64]},  # 4,810 params: payloads span overflow pages
    "training": {"rounds": 6, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "all"},
}


def write_config(path: Path, cfg: dict = CONFIG) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(cfg: Path, out: Path, *extra: str):
    res = runner.invoke(app, ["train", str(cfg), "--out", str(out), "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """An uninterrupted run (config, run dir); tests copy it, never change it."""
    root = tmp_path_factory.mktemp("reference")
    cfg = write_config(root / "c.yaml")
    train(cfg, root / "run")
    return cfg, root / "run"


def copy_run(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    return dst


def flip_payload_byte(run: Path, round_: int, client: int) -> None:
    with HistoryStore.open(run / "history") as store:
        probe = store.read_update(round_, client)[3000:3008].numpy().tobytes()  # overflow page
    file = run / "history" / "history.sqlite"
    raw = bytearray(file.read_bytes())
    where = raw.find(probe)
    assert where > 0
    assert raw.find(probe, where + 1) == -1
    raw[where] ^= 0x01
    file.write_bytes(bytes(raw))


# ----- verify and repair --------------------------------------------------------------------------


@pytest.mark.slow
def test_verify_info_resume_and_repair_of_a_payload_damaged_mid_history(tmp_path, reference):
    cfg, ref = reference
    run = copy_run(ref, tmp_path / "run")
    assert runner.invoke(app, ["verify", str(run)]).exit_code == 0
    flip_payload_byte(run, 3, 1)

    res = runner.invoke(app, ["verify", str(run)])
    assert res.exit_code == 1
    assert "problem: round 3 client 1: fails its checksum" in res.stderr
    assert "first bad round: 3" in res.stderr
    assert "--resume --repair" in res.stderr
    res = runner.invoke(app, ["verify", str(run), "--json"])
    assert json.loads(res.stdout)["first_bad_round"] == 3
    res = runner.invoke(app, ["info", str(run)])
    assert res.exit_code == 1
    assert "round 3 client 1: fails its checksum" in res.stderr
    res = runner.invoke(app, ["train", str(cfg), "--out", str(run), "--resume"])
    assert res.exit_code == 1  # damaged (docs/faults.md: exit codes)
    assert "rerun with --repair to drop round 3 and later" in res.stderr

    summary = train(cfg, run, "--resume", "--repair")

    assert summary["repaired"]["dropped_from_round"] == 3
    assert summary["resumed_from_round"] == 2
    assert runner.invoke(app, ["verify", str(run)]).exit_code == 0
    with HistoryStore.open(ref / "history") as a, HistoryStore.open(run / "history") as b:
        assert b.rounds() == a.rounds() == list(range(7))
        assert torch.equal(a.read_model(6), b.read_model(6))  # bit-identical
        assert torch.equal(a.read_update(3, 1), b.read_update(3, 1))
    assert (run / "metrics.jsonl").read_text() == (ref / "metrics.jsonl").read_text()


def test_repair_needs_resume_and_a_damaged_initial_model_retrains_everything(tmp_path, reference):
    cfg, ref = reference
    run = copy_run(ref, tmp_path / "run")
    res = runner.invoke(app, ["train", str(cfg), "--out", str(run), "--repair"])
    assert res.exit_code == 2
    assert "pass --resume --repair" in res.stderr
    with HistoryStore.open(run / "history") as store:
        m0 = store.read_model(0)[3000:3008].numpy().tobytes()
    file = run / "history" / "history.sqlite"
    raw = bytearray(file.read_bytes())
    raw[raw.find(m0)] ^= 0x80
    file.write_bytes(bytes(raw))

    summary = train(cfg, run, "--resume", "--repair")

    assert summary["repaired"]["dropped_from_round"] == 0
    with HistoryStore.open(ref / "history") as a, HistoryStore.open(run / "history") as b:
        assert torch.equal(a.read_model(6), b.read_model(6))


# ----- one writer ---------------------------------------------------------------------------------


def _spawn_train(cfg: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fedunlearn.cli.main", "train", str(cfg), "--out", str(out)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.slow
def test_two_train_processes_into_one_out_one_wins_and_config_matches(tmp_path):
    cfg_all = write_config(tmp_path / "all.yaml")
    cfg_every = write_config(
        tmp_path / "every.yaml", {**CONFIG, "history": {"policy": "every", "every": 3}}
    )
    out = tmp_path / "run"

    # at once: whichever takes the lock first trains; the other is refused, writing nothing
    first, second = _spawn_train(cfg_all, out), _spawn_train(cfg_every, out)
    errs = [p.communicate(timeout=300)[1] for p in (first, second)]

    codes = [first.returncode, second.returncode]
    assert sorted(codes) == [0, 2], (codes, errs)
    winner = ("all", "every")[codes.index(0)]
    assert yaml.safe_load((out / "config.yaml").read_text())["history"]["policy"] == winner
    res = runner.invoke(app, ["info", str(out), "--json"])
    assert res.exit_code == 0, res.output  # config.yaml matches the store
    assert json.loads(res.stdout)["history_policy"] == winner
    loser_err = errs[codes.index(2)]
    assert "another writer holds" in loser_err or "already holds a run" in loser_err
    assert len(loser_err.strip().splitlines()) == 1


@pytest.mark.slow
def test_train_process_into_a_run_being_trained_is_refused_untouched(tmp_path):
    out = tmp_path / "run"
    reached, release = threading.Event(), threading.Event()

    class HoldAtRound2:
        def on_round_end(self, record):
            if record.round == 2:
                reached.set()
                release.wait(timeout=300)

    worker = threading.Thread(
        target=train_run, args=(parse_config(CONFIG), out), kwargs={"observers": [HoldAtRound2()]}
    )
    worker.start()
    try:
        assert reached.wait(timeout=120)
        config_before = (out / "config.yaml").read_bytes()
        other = write_config(tmp_path / "every.yaml", {**CONFIG, "history": {"policy": "every"}})
        intruder = _spawn_train(other, out)
        _, err = intruder.communicate(timeout=240)
        assert (out / "config.yaml").read_bytes() == config_before
        assert intruder.returncode == 2
        assert "already holds a run" in err
    finally:
        release.set()
        worker.join(timeout=300)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_changed_config_yaml_is_noticed_by_resume_info_and_verify(tmp_path, reference):
    cfg, ref = reference
    run = copy_run(ref, tmp_path / "run")
    changed = yaml.safe_load((run / "config.yaml").read_text())
    changed["training"]["lr"] = 0.05
    (run / "config.yaml").write_text(yaml.safe_dump(changed))

    res = runner.invoke(app, ["train", str(run / "config.yaml"), "--out", str(run), "--resume"])
    assert res.exit_code == 2
    assert "training.lr: 0.05 vs 0.3" in res.stderr
    res = runner.invoke(app, ["info", str(run), "--json"])
    assert res.exit_code == 1
    (problem,) = json.loads(res.stdout)["problems"]
    assert "does not match the config stored" in problem
    assert "training.lr" in problem
    res = runner.invoke(app, ["unlearn", str(run), "--forget", "1", "--method", "retrain",
                              "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert res.exit_code == 2
    assert "--restore-config" in res.stderr

    res = runner.invoke(app, ["verify", str(run), "--restore-config"])

    assert res.exit_code == 0, res.output
    assert (run / "config.yaml").read_text() == (ref / "config.yaml").read_text()


# ----- forget and info ------------------------------------------------------------------------


def test_forget_cli_prints_the_deletion_record_and_info_shows_forgotten_clients(
    tmp_path, reference
):
    _, ref = reference
    run = copy_run(ref, tmp_path / "run")
    before = json.loads(runner.invoke(app, ["info", str(run), "--json"]).stdout)
    assert before["forgotten_clients"] == []

    res = runner.invoke(app, ["forget", str(run), "--clients", "1,3", "--json"])

    assert res.exit_code == 0, res.output
    done = json.loads(res.stdout)
    record, check = done["record"], done["check"]
    assert record["client_ids"] == [1, 3]
    assert [(p["client_id"], p["round"]) for p in record["payloads"]] == [
        (c, r) for c in (1, 3) for r in range(1, 7)
    ]
    assert record["size_bytes"] == 12 * before["num_params"] * 4
    assert record["bytes_reclaimed"] > 0
    assert all(len(p["sha256"]) == 64 for p in record["payloads"])
    assert check["ok"]
    assert check["unreadable"] == 12
    assert check["fingerprints_found"] == 0
    info = runner.invoke(app, ["info", str(run), "--json"])
    assert info.exit_code == 0
    data = json.loads(info.stdout)
    assert data["forgotten_clients"] == [1, 3]
    assert data["forgotten"]["1"]["size_bytes"] == 6 * before["num_params"] * 4
    table = runner.invoke(app, ["info", str(run)]).stdout
    assert "| forgotten clients | 1, 3 |" in table
    text = runner.invoke(app, ["forget", str(run), "--clients", "3"])
    assert text.exit_code == 0
    assert "client 3: 0 stored update(s) deleted" in text.stdout
    res = runner.invoke(app, ["forget", str(run), "--clients", "9"])
    assert res.exit_code == 2
    assert "client(s) 9 never appear" in res.stderr


def test_forget_malicious_is_accepted_by_starfish_like_unlearn(reference):
    _, ref = reference
    with HistoryStore.open(ref / "history") as store:
        malicious = store.meta["malicious"]
    assert malicious
    assert _ids("malicious", ref) == malicious
    assert _ids("2,0", ref) == [0, 2]
