"""Mini-Unlearning (the ``mini_unlearning`` plugin): unroll the last k SGD steps (Eq. 10).

``unlearner`` (the ``mini_unlearning`` central method, its parameters and ``window_steps``),
``plugin`` (the declaration of what the package contributes: entry point ``mini_unlearning``).
The recursion and HVP oracles it unrolls with are the centralised core's (``central.recursion``,
``central.hvp``). Names are imported on first use, so reading the declaration does not load the
package. Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High
Unlearning Ratios", §4. Design notes and every deviation: docs/methods/mini_unlearning.md.
"""

from __future__ import annotations

from fedunlearn.exports import by_module, lazy_exports

_EXPORTS = by_module(
    {
        "fedunlearn.central.mini_unlearning.unlearner": (
            "MiniUnlearning",
            "MiniUnlearningParams",
            "window_steps",
        ),
    }
)

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
