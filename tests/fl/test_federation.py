"""``Federation.with_local_training``: a wrapper for another local training, the original intact."""

import torch
from torch import nn

from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.models import get_flat_params

SPEC = LocalTrainingSpec(epochs=1, lr=0.1, batch_size=4)


class Recording:
    """A local training that records its tasks and returns ones."""

    name = "recording"

    def __init__(self) -> None:
        self.tasks: list[tuple[tuple[int, int], ...]] = []
        self.closed = False

    def run(self, global_params, tasks, spec, round_):
        self.tasks.append(tuple(tasks))
        return [ClientUpdate(cid, torch.ones_like(global_params), 1, 0.0) for cid, _ in tasks]

    def close(self):
        self.closed = True


def make_federation() -> Federation:
    g = torch.Generator().manual_seed(0)
    data = {c: ClientData(torch.randn(8, 3, generator=g), torch.arange(8) % 2) for c in range(3)}
    honest = {2: ClientData(torch.randn(8, 3, generator=g), torch.arange(8) % 2)}

    def double(round_, global_params, updates):
        return [ClientUpdate(u.client_id, 2 * u.delta, 1, 0.0) for u in updates]

    return Federation(
        nn.Linear(3, 2),
        data,
        SPEC,
        seed=5,
        malicious=frozenset({2}),
        update_mods=[double],
        honest_data=honest,
        attack_start_round=3,
        executor="serial",
    )


def test_the_wrapper_trains_with_its_local_training_and_leaves_the_federation_as_it_was():
    fed = make_federation()
    params = get_flat_params(fed.model)
    plain_before = fed.train(TrainTask(params, [0, 2], 1))
    recording = Recording()
    wrapped = fed.with_local_training(recording)
    out = wrapped.train(TrainTask(params, [0, 2], 1))
    assert fed.local_training is None
    assert wrapped is not fed
    assert (wrapped.client_ids, wrapped.seed, wrapped.malicious) == (
        fed.client_ids,
        fed.seed,
        fed.malicious,
    )
    # the same tasks (honest copy -1 - id before the attack round, the run's seeds), same mods
    (tasks,) = recording.tasks
    assert [cid for cid, _ in tasks] == [0, -3]
    assert [seed for _, seed in tasks] == [derive_seed(5, "client", 1, c, 0) for c in (0, 2)]
    assert all(torch.equal(u.delta, 2 * torch.ones_like(params)) for u in out)
    plain_after = fed.train(TrainTask(params, [0, 2], 1))
    assert all(
        torch.equal(a.delta, b.delta) for a, b in zip(plain_before, plain_after, strict=True)
    )
    wrapped.close()
    fed.close()
    assert recording.closed


class StartRecording:
    """An executor (structurally) that records its starts; with ``has_start=False`` it has none."""

    name = "start-recording"

    def __init__(self, has_start: bool) -> None:
        self.starts = 0
        if has_start:
            self.start = self._start

    def _start(self) -> None:
        self.starts += 1

    def run(self, global_params, tasks, spec):
        return [ClientUpdate(cid, torch.zeros_like(global_params), 1, 0.0) for cid, _ in tasks]

    def close(self) -> None:
        pass


def test_start_starts_any_executor_once_and_one_without_start_still_trains(monkeypatch):
    from fedunlearn.fl import executors

    built: list[StartRecording] = []

    def make(*args, **kwargs):
        built.append(StartRecording(has_start=len(built) == 0))
        return built[-1]

    monkeypatch.setattr(executors, "make_executor", make)
    with_start, without_start = make_federation(), make_federation()
    with_start.start()
    with_start.start()
    without_start.start()
    params = get_flat_params(with_start.model)
    assert built[0].starts == 1
    assert [u.client_id for u in without_start.train(TrainTask(params, [0, 1], 1))] == [0, 1]
    assert not hasattr(built[1], "start")
