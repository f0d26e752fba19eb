"""Plain mini-batch SGD with a recorder, and the replay / fresh retraining references.

``train_sgd`` runs ``w_l = w_{l-1} - (eta/B) sum_{j in B_l} grad F_j(w_{l-1})`` (Eq. 3) for
``T = passes * floor(N/B)`` steps (random reshuffling per pass, drop_last) and returns a
``TrainingRecord``: the batch index list of every step (ints), the pre-step iterates of the last
``keep_last`` steps (``None`` keeps all: the full-trajectory cache of DeltaGrad and Amnesiac),
optionally every batch-gradient sum (DeltaGrad), and in *paper mode* (forget set known during
training) the corrections ``G(l)`` of the last ``paper_window`` steps. Steps are 1-based; iterate
0 is ``w_0``.

``replay_retrain`` re-runs the same batches with the forgotten samples dropped (Eq. 2), the
reference of every distance; ``fresh_retrain`` trains anew on ``D_R`` with fresh batches.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", Algorithm 2 (init training with recording), Eq. 2-3, §5.1 ("Traditional Retraining").
Deviations (docs/methods/mini_unlearning.md, docs/methods/central_baselines.md):
    MU9 Post-hoc mode is the default: the recorder keeps full batch index lists and the last
    ``k (+ m)`` iterates and G is computed at request time; paper mode stores G.
    MU12 w_0 = 0, random reshuffling per pass with drop_last, float64 throughout.
    RF2 both retrainings: replay (same batches) for distances, fresh (new batches) for accuracy.
    RF3 [FIX] A step whose whole batch is forgotten is a no-op in replay retraining (Eq. 2
    divides by B - dB).
    RF4 fresh retraining draws its batches with sampler seed ``seed + 1``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.central.objectives import Objective
from fedunlearn.central.recursion import correction
from fedunlearn.errors import ConfigError, UnsupportedHistoryError

__all__ = [
    "SGDSpec",
    "TrainingRecord",
    "forget_mask",
    "fresh_retrain",
    "replay_retrain",
    "sample_batches",
    "train_sgd",
]


class SGDSpec(BaseModel):
    """Hyper-parameters of plain SGD (paper: eta = 0.01, lam in the objective).

    Attributes:
        lr: Constant learning rate eta.
        batch_size: B (every step has exactly B samples: drop_last).
        passes: Number of passes over the pool; ``T = passes * floor(N / B)``.
        seed: Seed of the batch sampler.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(0.01, gt=0)
    batch_size: int = Field(256, ge=1)
    passes: int = Field(10, ge=1)
    seed: int = Field(0, ge=0)


def sample_batches(pool: torch.Tensor, spec: SGDSpec) -> torch.Tensor:
    """Return the ``T x B`` batch index matrix: a seeded reshuffle of ``pool`` per pass.

    Raises:
        ConfigError: if the pool holds fewer than ``batch_size`` samples.
    """
    per_pass = len(pool) // spec.batch_size
    if per_pass < 1:
        raise ConfigError(
            f"batch_size {spec.batch_size} exceeds the {len(pool)} training samples; lower it"
        )
    generator = torch.Generator().manual_seed(spec.seed)
    rows = []
    for _ in range(spec.passes):
        perm = pool[torch.randperm(len(pool), generator=generator)]
        rows.append(perm[: per_pass * spec.batch_size].view(per_pass, spec.batch_size))
    return torch.cat(rows)


def forget_mask(num_samples: int, forget: torch.Tensor) -> torch.Tensor:
    """Return the boolean mask of ``D_U`` over ``0..N-1``.

    Raises:
        ConfigError: if an index is out of range.
    """
    forget = torch.as_tensor(forget, dtype=torch.int64)
    if len(forget) and (int(forget.min()) < 0 or int(forget.max()) >= num_samples):
        raise ConfigError(f"forget indices must lie in 0..{num_samples - 1}")
    mask = torch.zeros(num_samples, dtype=torch.bool)
    mask[forget] = True
    return mask


@dataclass(frozen=True, eq=False)
class TrainingRecord:
    """What training kept. Steps are 1-based: step l moves ``w_{l-1}`` to ``w_l``.

    Attributes:
        spec: The SGD hyper-parameters.
        batches: ``T x B`` int64 batch index lists (row l-1 is ``B_l``).
        first_iterate: Index of the oldest iterate kept.
        iterates: ``(T + 1 - first_iterate) x p`` float64; row i is ``w_{first_iterate + i}``.
        batch_grads: ``T x p`` sums ``sum_{B_l} grad F_j(w_{l-1})`` if cached, else None.
        corrections: Paper mode: step l -> G(l) for the last steps, computed during training.
        paper_forget: Paper mode: the forget set the corrections were computed for.
        wall_seconds: Training wall time.
    """

    spec: SGDSpec
    batches: torch.Tensor
    first_iterate: int
    iterates: torch.Tensor
    batch_grads: torch.Tensor | None = None
    corrections: dict[int, torch.Tensor] = field(default_factory=dict)
    paper_forget: torch.Tensor | None = None
    wall_seconds: float = 0.0

    @property
    def num_steps(self) -> int:
        """T."""
        return self.batches.shape[0]

    @property
    def steps_per_pass(self) -> int:
        """Steps in one pass over the pool."""
        return self.num_steps // self.spec.passes

    @property
    def final(self) -> torch.Tensor:
        """``w_T``."""
        return self.iterates[-1]

    def has_iterate(self, index: int) -> bool:
        """Whether ``w_index`` was kept."""
        return self.first_iterate <= index <= self.num_steps

    def iterate(self, index: int) -> torch.Tensor:
        """Return ``w_index``.

        Raises:
            UnsupportedHistoryError: if the recorder did not keep it.
        """
        if not self.has_iterate(index):
            raise UnsupportedHistoryError(
                f"iterate w_{index} was not recorded (kept w_{self.first_iterate}..w_"
                f"{self.num_steps}); retrain with a larger keep_last"
            )
        return self.iterates[index - self.first_iterate]

    def batch(self, step: int) -> torch.Tensor:
        """Return ``B_step`` (1-based)."""
        return self.batches[step - 1]

    def iterate_bytes(self, count: int) -> int:
        """Bytes of ``count`` stored parameter vectors."""
        return count * self.iterates.shape[1] * self.iterates.element_size()

    def batch_bytes(self, count: int) -> int:
        """Bytes of ``count`` stored batch index lists."""
        return count * self.batches.shape[1] * self.batches.element_size()


