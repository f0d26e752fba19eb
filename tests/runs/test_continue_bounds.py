"""``train --continue`` targets obey ``training.rounds``' bound (a user review).

Before: ``--to-round 100000000`` was accepted (a config may name at most 100,000 rounds) and
ran for ten minutes, growing the store by 2 GB, with no estimate and no limit.
"""

from __future__ import annotations

import pytest
from tests.runs.test_train_uploads import RUN  # the same tiny digits run
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.config.training import MAX_ROUNDS
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--to-round", str(MAX_ROUNDS + 1)], f"--to-round {MAX_ROUNDS + 1:,} is past 100,000"),
        (["--rounds", str(MAX_ROUNDS)], f"round {MAX_ROUNDS + 2:,} is past 100,000"),
    ],
)
def test_a_continuation_past_the_round_bound_is_refused_before_any_round(tmp_path, args, said):
    train_run(parse_config(RUN), tmp_path / "run")
    res = CliRunner().invoke(app, ["train", "--continue", str(tmp_path / "run"), *args])
    assert res.exit_code == 2, res.output
    assert said in " ".join(res.output.split())
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        assert store.last_round() == 2
