"""The public API of fedunlearn.mpc: every exported name imports, the docstring example runs."""

from __future__ import annotations

import textwrap

import numpy as np

import fedunlearn.mpc as mpc


def test_every_exported_name_imports():
    missing = [name for name in mpc.__all__ if not hasattr(mpc, name)]
    assert missing == []
    required = {
        "FixedPoint",
        "SharedTensor",
        "Dealer",
        "InProcessTransport",
        "TcpTransport",
        "sec_mul",
        "sec_matmul",
        "sec_inner",
        "sec_ge",
        "sec_max",
        "sec_sort",
        "sec_div",
        "sec_inverse",
        "sec_sqrt",
        "sec_select",
    }
    assert required <= set(mpc.__all__)


def test_package_docstring_example_runs():
    # Prepare: the first literal block (indented lines after "::") of the package docstring
    lines = []
    for line in mpc.__doc__.split("::", 1)[1].splitlines()[1:]:
        if line and not line.startswith("    "):
            break
        lines.append(line)
    namespace: dict = {}
    # Execute
    exec(compile(textwrap.dedent("\n".join(lines)), "<docstring>", "exec"), namespace)
    # Assert
    assert namespace["bit"] == 0.0  # 0.5^2 + 1 < 0.25^2 + 4
    assert namespace["best"] == 0.25**2 + 4
    assert namespace["costs"]["online"]["rounds"] > 0
    assert np.isclose(namespace["best"], 4.0625)
