"""training.device: resolution, executor choice per device, CPU results unchanged, CUDA paths.

The CUDA tests run only where torch sees a GPU and skip cleanly elsewhere.
"""

import pytest
import torch
from torch import nn

from fedunlearn import parse_config, train_run
from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.device import cuda_determinism, resolve_device
from fedunlearn.fl.executors import (
    SerialExecutor,
    executor_device,
    make_executor,
    select_executor,
)
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.metrics import accuracy_and_loss, predict_logits
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.vectorized import VectorizedExecutor
from fedunlearn.history import HistoryStore
from fedunlearn.models import build_model, get_flat_params

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU visible to torch")
SPEC = LocalTrainingSpec(epochs=2, lr=0.1, batch_size=16, momentum=0.5)


def clients(sizes=(20, 37, 5), shape=(1, 8, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        c: ClientData(torch.rand((n, *shape), generator=g), torch.randint(0, 10, (n,), generator=g))
        for c, n in enumerate(sizes)
    }


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend torch sees one CUDA GPU (for choices made before any kernel runs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


# -- resolution ------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="auto means CUDA on this machine")
def test_auto_is_the_cpu_without_cuda():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ConfigError, match="torch .* sees no CUDA GPU.*docs/install.md"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="sees no CUDA GPU"):
        Federation(
            build_model("logreg", (1, 8, 8), 10, seed=0), clients(), SPEC, seed=0, device="cuda:0"
        )


def test_unknown_device_names_are_refused():
    for bad in ("gpu", "cuda:x", "CUDA", "tpu"):
        with pytest.raises(ConfigError, match="use auto, cpu, cuda, cuda:<index> or mps"):
            resolve_device(bad)


def test_cuda_index_beyond_the_machine_is_refused(fake_cuda):
    with pytest.raises(ConfigError, match="has 1 CUDA device"):
        resolve_device("cuda:3")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)


@pytest.mark.skipif(
    getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    reason="MPS is available here",
)
def test_mps_without_apple_gpu_is_a_clear_error():
    with pytest.raises(ConfigError, match="'mps' is not available"):
        resolve_device("mps")


def test_config_validates_device_and_refuses_pool_on_a_gpu():
    assert parse_config({}).training.device == "auto"
    assert parse_config({"training": {"device": "cuda:1"}}).training.device == "cuda:1"
    with pytest.raises(ConfigError, match="training.device"):
        parse_config({"training": {"device": "gpu"}})
    with pytest.raises(ConfigError, match="executor 'pool' trains in CPU worker processes"):
        parse_config({"training": {"executor": "pool", "device": "cuda"}})


# -- executor choice on a GPU (decided before any kernel runs) ---------------------------------


def test_auto_executor_on_a_gpu_vectorises_what_it_can(fake_cuda):
    cnn = build_model("cnn", (1, 28, 28), 10, seed=0)
    dropout = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 10))
    assert select_executor(cnn, cpus=2, device="cpu") == "pool"
    assert select_executor(cnn, cpus=2, device="cuda") == "vectorized"
    assert select_executor(dropout, cpus=2, device="cuda") == "serial"


def test_pool_trains_on_the_cpu_with_auto_and_refuses_a_gpu(fake_cuda):
    model = build_model("logreg", (1, 8, 8), 10, seed=0)
    assert executor_device("pool", "auto") == torch.device("cpu")
    assert executor_device("serial", "auto") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match="cannot use device 'cuda:0'"):
        make_executor(model, clients(), "pool", device="cuda")


# -- the CPU path is unchanged -----------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="auto means CUDA on this machine")
@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_federation_device_unset_cpu_and_auto_are_bit_identical(executor):
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    start = get_flat_params(model)
    results = []
    for device in (None, "cpu", "auto"):
        kwargs = {} if device is None else {"device": device}
        with Federation(model, clients(), SPEC, seed=4, executor=executor, **kwargs) as fed:
            assert fed.device == torch.device("cpu")
            results.append(fed.train(TrainTask(start, [0, 1, 2], 1)))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a.delta, b.delta)
            assert a.train_loss == b.train_loss


def test_cpu_executor_keeps_the_clients_data_objects():
    data = clients()
    executor = SerialExecutor(build_model("logreg", (1, 8, 8), 10, seed=0), data, device="cpu")
    assert all(executor.client_data[c] is data[c] for c in data)


def test_evaluation_on_the_cpu_device_equals_the_default():
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    params = get_flat_params(model)
    data = clients(sizes=(50,))[0]
    x, y = data.x, data.y
    assert torch.equal(
        predict_logits(model, params, x), predict_logits(model, params, x, device="cpu")
    )
    assert accuracy_and_loss(model, params, x, y) == accuracy_and_loss(model, params, x, y, "cpu")


