import multiprocessing
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedunlearn.errors import ConfigError, FedUnlearnError, UnknownClientError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.executors import SerialExecutor, make_executor, select_executor
from fedunlearn.fl.pool import WorkerPoolExecutor
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.vectorized import VectorizedExecutor, unsupported_modules
from fedunlearn.models import build_model, get_flat_params

SHAPE = (1, 6, 6)
# one client smaller than a batch, one exactly two batches, others with a short last batch
SIZES = [3, 40, 64, 65, 130]
SPECS = {
    "plain": LocalTrainingSpec(epochs=3, lr=0.1, batch_size=32),
    "momentum_wd": LocalTrainingSpec(
        epochs=3, lr=0.1, batch_size=32, momentum=0.9, weight_decay=1e-3
    ),
}


def make_clients(sizes, shape=SHAPE, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = {}
    for cid, n in enumerate(sizes):
        x = torch.rand((n, *shape), generator=g)
        data[cid] = ClientData(x, torch.randint(0, 10, (n,), generator=g))
    return data


def tasks_for(clients, seed=100):
    return [(cid, seed + 7 * cid) for cid in clients]


def assert_updates_close(fast, reference, rel=1e-5):
    assert [u.client_id for u in fast] == [u.client_id for u in reference]
    for f, r in zip(fast, reference, strict=True):
        assert f.num_samples == r.num_samples
        scale = max(float(r.delta.norm()), 1e-12)
        torch.testing.assert_close(f.delta, r.delta, rtol=0, atol=rel * scale)
        if r.train_loss == r.train_loss:  # not NaN
            assert f.train_loss == pytest.approx(r.train_loss, rel=1e-5)
        else:
            assert f.train_loss != f.train_loss


@contextmanager
def torch_threads(n):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# --- vectorized ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
def test_vectorized_matches_serial_loop(model_name, spec_name):
    # Prepare
    model = build_model(model_name, SHAPE, 10, seed=1)
    clients = make_clients(SIZES)
    params, tasks, spec = get_flat_params(model), tasks_for(clients), SPECS[spec_name]
    # Execute
    reference = SerialExecutor(model, clients).run(params, tasks, spec)
    fast = VectorizedExecutor(model, clients).run(params, tasks, spec)
    # Assert
    assert all(float(u.delta.norm()) > 0 for u in reference)
    assert_updates_close(fast, reference)


def test_vectorized_client_without_data_matches_serial_loop():
    # local_update takes one empty step per epoch: weight decay moves the model, loss is NaN
    model = build_model("logreg", SHAPE, 10, seed=1)
    clients = make_clients([0, 5, 0])
    spec = SPECS["momentum_wd"]
    reference = SerialExecutor(model, clients).run(get_flat_params(model), tasks_for(clients), spec)
    fast = VectorizedExecutor(model, clients).run(get_flat_params(model), tasks_for(clients), spec)
    assert_updates_close(fast, reference)


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=4),
    batch_size=st.integers(1, 20),
    epochs=st.integers(0, 2),
    momentum=st.sampled_from([0.0, 0.5]),
)
def test_vectorized_matches_serial_for_any_sizes(sizes, batch_size, epochs, momentum):
    model = build_model("logreg", SHAPE, 10, seed=2)
    clients = make_clients(sizes, seed=len(sizes))
    spec = LocalTrainingSpec(epochs=epochs, lr=0.2, batch_size=batch_size, momentum=momentum)
    params, tasks = get_flat_params(model), tasks_for(clients)
    reference = SerialExecutor(model, clients).run(params, tasks, spec)
    assert_updates_close(VectorizedExecutor(model, clients).run(params, tasks, spec), reference)


def test_vectorized_chunks_give_the_same_updates_as_one_chunk():
    model = build_model("mlp", SHAPE, 10, seed=1)
    clients = make_clients(SIZES)
    params, tasks, spec = get_flat_params(model), tasks_for(clients), SPECS["momentum_wd"]
    whole = VectorizedExecutor(model, clients)
    chunked = VectorizedExecutor(model, clients, max_chunk_bytes=1)  # one client per chunk
    assert whole._chunk_size(spec) >= len(SIZES)
    assert chunked._chunk_size(spec) == 1
    assert_updates_close(chunked.run(params, tasks, spec), whole.run(params, tasks, spec), 1e-6)


def test_vectorized_returns_updates_in_task_order():
    model = build_model("logreg", SHAPE, 10, seed=1)
    clients = make_clients(SIZES)
    tasks = [(4, 1), (0, 2), (4, 3)]  # the same client twice, with different seeds
    updates = VectorizedExecutor(model, clients).run(get_flat_params(model), tasks, SPECS["plain"])
    reference = SerialExecutor(model, clients).run(get_flat_params(model), tasks, SPECS["plain"])
    assert [u.client_id for u in updates] == [4, 0, 4]
    assert not torch.equal(updates[0].delta, updates[2].delta)
    assert_updates_close(updates, reference)


