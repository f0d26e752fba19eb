"""The ``fedadp`` plugin's declaration: the method, its recording policy and its training hook.

Entry point ``fedadp`` of the group ``fedunlearn.plugins`` (pyproject.toml). The recording policy
``fedadp`` stores the noised copies of ``privacy.dp_scope: store_only``; the budget schedule
``fedadp`` is Eq. 4's ε_t for DP training (``privacy.budget.schedule``).
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="fedadp",
    methods={"fedadp": "fedunlearn.unlearn.fedadp.unlearner:FedADP"},
    policies={"fedadp": "fedunlearn.unlearn.fedadp.policy:POLICY"},
    budget_schedules={"fedadp": "fedunlearn.unlearn.fedadp.budget:BUDGET_SCHEDULE"},
)
