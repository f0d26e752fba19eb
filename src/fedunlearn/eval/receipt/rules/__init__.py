"""The receipt's rules, in the order a receipt lists them (docs/verification.md, "The checks").

Each module holds one rule (``RULE``): its measurement is read from ``Evidence``, its grade is
``judge``, its applicability ``applies``; the prose is ``eval.receipt.wording``'s.
"""

from fedunlearn.eval.receipt.rules import (
    backdoor,
    bound,
    client_membership,
    deletion,
    distance,
    markers,
    membership,
    method_warnings,
    poisoning,
    utility,
)

__all__ = ["RULES"]

RULES = (
    backdoor.RULE,
    membership.RULE,
    client_membership.RULE,
    markers.RULE,
    poisoning.RULE,
    distance.RULE,
    bound.RULE,
    utility.RULE,
    deletion.RULE,
    method_warnings.RULE,
)
