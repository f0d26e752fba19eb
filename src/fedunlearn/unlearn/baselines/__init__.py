"""The baselines the papers are judged against, one module each (importing registers them).

``none`` (the original model), ``retrain`` (FedAvg from M_0 without the forgotten clients),
``federaser`` (Liu et al., IWQoS 2021), ``fedrecover`` (Cao et al., S&P 2023), ``random``
(calibrated replay of random rounds, Starfish's baseline). Design notes:
docs/methods/baselines.md.
"""

from fedunlearn.unlearn.baselines import federaser, fedrecover, none, random, retrain  # noqa: F401
