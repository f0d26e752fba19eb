"""Starfish's options: the algorithm's hyperparameters, and how one run executes them.

``StarfishParams`` is the algorithm, in the paper's symbols: the selection rate sigma, the
tolerance rate alpha, the interval rate beta, the buffer size B, the SecRS method, TD^1 or TD^2,
the SecUE estimator, the update units. ``StarfishExecution`` is how a run carries it out: the
arithmetic backend (the float64 plaintext mirror or two 2PC servers), the working precision
(dtype, fixed-point bits), the 2PC comparison mode, seeds, timeouts, the public range hints of
the Newton iterations, and what to keep for diagnostics. Execution options never change which
rounds, flags or updates the algorithm asks for; they change where it runs and with what
rounding error (docs/methods/starfish.md, "Algorithm and execution").

A method is built from one flat mapping (``make_method("starfish", {...})``, the CLI's
``--param key=value``): ``split_options`` sends each key to the model that owns it.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. IV (Alg. 1-4), Sec. VI-A (defaults sigma = 0.6, alpha = 0.4, beta = 0.1), App. B (fixed
point). Deviations: docs/methods/starfish.md (tags SF1-SF24 cited in the field descriptions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from fedunlearn.unlearn.base import MethodParams

__all__ = ["EXECUTION_KEYS", "StarfishExecution", "StarfishParams", "split_options"]


class StarfishParams(MethodParams):
    """Starfish's algorithm hyperparameters (paper symbols in the descriptions)."""

    selection_rate: float = Field(0.6, gt=0, le=1, description="sigma: T' = ceil(sigma T)")
    tolerance_rate: float = Field(0.4, ge=0, le=1, description="alpha: threshold quantile (SF10)")
    interval_rate: float = Field(0.1, gt=0, le=1, description="beta: T_c = ceil(beta T)")
    buffer_size: int = Field(2, ge=1, le=64, description="B: curvature pairs per client")
    warmup_rounds: int | None = Field(
        None, ge=0, le=1_000_000, description="K_w: first selected rounds exact; None = B (SF6)"
    )
    final_rounds: int = Field(0, ge=0, le=1_000_000, description="optional final tuning (SF20)")
    unlearning_rate: float | None = Field(
        None, gt=0, le=1e6, description="eta_u; None = eta_l (SF13)"
    )
    round_selection: Literal["method1", "method2", "alt_method1", "alt_method2", "auto"] = Field(
        "method1", description="SecRS: Alg. 1 Method 1 or 2, App. C alt; auto by T_delta (SF12)"
    )
    threshold_mode: Literal["td2", "td1"] = Field(
        "td2", description="per-client SecMax (td2) or one global SecSrt threshold (td1)"
    )
    estimator: Literal["compact", "two_loop"] = Field(
        "compact", description="SecUE: compact L-BFGS G_r + B v, or the literal H^-1 G_r (SF4)"
    )
    correction_index: Literal["round", "counter"] = Field(
        "round", description="correct when r mod T_c == 0 (round) or k mod T_c == 0 (SF8)"
    )
    curvature_check: bool = Field(False, description="secret s^T y > 0 check, 1 bit opened (SF20)")
    units: Literal["gradient", "delta"] = Field(
        "gradient", description="G = -delta / eta_l (gradient) or G = -delta (SF1)"
    )


class StarfishExecution(MethodParams):
    """How a Starfish run executes its algorithm: backend, precision, seeds, timeouts."""

    backend: Literal["plain", "mpc"] = Field(
        "plain", description="plain float64 mirror, or 2PC (two servers, in-process threads)"
    )
    precision: Literal["float64", "model"] = Field(
        "float64", description="dtype of the plaintext mirror: float64, or the run's (SF21)"
    )
    frac_bits: int = Field(
        16, ge=8, le=24, description="2PC fixed-point fractional bits f (paper: 13; SF21)"
    )
    comparison: Literal["real", "ideal"] = Field(
        "real",
        description="2PC SecGE: real GMW circuit, or ideal functionality (in-process cost "
        "sweeps only; refused by every deployment)",
    )
    mpc_seed: int | None = Field(
        None, ge=0, description="in-process 2PC dealer and client-mask seed; None: fresh"
    )
    mpc_timeout_seconds: float = Field(120.0, gt=0, le=86_400, description="2PC receive timeout")
    norm_range: tuple[float, float] = Field(
        (1e-3, 1e3), description="public bounds on update norms: SecDiv / sqrt range hints (SF11)"
    )
    record_models: bool = Field(False, description="keep M_hat of every round (Theorem 1)")


EXECUTION_KEYS = frozenset(StarfishExecution.model_fields)


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split one flat mapping of Starfish options into (algorithm, execution) mappings.

    Keys of ``StarfishExecution`` go to the second mapping, every other key (unknown ones
    included, so that validation names them) to the first.
    """
    algorithm = {k: v for k, v in options.items() if k not in EXECUTION_KEYS}
    execution = {k: v for k, v in options.items() if k in EXECUTION_KEYS}
    return algorithm, execution
