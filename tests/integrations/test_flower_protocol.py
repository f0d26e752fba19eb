"""The Flower adapters without Ray or servers: ClientApp, FlowerClients and HistoryStrategy.

``LocalGrid`` hands each message to fedunlearn's ClientApp in this process, with the node's
``partition-id`` in its context, the way a SuperNode would; these tests are fast and check the
protocol (echoes, node-client map, missing clients) and the server round against ``train_run``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

from flower_support import assert_same_history, small_config  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402

from fedunlearn import train_run  # noqa: E402
from fedunlearn.config import dump_config  # noqa: E402
from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.fl.clients import TrainTask
from fedunlearn.history import HistoryStore  # noqa: E402
from fedunlearn.integrations.flower.client_app import make_client_app  # noqa: E402
from fedunlearn.integrations.flower.driver import FlowerClients  # noqa: E402
from fedunlearn.integrations.flower.messages import FlowerProtocolError  # noqa: E402
from fedunlearn.integrations.flower.server_app import FlowerJob, train_on_grid  # noqa: E402
from fedunlearn.runs import build_setup  # noqa: E402


class LocalGrid:
    """A Grid whose SuperNodes are ClientApp calls in this process (random-looking node ids)."""

    def __init__(self, partitions: dict[int, int], drop: set[int] = frozenset()) -> None:
        self.partitions = partitions  # node id -> partition id
        self.drop = drop  # partitions that never reply to a train message
        self.app = make_client_app()
        self.sent: list[tuple[int, str, list[int]]] = []  # (node, message type, client ids)

    def get_node_ids(self) -> list[int]:
        return list(self.partitions)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node, kind = msg.metadata.dst_node_id, msg.metadata.message_type
            ids = list(msg.content["task"]["client-ids"]) if kind == "train" else []
            self.sent.append((node, kind, ids))
            if kind == "train" and self.partitions[node] in self.drop:
                continue
            context = Context(
                run_id=1,
                node_id=node,
                node_config={"partition-id": self.partitions[node]},
                state=RecordDict(),
                run_config={},
            )
            msg.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
            replies.append(self.app(msg, context))
        return replies


@pytest.fixture(autouse=True)
def task_identity():
    """Flower builds messages for the task of this process; name one, as the engines do."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


NODES = {9_001: 2, 7_005: 0, 8_003: 1}  # node ids are random; partitions say who is who


def test_strategy_over_a_grid_records_the_in_process_history(tmp_path):
    # Prepare
    config = small_config(num_clients=3, rounds=3)
    train_run(config, tmp_path / "inproc")
    grid = LocalGrid(NODES)
    job = FlowerJob(mode="train", run_dir=tmp_path / "flower", config_path=Path("/unused.yaml"))

    # Execute
    train_on_grid(grid, config, job)

    # Assert: bit-identical (both serial); one query per node, then one train message per client
    assert_same_history(tmp_path / "inproc", tmp_path / "flower", rounds=3)
    with HistoryStore.open(tmp_path / "flower" / "history") as got:
        with HistoryStore.open(tmp_path / "inproc" / "history") as want:
            assert torch.equal(got.read_model(3), want.read_model(3))
    assert sorted(node for node, kind, _ in grid.sent[:3] if kind == "query") == sorted(NODES)
    trains = grid.sent[3:]
    assert len(trains) == 3 * 3
    assert all(kind == "train" and ids == [NODES[node]] for node, kind, ids in trains)


def test_a_float16_run_over_a_grid_records_its_stored_copies(tmp_path):
    """The Flower server honours history.encoding: records of the float16 copies, marked so."""
    config = small_config(num_clients=3, rounds=2)
    config = config.model_copy(
        update={"history": config.history.model_copy(update={"encoding": "float16"})}
    )
    job = FlowerJob(mode="train", run_dir=tmp_path / "flower", config_path=Path("/unused.yaml"))

    train_on_grid(LocalGrid(NODES), config, job)

    with HistoryStore.open(tmp_path / "flower" / "history") as store:
        assert store.run_meta.records_of_stored_copy is True
        assert store.stored_bytes_by_kind()["update"] == 2 * 3 * store.read_model(0).numel() * 2
        for r in (1, 2):
            for rec in store.client_records(r):
                read = store.read_update(r, rec.client_id)
                assert rec.norm == float(read.norm())


