"""``starfish-local`` names the child that failed first, with its real exit status (issue 41).

Before: once one child failed, the launcher killed the others at once and listed every child
with a non-zero status in the fixed order dealer, server0, server1, clients: after a crash
every child read ``exit -9`` and the message began with the dealer whatever had failed. Here
``run_local`` runs with small stand-in children (a few lines of Python each, started as the
real ones are, logs included) instead of the four ``starfish-*`` commands.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.starfish.deploy import launcher
from fedunlearn.unlearn.starfish.deploy.launcher import CHILDREN, LocalRunError, exit_status

METHOD = make_method("starfish", {"backend": "mpc"})

# what each stand-in child does: (seconds, how it ends, its last log line, after whom): it
# waits ``seconds`` (after the named child's log got its line, if one is named), prints the
# line and ends
SLEEPS = (60.0, "exit 0", "", None)


def stand_in(logs: Path, seconds: float, end: str, line: str, after: str | None) -> str:
    how = "os.kill(os.getpid(), 9)" if end == "SIGKILL" else f"sys.exit({end.split()[1]})"
    wait = (
        f"while not os.path.getsize({str(logs / f'{after}.log')!r}): time.sleep(0.01)\n"
        if after
        else ""
    )
    return (
        f"import os, sys, time\n{wait}time.sleep({seconds})\nprint({line!r}, flush=True)\n{how}\n"
    )


def run_with(plan: dict[str, tuple], tmp_path: Path, monkeypatch) -> str:
    """``run_local`` with stand-ins for the children; return its error message."""

    def fake_launch(job, outs, logs, tls, options):
        children = []
        for name in CHILDREN:
            with (logs / f"{name}.log").open("wb") as log:
                script = stand_in(logs, *plan.get(name, SLEEPS))
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT
                    )
                )
        return children

    monkeypatch.setattr(launcher, "launch", fake_launch)
    monkeypatch.setattr(launcher, "ensure_shares", lambda run_dir, method: False)
    monkeypatch.setattr(launcher, "GRACE_SECONDS", 0.5)
    with pytest.raises(LocalRunError) as caught:
        launcher.run_local(tmp_path / "run", [0], METHOD, log_dir=tmp_path, insecure=True)
    return str(caught.value)


@pytest.mark.slow
def test_a_child_killed_by_a_signal_is_named_first_and_the_others_as_stopped(tmp_path, monkeypatch):
    # before: "dealer exit -9: ...; server0 exit -9: ...; server1 exit -9: ...; clients exit -9"
    message = run_with({"server1": (0.3, "SIGKILL", "", None)}, tmp_path, monkeypatch)
    assert message.startswith("server1 failed first (killed by SIGKILL"), message
    assert "starfish-local stopped dealer, server0, clients (still running)" in message
    assert "exit -9" not in message


@pytest.mark.slow
def test_the_first_failure_is_blamed_and_the_peers_it_took_down_keep_their_status(
    tmp_path, monkeypatch
):
    # server 0 fails; its peers notice the lost link and end with exit 2 on their own; the
    # clients service (idle between requests) is still waiting and is stopped
    plan = {
        "server0": (0.2, "exit 2", "error: SecureComputationError: the opened aggregate", None),
        "server1": (0.1, "exit 2", "error: PeerDisconnectedError: server0 went away", "server0"),
        "dealer": (0.1, "exit 2", "error: PeerDisconnectedError: lost party 0", "server1"),
    }
    message = run_with(plan, tmp_path, monkeypatch)
    first, second, third, stopped = message.split("; ")
    assert first.startswith("server0 failed first (exit 2: ")
    assert "SecureComputationError: the opened aggregate" in first
    assert second.startswith("then server1 (exit 2: error: PeerDisconnectedError")
    assert third.startswith("then dealer (exit 2: error: PeerDisconnectedError")
    assert stopped == "starfish-local stopped clients (still running)"


def test_exit_statuses_read_as_words():
    assert exit_status(0) == "exit 0"
    assert exit_status(2) == "exit 2"
    assert exit_status(-9) == "killed by SIGKILL"
    assert exit_status(-15) == "killed by SIGTERM"
    assert exit_status(-200) == "killed by signal 200"
