from fedunlearn.experiments.central import CentralExperiment, MethodSpec, run_central
from fedunlearn.report.central import central_markdown, write_central


def test_run_central_with_mia_and_tables(tmp_path):
    cfg = CentralExperiment(
        datasets=("synthetic",),
        dataset_options={"synthetic": {"num_samples": 400}},
        sgd={"lr": 0.05, "batch_size": 32, "passes": 3},
        ratios=(0.1,),
        methods=(
            MethodSpec(label="Original", method="original"),
            MethodSpec(label="Retraining (fresh)", method="retrain"),
            MethodSpec(label="Mini-Unl. k=T", method="mini_unlearning", params={"k_unit": "all"}),
        ),
        mia_shadows=1,
        mia_samples=20,
    )
    doc = run_central(cfg)
    rows = {r["label"]: r for r in doc["rows"]}
    assert rows["Original"]["relative_dist"] == 1.0
    assert rows["Mini-Unl. k=T"]["relative_dist"] < 0.1
    assert rows["Mini-Unl. k=T"]["k_steps"] == rows["Original"]["num_steps"]
    assert 0.0 <= rows["Original"]["mia_unl_auc"] <= 1.0
    assert rows["Original"]["agree_original"] == 1.0
    text = central_markdown(doc)
    assert "Table 2 analogue" in text and "Mini-Unl. k=T" in text
    paths = write_central(doc, tmp_path)
    assert paths["csv"].read_text().startswith("dataset,seed,ratio")
