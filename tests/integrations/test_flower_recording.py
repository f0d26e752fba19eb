"""``Recording`` around Flower's own FedAvg, over a Grid of in-process nodes (no Ray, no servers).

``OwnGrid`` hands each message to the user's ClientApp (``own_app_support``) with the node's
config, the way a SuperNode would; node ids are random-looking, the client ids come from the
node config. The run directory written must be a normal fedunlearn run (info, verify, forget).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

import own_app_support as own  # noqa: E402
from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.fl.threads import run_threads  # noqa: E402
from fedunlearn.history import HistoryStore  # noqa: E402
from fedunlearn.integrations.flower.recording import Recording  # noqa: E402
from fedunlearn.runs import check_run, forget_clients, run_info  # noqa: E402


class OwnGrid:
    """Nodes that are calls of a ClientApp in this process; ``tamper`` edits chosen replies."""

    def __init__(
        self, node_config: dict[int, dict], app=own.app, tamper=None, run_config=None
    ) -> None:
        self.node_config = node_config  # node id -> node config
        self.app = app
        self.run_config = dict(run_config or {})  # what every node's context holds
        self.tamper = tamper or {}  # node id -> reply -> reply (or None: no reply)
        self.sent: list[tuple[int, str]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.node_config)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            self.sent.append((node, msg.metadata.message_type))
            context = Context(
                run_id=1,
                node_id=node,
                node_config=self.node_config[node],
                state=RecordDict(),
                run_config=self.run_config,
            )
            msg.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
            try:
                reply = self.app(msg, context)
            except Exception as err:  # noqa: BLE001 - a SuperNode turns it into an error reply
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
            if node in self.tamper:
                reply = self.tamper[node](reply)
            if reply is not None:
                replies.append(reply)
        return replies


@pytest.fixture(autouse=True)
def task_identity():
    """Flower builds messages for the task of this process; name one, as the engines do."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


NODES = {90_017: {"partition-id": 2}, 70_051: {"partition-id": 0}, 80_033: {"partition-id": 1}}


def record(tmp_path, grid, rounds=2, **kwargs):
    net = own.tiny_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    strategy = Recording(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1),
        run_dir=tmp_path / "run",
        model=own.MODEL,
        input_shape=own.INPUT_SHAPE,
        num_classes=own.NUM_CLASSES,
        **kwargs,
    )
    result = strategy.start(
        grid,
        ArrayRecord(net.state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.2, "local-epochs": 1}),
        evaluate_fn=lambda r, arrays: MetricRecord({"test_accuracy": 0.5 + r}),
    )
    return strategy, result


def test_every_round_is_recorded_with_stable_client_ids(tmp_path):
    strategy, result = record(tmp_path, OwnGrid(NODES))
    run = tmp_path / "run"
    with HistoryStore.open(run / "history") as store:
        assert store.rounds() == [0, 1, 2]
        for r in (1, 2):
            before, after = store.read_model(r - 1), store.read_model(r)
            torch.testing.assert_close(store.read_model(r, "aggregate"), after - before)
            updates = dict(store.iter_updates(r))
            assert sorted(updates) == [0, 1, 2]  # partition ids, not node ids
            # FedAvg: the aggregate is the num-examples weighted mean of the updates (40 each)
            mean = sum(updates.values()) / 3
            torch.testing.assert_close(store.read_model(r, "aggregate"), mean, atol=1e-6, rtol=0)
            assert [c.num_samples for c in store.client_records(r)] == [40, 40, 40]
            assert store.round_scalars(r)["test_accuracy"] == 0.5 + r
        flat = torch.cat(
            [torch.from_numpy(a).reshape(-1) for a in result.arrays.to_numpy_ndarrays()]
        )
        torch.testing.assert_close(store.read_model(2), flat)
        assert store.meta["client_sizes"] == {"0": 40, "1": 40, "2": 40}
    info = run_info(run)
    assert info["dataset"] == "node-local"
    assert info["complete"]
    assert not info["problems"]
    assert check_run(run)["ok"]
    forget_clients(run, [1])
    assert run_info(run)["forgotten_clients"] == [1]
    assert len(strategy.recording_seconds) == 2


