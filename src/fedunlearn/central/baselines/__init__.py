"""The centralised baselines Mini-Unlearning is judged against (the ``central_baselines`` plugin).

``deltagrad`` (Wu et al., ICML 2020), ``certified_removal`` (Guo et al., ICML 2020),
``amnesiac`` (Graves et al., AAAI 2021) and ``retrain`` (the reference rows ``original``,
``replay``, ``retrain``), one module each; ``plugin`` declares them (entry point
``central_baselines``), and a module is imported when its method is first looked up by name.
Design notes: docs/methods/central_baselines.md.
"""
