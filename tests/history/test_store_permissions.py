"""A history store is its owner's only, whatever the umask (issue 25: world-readable history)."""

import os
import stat

import torch

from fedunlearn.history.store import HistoryStore, RoundEntry


def test_a_new_store_is_private_under_a_permissive_umask(tmp_path):
    # Prepare
    old = os.umask(0)
    try:
        # Execute: create, write a round (WAL), reopen for reading
        with HistoryStore.create(tmp_path / "run" / "history", {"k": 1}) as store:
            store.write_round(RoundEntry(round=0, global_model=torch.zeros(3)))
        with HistoryStore.open(tmp_path / "run" / "history") as store:
            store.read_model(0)
    finally:
        os.umask(old)

    # Assert: the directory made here is 0700, every file in it 0600 at most
    directory = tmp_path / "run" / "history"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = [p for p in directory.iterdir() if p.is_file()]
    assert any(p.name == "history.sqlite" for p in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path.name, oct(path.stat().st_mode))
