"""The job a deployment's links are bound to: equal at servers and clients, differences named."""

from __future__ import annotations

import shutil

import pytest
from starfish_support import small_run_config

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR, load_run_config, train_run
from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.starfish.deploy.binding import (
    JOB_FIELDS,
    check_deployable,
    config_digest,
    read_sharing,
    sharing_digest,
    starfish_binding,
)
from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares, share_meta, share_store_dir

METHOD = make_method("starfish", {"backend": "mpc"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("starfish_binding") / "run"
    train_run(parse_config(small_run_config(seed=3, rounds=4)), path)
    ensure_shares(path, METHOD)
    return path


def server_binding(run_dir, party, forget=(0,), method=METHOD, session="s-1"):
    with HistoryStore.open(share_store_dir(run_dir, party)) as store:
        return starfish_binding(
            session,
            config=load_run_config(run_dir),
            forget=forget,
            method=method,
            history=store,
            sharing=share_meta(store),
        )


def clients_binding(run_dir, forget=(0,)):
    with HistoryStore.open(run_dir / HISTORY_DIR) as store:
        return starfish_binding(
            "s-1",
            config=load_run_config(run_dir),
            forget=forget,
            method=METHOD,
            history=store,
            sharing=read_sharing(run_dir),
        )


def test_both_servers_and_the_clients_compute_the_same_binding(run_dir):
    first, second, clients = (
        server_binding(run_dir, 0),
        server_binding(run_dir, 1),
        clients_binding(run_dir),
    )
    assert first == second == clients
    assert tuple(first.digests) == tuple(sorted(JOB_FIELDS))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"forget": (1,)}, "digest forget_set"),
        ({"method": make_method("starfish", {"selection_rate": 0.8})}, "digest method"),
        ({"session": "s-2"}, "session_id"),
    ],
    ids=["forget", "method", "session"],
)
def test_a_different_job_differs_exactly_in_the_field_that_changed(run_dir, change, field):
    ours = server_binding(run_dir, 0)
    theirs = server_binding(run_dir, 1, **change)
    assert list(ours.differences(theirs)) == [field]


def test_a_share_store_of_another_sharing_differs_in_share_store_only(run_dir, tmp_path):
    # Prepare: a copy of the run, shared again (fresh masks, fresh sharing id)
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    ensure_shares(copy, METHOD, force=True)

    # Execute / Assert: server 1 of the new sharing against server 0 of the old one
    differences = server_binding(run_dir, 0).differences(server_binding(copy, 1))
    assert list(differences) == ["digest share_store"]
    assert read_sharing(copy)["sharing_id"] != read_sharing(run_dir)["sharing_id"]


def test_the_local_data_directory_is_not_part_of_the_job(run_dir):
    config = load_run_config(run_dir)
    moved = config.model_copy(update={"data": config.data.model_copy(update={"data_dir": "/x"})})
    assert config_digest(moved) == config_digest(config)


def test_shares_without_a_sharing_id_must_be_made_again():
    with pytest.raises(UnsupportedHistoryError, match="starfish-share RUN --force"):
        sharing_digest({"frac_bits": 16})


def test_ideal_comparisons_are_refused_in_a_deployment():
    check_deployable(METHOD)
    with pytest.raises(ConfigError, match=r"learn d \(G\^2 - delta\^2"):
        check_deployable(make_method("starfish", {"backend": "mpc", "comparison": "ideal"}))


class Tampered:
    """A store whose round-2 model (or round-2 participants) is not the recorded one."""

    def __init__(self, store, what):
        self.store, self.what = store, what

    def read_model(self, round, kind="global"):
        model = self.store.read_model(round, kind)
        return model + 1e-6 if self.what == "model" and round == 2 else model

    def client_records(self, round):
        records = self.store.client_records(round)
        return records[1:] if self.what == "participants" and round == 2 else records


@pytest.mark.parametrize("what", ["config", "model", "participants"])
def test_another_config_or_trajectory_differs_in_that_field_only(run_dir, what):
    # Prepare: server 1's view of the job changed in one place
    config = load_run_config(run_dir)
    if what == "config":
        training = config.training.model_copy(update={"lr": config.training.lr * 2})
        config = config.model_copy(update={"training": training})
    with HistoryStore.open(share_store_dir(run_dir, 1)) as store:
        history = store if what == "config" else Tampered(store, what)

        # Execute
        theirs = starfish_binding(
            "s-1", config=config, forget=(0,), method=METHOD, history=history,
            sharing=share_meta(store),
        )  # fmt: skip

    # Assert
    field = "digest run_config" if what == "config" else "digest trajectory"
    assert list(server_binding(run_dir, 0).differences(theirs)) == [field]