def train_sgd(
    objective: Objective,
    spec: SGDSpec,
    *,
    w0: torch.Tensor | None = None,
    pool: torch.Tensor | None = None,
    keep_last: int | None = None,
    cache_batch_grads: bool = False,
    paper_forget: torch.Tensor | None = None,
    paper_window: int = 0,
) -> TrainingRecord:
    """Train with plain SGD and record (Algorithm 2 with Deviations MU9, MU12).

    Args:
        objective: Per-sample objective (L2 included).
        spec: Learning rate, batch size, passes, sampler seed.
        w0: Initial parameters; zeros if None.
        pool: Sample indices to train on; all if None.
        keep_last: Keep the iterates ``w_{T-keep_last}..w_T``; None keeps all of them.
        cache_batch_grads: Also keep every batch-gradient sum (DeltaGrad's cache, O(T p)).
        paper_forget: Paper mode: ``D_U`` (indices) known during training.
        paper_window: Paper mode: compute and store G(l) for the last this many steps.

    Returns:
        The record.
    """
    start = time.perf_counter()
    pool = torch.arange(objective.num_samples) if pool is None else pool.to(torch.int64)
    batches = sample_batches(pool, spec)
    num_steps = batches.shape[0]
    if keep_last is not None and keep_last < 0:
        raise ConfigError(f"keep_last must be >= 0 or None; got {keep_last}")
    first = 0 if keep_last is None else max(0, num_steps - keep_last)
    w = (
        torch.zeros(objective.num_params, dtype=torch.float64)
        if w0 is None
        else w0.to(torch.float64).clone()
    )
    kept = [w.clone()] if first == 0 else []
    grads = torch.empty((num_steps, len(w)), dtype=torch.float64) if cache_batch_grads else None
    mask = None if paper_forget is None else forget_mask(objective.num_samples, paper_forget)
    corrections: dict[int, torch.Tensor] = {}
    for step in range(1, num_steps + 1):
        batch = batches[step - 1]
        grad = objective.grad_sum(w, batch)
        if grads is not None:
            grads[step - 1] = grad
        w_next = w - (spec.lr / len(batch)) * grad  # Eq. 3
        if mask is not None and step > num_steps - paper_window:
            # Paper mode (Algorithm 2 lines 8-13): G(l) from g_l and the forgotten gradients.
            corrections[step] = correction(
                objective, w, w_next, batch, batch[mask[batch]], spec.lr, batch_grad=grad
            )
        w = w_next
        if step >= first:
            kept.append(w.clone())
    return TrainingRecord(
        spec=spec,
        batches=batches,
        first_iterate=first,
        iterates=torch.stack(kept),
        batch_grads=grads,
        corrections=corrections,
        paper_forget=None if paper_forget is None else torch.as_tensor(paper_forget),
        wall_seconds=time.perf_counter() - start,
    )


def replay_retrain(
    objective: Objective,
    record: TrainingRecord,
    forget: torch.Tensor,
    *,
    w0: torch.Tensor | None = None,
    keep_steps: tuple[int, ...] = (),
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Replay the recorded batches without ``D_U`` (Eq. 2): the reference ``w*_T``.

    Args:
        objective: The training objective.
        record: The original run (only its batch lists are used).
        forget: Indices of ``D_U``.
        w0: Initial parameters; zeros if None (must match training).
        keep_steps: Also return ``w*_l`` for these l (diagnostics).

    Returns:
        ``(w*_T, {l: w*_l})``.
    """
    mask = forget_mask(objective.num_samples, forget)
    w = (
        torch.zeros(objective.num_params, dtype=torch.float64)
        if w0 is None
        else w0.to(torch.float64).clone()
    )
    wanted = set(keep_steps)
    kept = {0: w.clone()} if 0 in wanted else {}
    for step in range(1, record.num_steps + 1):
        batch = record.batch(step)
        retained = batch[~mask[batch]]
        if len(retained):  # RF3 [FIX]: an emptied batch is a no-op
            w = w - (record.spec.lr / len(retained)) * objective.grad_sum(w, retained)
        if step in wanted:
            kept[step] = w.clone()
    return w, kept


def fresh_retrain(
    objective: Objective, spec: SGDSpec, forget: torch.Tensor, *, seed: int | None = None
) -> TrainingRecord:
    """Train from ``w_0 = 0`` on ``D_R`` with fresh batches and the same passes (RF2, RF4).

    Args:
        objective: The training objective.
        spec: The original hyper-parameters.
        forget: Indices of ``D_U``.
        seed: Sampler seed; ``spec.seed + 1`` if None.

    Returns:
        A record keeping only the final iterate.
    """
    mask = forget_mask(objective.num_samples, forget)
    pool = torch.nonzero(~mask).flatten()
    fresh = spec.model_copy(update={"seed": spec.seed + 1 if seed is None else seed})
    return train_sgd(objective, fresh, pool=pool, keep_last=0)