def test_several_clients_per_node(tmp_path):
    grid = OwnGrid({5: {"partition-id": "0,1"}, 6: {"partition-id": 2}})

    # FedAvg sends one message per node; a multi-client node needs the client named
    class PerClient(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            out = []
            for node, cid in ((5, 0), (5, 1), (6, 2)):
                cfg = ConfigRecord({**config, "fedunlearn.client-id": cid})
                out.append(
                    Message(
                        RecordDict({"arrays": arrays, "config": cfg}),
                        dst_node_id=node,
                        message_type="train",
                    )
                )
            return out

    strategy = Recording(
        PerClient(fraction_evaluate=0.0),
        run_dir=tmp_path / "run",
        model=own.MODEL,
        input_shape=own.INPUT_SHAPE,
        num_classes=3,
        local_epochs=1,
    )
    net = own.tiny_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    strategy.start(grid, ArrayRecord(net.state_dict()), num_rounds=1)
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        assert sorted(dict(store.iter_updates(1))) == [0, 1, 2]


def _drop_id(reply):
    del reply.content["fedunlearn"]
    return reply


def _nan(reply):
    arrays = reply.content["arrays"]
    first = next(iter(arrays))
    values = arrays[first].numpy().copy()
    values.flat[0] = math.nan
    reply.content["arrays"] = ArrayRecord(
        {**{k: arrays[k] for k in arrays}, first: type(arrays[first])(values)}
    )
    return reply


def _huge(reply):
    arrays = reply.content["arrays"]
    first = next(iter(arrays))
    reply.content["arrays"] = ArrayRecord(
        {**{k: arrays[k] for k in arrays}, first: type(arrays[first])(arrays[first].numpy() * 1e9)}
    )
    return reply


def _reshape(reply):
    arrays = reply.content["arrays"]
    first = next(iter(arrays))
    reply.content["arrays"] = ArrayRecord(
        {
            **{k: arrays[k] for k in arrays},
            first: type(arrays[first])(arrays[first].numpy().reshape(-1)),
        }
    )
    return reply


def _same_id(reply):
    reply.content["fedunlearn"] = ConfigRecord({"client-id": 0})
    return reply


@pytest.mark.parametrize(
    ("tamper", "where", "says"),
    [
        (_drop_id, "unnamed", "names no client id"),
        (_same_id, "unnamed", "a second reply this round"),
        (_nan, "rejected", "non-finite values"),
        (_huge, "rejected", "exceed"),
        (_reshape, "rejected", "has shape"),
    ],
)
def test_bad_reply_is_rejected_and_recorded_and_the_round_goes_on(
    tmp_path, caplog, tamper, where, says
):
    node = 90_017  # hosts client 2; client 0 is node 70_051
    strategy, _ = record(tmp_path, OwnGrid(NODES, tamper={node: tamper}), rounds=1)
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        records = {c.client_id: c for c in store.client_records(1)}
        assert sorted(dict(store.iter_updates(1))) == [0, 1]  # the other replies aggregated
        mean = sum(dict(store.iter_updates(1)).values()) / 2
        torch.testing.assert_close(store.read_model(1, "aggregate"), mean, atol=1e-6, rtol=0)
        if where == "rejected":
            assert records[2].status == "rejected"
            assert says in records[2].reason
        else:
            assert 2 not in records
            assert says in store.round_scalars(1)["rejected_reasons"]
            assert store.round_scalars(1)["rejected_replies"] == 1
    lines = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert len(lines) == 1
    assert says in lines[0]


def test_a_model_that_does_not_match_the_arrays_stops_before_round_one(tmp_path):
    with pytest.raises(ConfigError, match="must be the same"):
        record(tmp_path, OwnGrid(NODES), model_options={"hidden": 5})
    with pytest.raises(ConfigError, match="own_app_support has no .nope."):
        Recording(
            FedAvg(),
            run_dir=tmp_path / "r2",
            model="own_app_support:nope",
            input_shape=(8,),
            num_classes=3,
            local_epochs=1,
        ).start(OwnGrid(NODES), ArrayRecord(own.tiny_net((8,), 3).state_dict()), num_rounds=1)
    assert not (tmp_path / "r2" / "history").exists()


def test_summary_and_metrics_are_written(tmp_path):
    record(tmp_path, OwnGrid(NODES))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine"] == "flower-app"
    assert summary["rounds"] == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1, 2]


