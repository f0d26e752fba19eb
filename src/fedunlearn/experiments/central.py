"""Centralised comparison runner: datasets x ratios x seeds x methods -> Tables 1-3 analogues.

``run_central`` trains one recorded SGD run per (dataset, seed), then for each unlearning ratio
draws ``D_U``, computes the replay and fresh retraining references and runs every configured
method, scoring test accuracy, the L2 distance to replay retraining (absolute and relative to
the original gap), shadow-model MIA precision/recall/AUC on ``D_U`` and on an equal-size sample
of ``D_R``, wall time against retraining and stored bytes. Rendering (``tables.md``, CSV,
plots) is ``fedunlearn.report.central``.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §5 (Tables 1-3).
Deviations:
    [REC] The Original (no unlearning) row, distances and times are added (RF1 in
    docs/methods/central_baselines.md, EV10 in docs/evaluation.md); the MIA protocol, which the
    paper leaves open (§5.1), is EV6-EV9 of docs/evaluation.md: shadow LR models with the
    target's hyper-parameters (and as many passes over their data as the target made over its
    own) on half of the test set, the other half as non-members, balanced evaluation, precision
    at equal priors, plus AUC.
    [FIX] Each forget set D_U is drawn from (seed, ratio) alone, and the attacked samples from
    (seed, ratio, purpose): the same seed and ratio give the same D_U whether or not the MIA
    runs and whatever other ratios are in the list (they shared one generator before).
    [REC] The run lives here, not in ``central``, because it uses ``eval`` (above ``central``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.central import SGDSpec, SoftmaxRegression, make_method, replay_retrain, train_sgd
from fedunlearn.data.datasets import load_dataset
from fedunlearn.eval.mia import ShadowAttack, ShadowSpec
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.models.linear import LogisticRegression

__all__ = ["CentralExperiment", "MethodSpec", "default_methods", "forget_set", "run_central"]


class MethodSpec(BaseModel):
    """One row of the tables: a label, a registered method and its hyper-parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    method: str
    params: dict[str, Any] = Field(default_factory=dict)


def default_methods(k_ablation: bool = True) -> list[MethodSpec]:
    """Return the paper's rows plus the k variants (MU8, MUV9: docs/methods/mini_unlearning.md)."""
    rows = [
        MethodSpec(label="Original", method="original"),
        MethodSpec(label="Retraining (fresh)", method="retrain"),
        MethodSpec(label="Retraining (replay)", method="replay"),
        MethodSpec(label="DeltaGrad", method="deltagrad", params={"period": 5, "burn_in": 10}),
        MethodSpec(
            label="Certified Removal",
            method="certified_removal",
            params={"l2": 0.005, "sigma": 0.01},
        ),
        MethodSpec(label="Amnesiac", method="amnesiac"),
        MethodSpec(label="Mini-Unl. k=10 steps", method="mini_unlearning", params={"k": 10}),
        MethodSpec(
            label="Mini-Unl. k=1 pass",
            method="mini_unlearning",
            params={"k": 1, "k_unit": "passes"},
        ),
        MethodSpec(
            label="Mini-Unl. k=10 passes",
            method="mini_unlearning",
            params={"k": 10, "k_unit": "passes"},
        ),
        MethodSpec(label="Mini-Unl. k=T", method="mini_unlearning", params={"k_unit": "all"}),
        MethodSpec(
            label="Mini-Unl. k=10 steps L-BFGS",
            method="mini_unlearning",
            params={"k": 10, "hvp": "lbfgs"},
        ),
    ]
    if k_ablation:
        rows += [
            MethodSpec(label=f"Mini-Unl. k={k} steps", method="mini_unlearning", params={"k": k})
            for k in (2, 4, 6, 8)
        ]
    return rows


class CentralExperiment(BaseModel):
    """What to run.

    Attributes:
        datasets: Registry names (``mnist``, ``digits``, ``covtype_like``, ...).
        data_dir: Data directory for file datasets.
        dataset_options: Per-dataset loader options.
        max_train: Subsample the training split to this many samples (seeded), if set.
        l2: lam of the per-sample objective (paper 0.005).
        sgd: SGD hyper-parameters (paper eta = 0.01); ``seed`` is replaced by each run seed.
        ratios: Unlearning ratios.
        seeds: Run seeds (batch order, forget set, shadow models).
        methods: Rows.
        mia: Run the shadow-model attack.
        mia_shadows: Number of shadow models.
        mia_samples: Cap on the attacked samples per set.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    datasets: tuple[str, ...] = ("digits",)
    data_dir: str | None = None
    dataset_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    max_train: int | None = Field(None, ge=10)
    l2: float = Field(0.005, ge=0)
    sgd: SGDSpec = SGDSpec()
    ratios: tuple[float, ...] = (0.05, 0.10, 0.15)
    seeds: tuple[int, ...] = (0,)
    methods: tuple[MethodSpec, ...] = tuple(default_methods())
    mia: bool = True
    mia_shadows: int = Field(4, ge=1)
    mia_samples: int = Field(2000, ge=10)


def _flat(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x.reshape(len(x), -1).astype(np.float64))


def _ratio_key(ratio: float) -> int:
    """Return the integer key of an unlearning ratio (parts per million) for seed derivation."""
    return round(ratio * 1_000_000)


def forget_set(num_train: int, ratio: float, seed: int) -> torch.Tensor:
    """Return D_U: ``round(ratio * num_train)`` sorted indices, drawn from (seed, ratio) alone."""
    generator = torch_generator(derive_seed(seed, "central_forget", _ratio_key(ratio)))
    return torch.randperm(num_train, generator=generator)[: round(ratio * num_train)].sort().values


def _predict(x: torch.Tensor, params: torch.Tensor, classes: int) -> torch.Tensor:
    weight = params[: classes * x.shape[1]].view(classes, -1)
    return (x @ weight.T + params[classes * x.shape[1] :]).argmax(1)


def run_central(
    cfg: CentralExperiment, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the experiment and return the results document (rows plus configuration).

    Args:
        cfg: What to run.
        progress: Called with a short status string before each step.

    Returns:
        ``{"config": ..., "rows": [...]}``; one row per dataset x seed x ratio x method.
    """
    say = progress or (lambda _msg: None)
    rows: list[dict[str, Any]] = []
    for name in cfg.datasets:
        data = load_dataset(name, data_dir=cfg.data_dir, **cfg.dataset_options.get(name, {}))
        for seed in cfg.seeds:
            rows += _run_dataset(cfg, name, data, seed, say)
    return {"config": cfg.model_dump(mode="json"), "rows": rows}


