"""The ``fedunlearn`` commands, one module each; every module has ``register(app)``.

``COMMANDS`` is the order ``fedunlearn --help`` lists them. A module imports no torch at its top
(the methods, the runs and the reports are imported inside the command), so listing the
commands stays quick. Adding a command: CONTRIBUTING.md, "Adding a command".
"""

from __future__ import annotations

__all__ = ["COMMANDS"]

#: The modules of ``fedunlearn``'s own commands, in the order ``--help`` lists them (the
#: ``plan``, ``check-receipt`` and ``central`` commands live in ``cli.plan``, ``cli.auditor`` and
#: ``cli.central``, registered after these).
COMMANDS = (
    "train",
    "apply",
    "info",
    "verify",
    "forget",
    "methods",
    "unlearn",
    "compare",
    "export",
    "demo",
    "audit",
)