def test_the_servers_thread_count_is_recorded_for_unlearning(tmp_path):
    """Before: a Flower-recorded run had no torch_threads, so a replay ran at any count."""
    with run_threads(2, purpose="the test"):  # the suite runs at 1 (tests/conftest.py)
        record(tmp_path, OwnGrid(NODES))
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        assert store.run_meta.torch_threads == 2


@pytest.mark.parametrize("method", ["retrain", "fedrecover"])
def test_unlearning_over_the_users_client_app(tmp_path, method):
    from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app

    record(tmp_path, OwnGrid(NODES), rounds=2)
    # a new flwr run: other node ids, the same partitions
    grid = OwnGrid({11: {"partition-id": 1}, 12: {"partition-id": 0}, 13: {"partition-id": 2}})
    own.TRAINED.clear()
    out = unlearn_over_app(
        grid,
        tmp_path / "run",
        method,
        [1],
        evaluate_fn=lambda r, arrays: MetricRecord({"test_accuracy": 0.25}),
    )
    trained = {cid for cid, _, _ in own.TRAINED}
    assert trained
    assert 1 not in trained
    assert {(lr, epochs) for _, lr, epochs in own.TRAINED} == {(0.2, 1)}  # the recorded settings
    assert out["test_accuracy"] == 0.25
    assert out["request"]["forget"] == [1]
    check = out["client_check"]["1"]
    assert check["shown"]
    assert check["samples"] == 40
    assert check["loss_before"] != check["loss_after"]
    from fedunlearn.models import get_flat_params, load_model

    model = load_model(out["model_file"], factory=own.tiny_net)
    assert get_flat_params(model).shape == (8 * 6 + 6 + 6 * 3 + 3,)


def test_client_check_says_why_when_the_node_computes_no_losses(tmp_path):
    from fedunlearn.integrations.flower.app_protocol import own_client_app
    from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app

    record(tmp_path, OwnGrid(NODES), rounds=1)
    bare = own_client_app()
    bare.train()(own.train)
    grid = OwnGrid(
        {11: {"partition-id": 1}, 12: {"partition-id": 0}, 13: {"partition-id": 2}}, app=bare
    )
    out = unlearn_over_app(grid, tmp_path / "run", "retrain", [2])
    check = out["client_check"]["2"]
    assert not check["shown"]
    assert check["reason"].startswith("not provided: this client's ClientApp computes no losses")
    # never asked for losses (before: one failing query, a Ray traceback under Flower): the
    # only queries are the three nodes' "which clients do you host"
    assert [t for _, t in grid.sent].count("query.fedunlearn") == 3


def test_a_node_that_stops_replying_is_recorded_missing(tmp_path):
    calls = {"n": 0}

    def silent_after_round_one(reply):
        calls["n"] += 1
        return reply if calls["n"] == 1 else None

    record(tmp_path, OwnGrid(NODES, tamper={70_051: silent_after_round_one}), rounds=2)
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        round2 = {c.client_id: c for c in store.client_records(2)}
        assert round2[0].status == "missing"
        assert "no reply" in round2[0].reason
        assert sorted(dict(store.iter_updates(2))) == [1, 2]


def test_unlearning_request_keys_are_checked(tmp_path):
    from fedunlearn.integrations.flower.app_unlearn import unlearn_from_run_config

    def context(**rc):
        return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)

    assert unlearn_from_run_config(OwnGrid(NODES), context(**{"unlearn-forget": ""})) is None
    with pytest.raises(ConfigError, match="comma-separated client ids"):
        unlearn_from_run_config(OwnGrid(NODES), context(**{"unlearn-forget": "one"}))
    with pytest.raises(ConfigError, match="absolute directory"):
        unlearn_from_run_config(
            OwnGrid(NODES), context(**{"unlearn-forget": "1", "unlearn-run-dir": "rel"})
        )
    record(tmp_path, OwnGrid(NODES), rounds=1)
    with pytest.raises(Exception, match="not in this run"):
        unlearn_from_run_config(
            OwnGrid(NODES),
            context(**{"unlearn-forget": "7", "unlearn-run-dir": str(tmp_path / "run")}),
        )


