"""Starfish arithmetic backends: the protocol, the plaintext float64 mirror and 2PC."""