@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
def test_vectorized_is_bit_identical_across_runs(model_name):
    model = build_model(model_name, SHAPE, 10, seed=1)
    clients = make_clients(SIZES)
    params, tasks, spec = get_flat_params(model), tasks_for(clients), SPECS["momentum_wd"]
    first = VectorizedExecutor(model, clients).run(params, tasks, spec)
    second = VectorizedExecutor(model, clients).run(params, tasks, spec)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(first, second, strict=True))
    assert [a.train_loss for a in first] == [b.train_loss for b in second]


def test_serial_is_bit_identical_across_runs():
    model = build_model("mlp", SHAPE, 10, seed=1)
    clients = make_clients(SIZES)
    params, tasks, spec = get_flat_params(model), tasks_for(clients), SPECS["momentum_wd"]
    first = SerialExecutor(model, clients).run(params, tasks, spec)
    second = SerialExecutor(model, clients).run(params, tasks, spec)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize(
    ("layer", "reason"),
    [(nn.Dropout(0.5), "Dropout"), (nn.BatchNorm1d(36), "BatchNorm1d")],
)
def test_vectorized_refuses_random_or_stateful_models(layer, reason):
    model = nn.Sequential(nn.Flatten(), layer, nn.Linear(36, 10))
    assert any(reason in r for r in unsupported_modules(model))
    with pytest.raises(ConfigError, match=reason):
        VectorizedExecutor(model, make_clients([4]))


def test_vectorized_rejects_unknown_clients_and_wrong_parameter_size():
    model = build_model("logreg", SHAPE, 10, seed=1)
    executor = VectorizedExecutor(model, make_clients([4, 4]))
    with pytest.raises(UnknownClientError, match="7"):
        executor.run(get_flat_params(model), [(7, 0)], SPECS["plain"])
    with pytest.raises(ConfigError, match="shape"):
        executor.run(torch.zeros(3), [(0, 0)], SPECS["plain"])


# --- executor selection ----------------------------------------------------------------------


def test_auto_picks_vectorized_for_linear_models_and_pool_or_serial_for_the_rest():
    image = (1, 28, 28)
    assert select_executor(build_model("logreg", image, 10, seed=0), cpus=2) == "vectorized"
    assert select_executor(build_model("mlp", image, 10, seed=0), cpus=1) == "vectorized"
    cnn = build_model("cnn", image, 10, seed=0)
    assert select_executor(cnn, cpus=2) == "pool"
    assert select_executor(cnn, cpus=1) == "serial"
    dropout_mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.Dropout(), nn.Linear(32, 10))
    assert select_executor(dropout_mlp, cpus=2) == "pool"


def test_make_executor_builds_the_selected_kind():
    clients = make_clients([4, 4])
    logreg = build_model("logreg", SHAPE, 10, seed=0)
    assert isinstance(make_executor(logreg, clients), VectorizedExecutor)
    assert isinstance(make_executor(logreg, clients, "serial"), SerialExecutor)
    cnn = build_model("cnn", (1, 28, 28), 10, seed=0)
    assert isinstance(make_executor(cnn, clients, "auto", num_workers=1), SerialExecutor)
    with make_executor(cnn, clients, "auto", num_workers=2) as pool:  # workers start lazily
        assert isinstance(pool, WorkerPoolExecutor)
        assert pool.num_workers == 2
    with pytest.raises(ConfigError, match="available: auto, serial, vectorized, pool"):
        make_executor(logreg, clients, "threads")
    dropout = nn.Sequential(nn.Flatten(), nn.Dropout(), nn.Linear(36, 10))
    with pytest.raises(ConfigError, match="Dropout"):
        make_executor(dropout, clients, "vectorized")


# --- worker pool -----------------------------------------------------------------------------

CNN_SHAPE = (1, 28, 28)
CNN_SPEC = LocalTrainingSpec(epochs=2, lr=0.05, batch_size=8, momentum=0.5, weight_decay=1e-4)


@pytest.fixture(scope="module")
def cnn_federation():
    model = build_model("cnn", CNN_SHAPE, 10, seed=3)
    clients = make_clients([20, 5, 13], shape=CNN_SHAPE, seed=4)
    tasks = [(2, 11), (0, 12), (1, 13)]
    reference = SerialExecutor(model, clients).run(get_flat_params(model), tasks, CNN_SPEC)
    return model, clients, tasks, reference


@pytest.fixture(scope="module")
def cnn_pool(cnn_federation):
    model, clients, _, _ = cnn_federation
    with WorkerPoolExecutor(model, clients, num_workers=2) as pool:
        yield pool


@pytest.mark.slow
def test_pool_matches_serial_to_rounding_and_repeats_bit_for_bit(cnn_federation, cnn_pool):
    # Prepare
    model, _, tasks, reference = cnn_federation
    # Execute
    first = cnn_pool.run(get_flat_params(model), tasks, CNN_SPEC)
    second = cnn_pool.run(get_flat_params(model), tasks, CNN_SPEC)
    # Assert: one thread and channels-last change rounding only; repeats are exact
    assert [u.client_id for u in first] == [2, 0, 1]
    assert_updates_close(first, reference, rel=1e-5)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(first, second, strict=True))
    assert [a.train_loss for a in first] == [b.train_loss for b in second]