def _run_dataset(
    cfg: CentralExperiment, name: str, data: Any, seed: int, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    x, y = _flat(data.x_train), torch.from_numpy(data.y_train)
    if cfg.max_train is not None and cfg.max_train < len(y):
        keep = torch.randperm(len(y), generator=gen)[: cfg.max_train].sort().values
        x, y = x[keep], y[keep]
    x_test, y_test = _flat(data.x_test), torch.from_numpy(data.y_test)
    classes = data.num_classes
    objective = SoftmaxRegression(x, y, classes, cfg.l2)
    spec = cfg.sgd.model_copy(update={"seed": seed})
    needs_grads = any(m.method == "deltagrad" for m in cfg.methods)
    say(f"{name} seed {seed}: training ({len(y)} samples)")
    record = train_sgd(objective, spec, cache_batch_grads=needs_grads)
    template = LogisticRegression((x.shape[1],), classes)
    attack, nonmember, shadow_epochs = None, None, None
    if cfg.mia:
        say(f"{name} seed {seed}: shadow models")
        order = torch.randperm(len(y_test), generator=gen)
        pool, nonmember = order[: len(order) // 2], order[len(order) // 2 :]
        # [REC] shadows make as many passes over their data as the target made over its own
        # (matching steps instead overtrained them: their pools are smaller than D)
        training = LocalTrainingSpec(
            epochs=spec.passes,
            lr=spec.lr,
            batch_size=spec.batch_size,
            weight_decay=cfg.l2,
        )
        shadow_epochs = training.epochs
        attack = ShadowAttack.fit(
            template,
            x_test[pool].float(),
            y_test[pool],
            ShadowSpec(num_shadows=cfg.mia_shadows, training=training),
            seed,
        )
    methods = {m.label: make_method(m.method, m.params) for m in cfg.methods}
    original_pred = _predict(x_test, record.final, classes)
    out = []
    for ratio in cfg.ratios:
        forget = forget_set(len(y), ratio, seed)
        retained = torch.ones(len(y), dtype=torch.bool)
        retained[forget] = False
        start = time.perf_counter()
        reference, _ = replay_retrain(objective, record, forget)
        replay_seconds = time.perf_counter() - start
        gap = float((record.final - reference).norm())
        fresh_seconds = None
        n_attack = min(cfg.mia_samples, len(forget))
        pick = torch_generator(derive_seed(seed, "central_mia_targets", _ratio_key(ratio)))
        target_u = forget[torch.randperm(len(forget), generator=pick)[:n_attack]]
        kept_idx = torch.nonzero(retained).flatten()
        target_r = kept_idx[torch.randperm(len(kept_idx), generator=pick)[:n_attack]]
        for spec_row in cfg.methods:
            say(f"{name} seed {seed} ratio {ratio:.2f}: {spec_row.label}")
            result = methods[spec_row.label].unlearn(objective, record, forget)
            is_window = spec_row.method == "mini_unlearning"
            if spec_row.method == "retrain":
                fresh_seconds = result.wall_seconds
            dist = float((result.params - reference).norm())
            predicted = _predict(x_test, result.params, classes)
            row: dict[str, Any] = {
                "dataset": name,
                "seed": seed,
                "ratio": ratio,
                "label": spec_row.label,
                "method": spec_row.method,
                "num_train": len(y),
                "num_params": objective.num_params,
                "num_steps": record.num_steps,
                "test_accuracy": float((predicted == y_test).to(torch.float64).mean()),
                "agree_original": float((predicted == original_pred).to(torch.float64).mean()),
                "dist_replay": dist,
                "original_gap": gap,
                "relative_dist": dist / gap if gap > 0 else float("nan"),
                "wall_seconds": result.wall_seconds,
                "replay_seconds": replay_seconds,
                "train_seconds": record.wall_seconds,
                "stored_bytes": result.stored_bytes,
                "gradient_evals": result.gradient_evals,
                # the window Mini-Unlearning unrolled (its details; None for other methods)
                "k_steps": result.details.get("k_steps") if is_window else None,
                "details": result.details,
            }
            row["mia_shadow_epochs"] = shadow_epochs
            if attack is not None and nonmember is not None:
                params32 = result.params.float()
                for tag, target in (("unl", target_u), ("ret", target_r)):
                    non = nonmember[: len(target)]
                    mia = attack.evaluate(
                        params32, x[target].float(), y[target], x_test[non].float(), y_test[non]
                    )
                    row[f"mia_{tag}_precision"] = mia.precision
                    row[f"mia_{tag}_recall"] = mia.recall
                    row[f"mia_{tag}_auc"] = mia.auc
            out.append(row)
        for row in out[-len(cfg.methods) :]:
            row["fresh_seconds"] = fresh_seconds
            base = fresh_seconds if fresh_seconds else replay_seconds
            row["time_vs_retrain"] = row["wall_seconds"] / base if base else None
    return out


# --- tables and plots ----------------------------------------------------------------------
