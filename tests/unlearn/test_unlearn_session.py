import pytest

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, FedUnlearnError, HistoryError, UnknownClientError
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method


def test_unknown_client_and_everyone_are_refused(run_all):
    with UnlearnSession(run_all) as session:
        with pytest.raises(
            UnknownClientError, match="client\\(s\\) 42 not in this run \\(client ids 0..4\\)"
        ):
            session.run(make_method("retrain"), UnlearnRequest.of([1, 42]))
        with pytest.raises(ConfigError, match="cannot forget every client"):
            session.run(make_method("retrain"), UnlearnRequest.of(range(5)))
        with pytest.raises(ConfigError, match="kind must be"):
            UnlearnRequest.of([1], kind="erase")


def test_forgotten_clients_cannot_be_asked_to_train(run_all):
    with UnlearnSession(run_all) as session:
        context = session.context(UnlearnRequest.of([2]))
        assert 2 not in context.clients.ids
        with pytest.raises(FedUnlearnError, match="being forgotten"):
            context.clients.train(session.initial_params, [1, 2], 1)


def test_incomplete_run_must_be_resumed_first(tmp_path, base_config):
    class Stop:
        def on_round_end(self, record):
            if record.round == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_run(parse_config(base_config), tmp_path / "r", observers=[Stop()])
    with pytest.raises(HistoryError, match="finished 2 of 5 rounds.*--resume"):
        UnlearnSession(tmp_path / "r")


def test_retrain_excludes_the_forgotten_clients_and_removes_the_backdoor(run_all):
    with UnlearnSession(run_all) as session:
        (bad,) = session.malicious
        result = session.run(make_method("retrain"), UnlearnRequest.of([bad], "recover"))
        original = session.setup.evaluate(session.final_params)
        retrained = session.setup.evaluate(result.params)
    assert result.costs.client_participations == 4 * 5  # 4 remaining clients x 5 rounds
    assert result.costs.client_epochs == 4 * 5 * 2
    assert original["backdoor_asr"] > 0.3
    assert retrained["backdoor_asr"] < 0.1
