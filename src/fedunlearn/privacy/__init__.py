"""Differential privacy for client updates: clipping, noise, adaptive budgets and accounting."""
