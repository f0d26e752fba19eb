"""The centralised methods, one module each; importing this package registers them."""

from fedunlearn.central.methods import (  # noqa: F401
    amnesiac,
    certified_removal,
    deltagrad,
    mini_unlearning,
    retrain,
)
