"""The baselines the papers are judged against, one module each (the ``baselines`` plugin).

``none`` (the original model), ``retrain`` (FedAvg from M_0 without the forgotten clients),
``federaser`` (Liu et al., IWQoS 2021), ``fedrecover`` (Cao et al., S&P 2023), ``random``
(calibrated replay of random rounds, Starfish's baseline). ``plugin`` declares them; a module is
imported when its method is first looked up by name. Design notes: docs/methods/baselines.md.
"""
