"""The receipt's thresholds: one frozen pydantic model (calibrated in docs/verification.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.errors import ConfigError

__all__ = ["VerificationThresholds"]


class VerificationThresholds(BaseModel):
    """Thresholds of the receipt's checks (defaults calibrated in docs/verification.md).

    Every "excess" is the judged model's value minus the reference's: Retrain's when a Retrain
    reference exists, otherwise the stated fallback.

    Attributes:
        backdoor_warn: Excess backdoor ASR (absolute, in [0, 1]) above which the backdoor check
            warns.
        backdoor_fail: Excess backdoor ASR above which it fails (the backdoor visibly survives).
        mia_auc_warn: Excess membership AUC (each attack against the same attack on Retrain;
            the fallback reference is chance, 0.5) above which the membership check warns.
        mia_auc_fail: Excess membership AUC above which it fails.
        mia_warn_z: The excess must also exceed this many standard errors of the AUC on the
            attacked sample sizes (Hanley-McNeil) to warn: sampling noise is not a trace.
        mia_fail_z: Standard errors the excess must exceed to fail.
        distance_pass: Relative distance ``||u - r|| / ||o - r||`` at or below which the
            distance check passes when no band of independent exact retrains was measured.
        distance_toward: Position along the line from Retrain (0) to the original (1),
            ``<u - r, o - r> / ||o - r||^2``, at or above which the distance check warns when
            fewer than 3 exact retrains were measured; the cap of a measured line otherwise.
        distance_unchanged: If the model moved less than this share of the original-to-Retrain
            gap away from the original, the distance check fails: it is still the original.
        bound_tolerance: Relative slack when comparing an observed distance with a certified
            bound (float rounding).
        marker_warn: Excess marker rate over the clean reference (Retrain's rate, else the
            model's rate for never-embedded decoy patterns) above which the markers check
            warns; it must also exceed 3 binomial standard errors.
        marker_fail: Excess marker rate above which it fails (and 4 standard errors).
        utility_warn: Test accuracy drop (absolute) below the reference above which the
            utility check warns.
        utility_fail: Drop above which it fails.
        deletion_on_forget: Verdict when a deletion request (``kind == "forget"``) leaves the
            forgotten clients' updates in the store: ``warn`` or ``fail``.
        method_warning: Verdict of a method's own warnings: ``warn`` or ``fail``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backdoor_warn: float = Field(0.05, ge=0, le=1)
    backdoor_fail: float = Field(0.10, ge=0, le=1)
    mia_auc_warn: float = Field(0.05, ge=0, le=0.5)
    mia_auc_fail: float = Field(0.10, ge=0, le=0.5)
    mia_warn_z: float = Field(3.0, ge=0)
    mia_fail_z: float = Field(4.0, ge=0)
    distance_pass: float = Field(0.5, gt=0, lt=1)
    distance_unchanged: float = Field(0.1, ge=0, le=1)
    distance_toward: float = Field(0.4, gt=0, lt=1)
    bound_tolerance: float = Field(1e-6, ge=0)
    utility_warn: float = Field(0.02, ge=0, le=1)
    utility_fail: float = Field(0.05, ge=0, le=1)
    marker_warn: float = Field(0.05, ge=0, le=1)
    marker_fail: float = Field(0.10, ge=0, le=1)
    deletion_on_forget: Literal["warn", "fail"] = "warn"
    method_warning: Literal["warn", "fail"] = "warn"

    def model_post_init(self, _context: Any) -> None:
        """Check each warn threshold is at most its fail threshold."""
        for name in ("backdoor", "mia_auc", "utility", "mia", "marker"):
            suffix = "_z" if name == "mia" else ""
            warn = getattr(self, f"{name}_warn{suffix}")
            fail = getattr(self, f"{name}_fail{suffix}")
            if warn > fail:
                raise ConfigError(
                    f"verification thresholds: {name}_warn{suffix} ({warn}) must not exceed "
                    f"{name}_fail{suffix} ({fail}); lower the warn level or raise the fail level"
                )