@pytest.mark.slow
def test_a_started_pool_has_every_worker_up_before_its_first_run(cnn_federation):
    """A worker's start is setup: ``Federation.start`` starts them before a method's clock."""
    model, clients, tasks, _ = cnn_federation
    with WorkerPoolExecutor(model, clients, num_workers=2) as pool:
        pids = pool.start()
        assert len(pids) == 2
        assert os.getpid() not in pids
        assert len(pool.run(get_flat_params(model), tasks, CNN_SPEC)) == len(tasks)


def test_pool_with_nchw_workers_is_bit_identical_to_one_thread_serial(cnn_federation):
    model, clients, tasks, _ = cnn_federation
    with torch_threads(1):
        reference = SerialExecutor(model, clients).run(get_flat_params(model), tasks, CNN_SPEC)
    with WorkerPoolExecutor(model, clients, num_workers=1, channels_last=False) as pool:
        updates = pool.run(get_flat_params(model), tasks, CNN_SPEC)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(updates, reference, strict=True))
    assert [a.train_loss for a in updates] == [b.train_loss for b in reference]


@pytest.mark.slow
def test_pool_rejects_unknown_clients(cnn_federation, cnn_pool):
    model, _, _, _ = cnn_federation
    with pytest.raises(UnknownClientError, match="99"):
        cnn_pool.run(get_flat_params(model), [(99, 0)], CNN_SPEC)


class ExitingModel(nn.Module):
    """Ends its process abruptly in forward, like a segfault or the OOM killer would."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(36, 10)

    def forward(self, x):
        os._exit(17)


@pytest.mark.slow
def test_pool_raises_clear_error_when_a_worker_dies_and_stays_closed():
    # Prepare
    model = ExitingModel()
    clients = make_clients([10, 10])
    params, spec = get_flat_params(model), SPECS["plain"]
    before = set(multiprocessing.active_children())
    pool = WorkerPoolExecutor(model, clients, num_workers=2)
    # Execute / Assert: an error, not a hang; then the pool refuses work and leaves no process
    with pytest.raises(FedUnlearnError, match="worker process .* died while training client"):
        pool.run(params, tasks_for(clients), spec)
    with pytest.raises(FedUnlearnError, match="died earlier"):
        pool.run(params, tasks_for(clients), spec)
    pool.close()
    assert not (set(multiprocessing.active_children()) - before)


@pytest.mark.slow
def test_pool_raises_when_an_idle_worker_was_killed():
    model = build_model("logreg", SHAPE, 10, seed=0)
    clients = make_clients([10, 10])
    params, spec = get_flat_params(model), SPECS["plain"]
    before = set(multiprocessing.active_children())
    with WorkerPoolExecutor(model, clients, num_workers=2) as pool:
        pool.run(params, tasks_for(clients), spec)
        workers = set(multiprocessing.active_children()) - before
        assert workers
        victim = next(iter(workers))
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        with pytest.raises(FedUnlearnError, match="died"):
            for _ in range(50):  # the pool notices the death asynchronously, within moments
                pool.run(params, tasks_for(clients), spec)
                time.sleep(0.1)


PARENT_SCRIPT = """
import multiprocessing, os, signal, torch
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.pool import WorkerPoolExecutor
from fedunlearn.fl.records import ClientData
from fedunlearn.models import build_model, get_flat_params

if __name__ == "__main__":
    model = build_model("logreg", (4,), 2, seed=0)
    data = {0: ClientData(torch.rand(4, 4), torch.zeros(4, dtype=torch.int64))}
    pool = WorkerPoolExecutor(model, data, num_workers=1)
    pool.run(get_flat_params(model), [(0, 0)], LocalTrainingSpec())
    print(*[p.pid for p in multiprocessing.active_children()], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def is_running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_pool_workers_exit_when_the_parent_process_is_killed(tmp_path):
    # Prepare: a parent process that starts a pool, prints its workers' pids and is SIGKILLed
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    # Execute
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    # Assert
    pids = [int(pid) for pid in done.stdout.split()]
    assert done.returncode == -signal.SIGKILL
    assert pids
    deadline = time.monotonic() + 15
    while any(map(is_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(is_running, pids))


def test_pool_refuses_to_run_after_close():
    model = build_model("logreg", SHAPE, 10, seed=0)
    with WorkerPoolExecutor(model, make_clients([4]), num_workers=1) as pool:
        pass  # no run: no worker was started
    with pytest.raises(FedUnlearnError, match="closed"):
        pool.run(get_flat_params(model), [(0, 0)], SPECS["plain"])
    with pytest.raises(ConfigError, match="num_workers"):
        WorkerPoolExecutor(model, make_clients([4]), num_workers=0)
