"""2PC protocols over ``SharedTensor``: Beaver arithmetic, comparison, ordering, Newton, SecMI.

Paper: Liu et al., Starfish, App. B (Tables IV-VI), Alg. 5 and 7 (App. C, E). Where the code
departs from the paper: MPC1-MPC10 in docs/mpc.md.
"""

from fedunlearn.mpc.protocols.beaver import (
    sec_aggregate,
    sec_constant,
    sec_inner,
    sec_matmul,
    sec_mul,
    sec_mul3,
    sec_mul_many,
    sec_reveal,
    sec_select,
    sec_share,
    sec_square,
)
from fedunlearn.mpc.protocols.compare import ge_cost, sec_ge, sec_ge2, sec_ge3, sec_ge4
from fedunlearn.mpc.protocols.numeric import sec_check_range, sec_div, sec_reciprocal, sec_sqrt
from fedunlearn.mpc.protocols.ordering import Comparator, compare_first, sec_max, sec_sort
from fedunlearn.mpc.protocols.secmi import sec_inverse

__all__ = [
    "Comparator",
    "compare_first",
    "ge_cost",
    "sec_aggregate",
    "sec_check_range",
    "sec_constant",
    "sec_div",
    "sec_ge",
    "sec_ge2",
    "sec_ge3",
    "sec_ge4",
    "sec_inner",
    "sec_inverse",
    "sec_matmul",
    "sec_max",
    "sec_mul",
    "sec_mul3",
    "sec_mul_many",
    "sec_reciprocal",
    "sec_reveal",
    "sec_select",
    "sec_share",
    "sec_sort",
    "sec_sqrt",
    "sec_square",
]