def test_client_that_never_replies_is_missing_with_the_reason(tmp_path):
    # Prepare
    config = small_config(num_clients=3, rounds=2)
    setup = build_setup(config)
    clients = FlowerClients(LocalGrid(NODES, drop={1}), setup.federation, dump_config(config))

    # Execute
    updates = clients.train(TrainTask(setup.initial_params, [0, 1, 2], 1))

    # Assert
    assert [u.client_id for u in updates] == [0, 2]
    assert list(clients.missing) == [1]
    assert "no reply" in clients.missing[1][1]


def test_fresh_training_reproduces_the_in_process_federation(tmp_path):
    # Prepare
    config = small_config(num_clients=3, rounds=2)
    setup = build_setup(config)
    clients = FlowerClients(LocalGrid(NODES), setup.federation, dump_config(config))
    spec = setup.federation.spec

    # Execute: a calibration-style request (other epochs, salted seeds) to two clients
    short = type(spec)(epochs=2, lr=spec.lr, batch_size=spec.batch_size)
    got = clients.train(TrainTask(setup.initial_params, [2, 0], 2, spec=short, salt=5))
    want = setup.federation.train(TrainTask(setup.initial_params, [2, 0], 2, spec=short, salt=5))

    # Assert
    assert [u.client_id for u in got] == [2, 0]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.delta, w.delta)
        assert g.num_samples == w.num_samples


def test_two_nodes_claiming_one_client_stop_the_run(tmp_path):
    config = small_config(num_clients=3, rounds=1)
    setup = build_setup(config)
    clients = FlowerClients(LocalGrid({1: 0, 2: 0, 3: 1}), setup.federation, dump_config(config))

    with pytest.raises(FlowerProtocolError, match="both host client 0"):
        clients.train(TrainTask(setup.initial_params, [0, 1, 2], 1))


def test_job_paths_must_be_absolute():
    with pytest.raises(ConfigError, match="absolute"):
        FlowerJob(mode="train", run_dir=Path("runs/x"), config_path=Path("/c.yaml"))
    with pytest.raises(ConfigError, match="forget"):
        FlowerJob(mode="unlearn", run_dir=Path("/runs/x"))


def test_job_reads_flower_run_config():
    job = FlowerJob.from_run_config(
        {
            "mode": "unlearn",
            "run-dir": "/r",
            "forget": "3, 7",
            "method": "federaser",
            "method-params": '{"calibration_ratio": 1.0}',
            "round-timeout": 30.0,
        }
    )
    assert job.forget == (3, 7)
    assert job.method_params == {"calibration_ratio": 1.0}
    assert job.round_timeout == 30.0
    assert job.result_path is None


def test_model_reaches_only_the_clients_asked(tmp_path):
    # Prepare: node 5 hosts client 0; client 1 has no SuperNode
    grid = LocalGrid({5: 0})
    config = small_config(num_clients=2, rounds=1)
    setup = build_setup(config)
    clients = FlowerClients(grid, setup.federation, dump_config(config), node_timeout=0.0)

    # Execute
    updates = clients.train(TrainTask(setup.initial_params, [1], 1))

    # Assert: node 5 was only asked who it hosts; client 1 is missing
    assert updates == []
    assert grid.sent == [(5, "query", [])]
    assert clients.missing == {1: {1: "no connected SuperNode hosts this client"}}


def test_every_public_name_imports():
    import fedunlearn.integrations.flower as flower

    assert flower.__all__ == sorted(flower.__all__)
    for name in flower.__all__:
        assert getattr(flower, name) is not None