def test_receipt_says_the_forgotten_clients_data_is_on_its_node(tmp_path):
    from fedunlearn.integrations.flower.app_protocol import own_client_app
    from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app

    record(tmp_path, OwnGrid(NODES), rounds=1)
    shown = unlearn_over_app(OwnGrid(NODES), tmp_path / "run", "retrain", [1])
    bare = own_client_app()
    bare.train()(own.train)
    hidden = unlearn_over_app(OwnGrid(NODES, app=bare), tmp_path / "run", "retrain", [1])
    for out, reported in ((shown, "node reports its mean loss"), (hidden, "computes no losses")):
        checks = {c["name"]: c for c in out["verification"]["checks"]}
        for name in ("membership", "client_membership"):
            assert checks[name]["verdict"] == "n/a"
            assert checks[name]["reason"].startswith(
                "not shown: the forgotten client's data is on its node"
            )
            assert reported in checks[name]["reason"]
        # the store still holds client 1's updates (policy all): the store check says so
        assert checks["deletion"]["verdict"] == "warn"
        assert "still in the store" in checks["deletion"]["reason"]


def test_a_batchnorm_model_is_recorded_with_its_buffers_and_unlearned(tmp_path, monkeypatch):
    from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app
    from fedunlearn.models import get_flat_params, load_model

    monkeypatch.setitem(own.FACTORY, "net", own.bn_net)
    net = own.bn_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    strategy = Recording(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1),
        run_dir=tmp_path / "run",
        model="own_app_support:bn_net",
        input_shape=own.INPUT_SHAPE,
        num_classes=own.NUM_CLASSES,
        local_epochs=1,
    )
    result = strategy.start(OwnGrid(NODES), ArrayRecord(net.state_dict()), num_rounds=2)
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        flat = store.read_model(2)
        # the model's flat order: parameters, then running_mean, running_var, num_batches_tracked
        assert flat.shape == get_flat_params(net).shape == (8 * 6 + 6 + 6 + 6 + 6 * 3 + 3 + 13,)
        final = result.arrays.to_torch_state_dict()
        torch.testing.assert_close(flat[-13:-7], final["1.running_mean"].float())
        assert flat[-1] == 8.0  # 4 batches a round, 2 rounds: num_batches_tracked
    out = unlearn_over_app(OwnGrid(NODES), tmp_path / "run", "retrain", [2])
    model = load_model(out["model_file"], factory=own.bn_net)
    assert int(model[1].num_batches_tracked) == 8
    assert torch.isfinite(get_flat_params(model)).all()


def test_the_strategys_sampling_share_is_recorded_for_unlearning(tmp_path):
    from fedunlearn.runs import load_run_config

    strategy = Recording(
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1),
        run_dir=tmp_path / "run",
        model=own.MODEL,
        input_shape=own.INPUT_SHAPE,
        num_classes=own.NUM_CLASSES,
        local_epochs=1,
    )
    net = own.tiny_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    strategy.start(OwnGrid(NODES), ArrayRecord(net.state_dict()), num_rounds=1)
    assert load_run_config(tmp_path / "run").training.participation == 0.5


@pytest.mark.slow
def test_unlearning_reaches_clients_on_a_shared_node_and_says_when_one_is_gone(tmp_path):
    from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app

    record(tmp_path, OwnGrid(NODES), rounds=1)
    # client 2 now shares a node with client 0; client 1's node is gone
    grid = OwnGrid({21: {"partition-id": "0,2"}})
    own.TRAINED.clear()
    out = unlearn_over_app(grid, tmp_path / "run", "retrain", [1], node_timeout=0.1)
    assert {cid for cid, _, _ in own.TRAINED} == {0, 2}
    check = out["client_check"]["1"]
    assert not check["shown"]
    assert "no node hosts it now" in check["reason"]
