"""The centralised runner's forget sets and shadow models (Mini-Unlearning §5 protocol)."""

import torch

from fedunlearn.experiments.central import CentralExperiment, MethodSpec, forget_set, run_central

SMALL = dict(
    datasets=("synthetic",),
    dataset_options={"synthetic": {"num_samples": 300}},
    sgd={"lr": 0.05, "batch_size": 32, "passes": 3},
    methods=(MethodSpec(label="Original", method="original"),),
    mia_shadows=1,
    mia_samples=20,
)


def test_forget_set_depends_on_seed_and_ratio_only():
    a = forget_set(1000, 0.1, seed=4)
    assert len(a) == 100
    assert torch.equal(a, a.sort().values)
    assert len(set(a.tolist())) == 100
    assert torch.equal(a, forget_set(1000, 0.1, seed=4))
    assert not torch.equal(a, forget_set(1000, 0.1, seed=5))
    assert not torch.equal(a[:50], forget_set(1000, 0.05, seed=4))


def test_forget_set_is_the_same_with_or_without_mia_and_other_ratios():
    runs = [
        run_central(CentralExperiment(**SMALL, ratios=(0.1,), mia=False)),
        run_central(CentralExperiment(**SMALL, ratios=(0.05, 0.1), mia=True)),
    ]
    gaps = [
        [r["original_gap"] for r in doc["rows"] if r["ratio"] == 0.1 and r["label"] == "Original"]
        for doc in runs
    ]
    # the original's distance to replay retraining is a function of D_U alone
    assert gaps[0] == gaps[1]
    assert gaps[0][0] > 0


def test_shadow_models_train_as_many_passes_as_the_target():
    doc = run_central(CentralExperiment(**SMALL, ratios=(0.1,), mia=True))
    assert {r["mia_shadow_epochs"] for r in doc["rows"]} == {3}
