"""The session's two views: what a finished run is (read-only), and how its models are judged."""

import dataclasses

import pytest
import torch

import fedunlearn.unlearn as unlearn_pkg
from fedunlearn.runs import build_setup, reference_set
from fedunlearn.unlearn import EvaluationView, RunView, UnlearnSession
from fedunlearn.unlearn import views as views_module


def test_the_views_are_public_names_of_the_unlearn_package():
    assert {"RunView", "EvaluationView"} <= set(unlearn_pkg.__all__)
    assert RunView is views_module.RunView
    assert EvaluationView is views_module.EvaluationView


def test_the_run_view_is_read_only_and_holds_the_runs_public_pieces(run_all):
    with UnlearnSession(run_all) as session:
        run = session.run_view
        assert isinstance(run, RunView)
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.final_params = torch.zeros(1)
        with pytest.raises(TypeError):
            run.client_sizes[0] = 1
        assert run.client_ids == (0, 1, 2, 3, 4)
        assert run.client_sizes == {c: session.federation.num_samples(c) for c in run.client_ids}
        assert run.malicious == session.federation.malicious
        assert len(run.malicious) == 1
        assert run.spec == session.federation.spec
        assert torch.equal(run.final_params, run.store.read_model(run.config.training.rounds))
        assert not run.store.writable


def test_the_evaluation_view_judges_like_the_runs_setup(run_all):
    with UnlearnSession(run_all) as session:
        evaluation = session.evaluation
        assert isinstance(evaluation, EvaluationView)
        setup = build_setup(session.run_view.config)
        params = session.run_view.final_params
        assert evaluation.evaluate(params) == setup.evaluate(params)
        assert evaluation.trigger is not None  # the run is backdoored
        assert evaluation.target_label == session.run_view.config.attack.target_label
        (bad,) = session.run_view.malicious
        clean, poisoned = evaluation.clean_data(bad), session.federation.client_data[bad]
        assert torch.equal(clean.y, setup.clean_data(bad).y)
        assert not torch.equal(clean.x, poisoned.x)  # the trigger is not in the clean copy
        first = evaluation.reference_set(50)
        assert evaluation.reference_set(50) is first  # cached
        assert torch.equal(first.x, reference_set(setup, 50).x)
        setup.close()
