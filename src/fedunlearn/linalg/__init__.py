"""Numerical building blocks shared by federated and centralised methods (compact L-BFGS)."""