@pytest.mark.skipif(HAS_CUDA, reason="auto means CUDA on this machine")
def test_train_run_with_device_unset_cpu_and_auto_stores_the_same_bits(tmp_path):
    base = {
        "seed": 3,
        "data": {"dataset": "digits", "num_clients": 3, "max_train_samples": 300},
        "model": {"name": "mlp", "hidden": [16]},
        "training": {"rounds": 2, "batch_size": 16, "lr": 0.1, "executor": "serial"},
    }
    models = []
    for name, device in (("unset", None), ("cpu", "cpu"), ("auto", "auto")):
        cfg = {**base, "training": {**base["training"], **({"device": device} if device else {})}}
        train_run(parse_config(cfg), tmp_path / name)
        with HistoryStore.open(tmp_path / name / "history") as store:
            models.append([store.read_model(r) for r in store.rounds()])
    for other in models[1:]:
        assert all(torch.equal(a, b) for a, b in zip(models[0], other, strict=True))


def test_cuda_determinism_sets_and_restores_cudnn_flags(monkeypatch):
    cudnn = torch.backends.cudnn
    monkeypatch.setattr(cudnn, "deterministic", False)
    monkeypatch.setattr(cudnn, "benchmark", True)
    with cuda_determinism(torch.device("cuda", 0)):  # only flags: runs without a GPU
        assert cudnn.deterministic
        assert not cudnn.benchmark
    assert not cudnn.deterministic
    assert cudnn.benchmark


def test_cuda_determinism_does_nothing_off_cuda():
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    with cuda_determinism(torch.device("cpu")):
        assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == before


# -- CUDA (skipped without a GPU) --------------------------------------------------------------


@pytest.fixture
def full_fp32(monkeypatch):
    """No TF32 (cuDNN's default for convolutions on Ampere and later): compare at fp32 rounding."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@needs_cuda
@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_cuda_training_repeats_bit_for_bit_and_is_close_to_the_cpu(kind, full_fp32):
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    start = get_flat_params(model)
    tasks = [(0, 11), (1, 12), (2, 13)]
    cpu = make_executor(model, clients(), kind, device="cpu").run(start, tasks, SPEC)
    gpu = make_executor(model, clients(), kind, device="cuda")
    first, second = gpu.run(start, tasks, SPEC), gpu.run(start, tasks, SPEC)
    for a, b, ref in zip(first, second, cpu, strict=True):
        assert a.delta.device.type == "cpu"  # the engine aggregates on the CPU
        assert torch.equal(a.delta, b.delta)
        assert a.train_loss == b.train_loss
        torch.testing.assert_close(a.delta, ref.delta, rtol=0, atol=1e-4 * float(ref.delta.norm()))


@needs_cuda
def test_cuda_executors_hold_the_data_on_the_gpu_and_the_cnn_vectorises(full_fp32):
    data = clients(sizes=(40, 24), shape=(1, 28, 28))
    model = build_model("cnn", (1, 28, 28), 10, seed=0)
    serial = SerialExecutor(model, data, device="cuda")
    assert all(d.x.is_cuda and d.y.is_cuda for d in serial.client_data.values())
    vectorized = make_executor(model, data, "auto", device="cuda")
    assert isinstance(vectorized, VectorizedExecutor)
    start = get_flat_params(model)
    tasks = [(0, 1), (1, 2)]
    spec = LocalTrainingSpec(epochs=1, lr=0.01, batch_size=16)
    fast, slow = vectorized.run(start, tasks, spec), serial.run(start, tasks, spec)
    again = vectorized.run(start, tasks, spec)
    for f, s, a in zip(fast, slow, again, strict=True):
        assert torch.equal(f.delta, a.delta)
        torch.testing.assert_close(f.delta, s.delta, rtol=0, atol=1e-3 * float(s.delta.norm()))


@needs_cuda
def test_cuda_local_update_and_evaluation_match_the_cpu(full_fp32):
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    start = get_flat_params(model)
    data = clients(sizes=(30,))[0]
    on_gpu = ClientData(data.x.cuda(), data.y.cuda())
    ref = local_update(model, start, data, SPEC, seed=5)
    got = local_update(model, start, on_gpu, SPEC, seed=5)
    assert got.delta.device.type == "cpu"
    torch.testing.assert_close(got.delta, ref.delta, rtol=0, atol=1e-4 * float(ref.delta.norm()))
    acc_cpu, loss_cpu = accuracy_and_loss(model, start + ref.delta, data.x, data.y)
    acc_gpu, loss_gpu = accuracy_and_loss(model, start + ref.delta, data.x, data.y, "cuda")
    assert acc_gpu == acc_cpu
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-5)
