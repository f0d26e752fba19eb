"""Two-party computation over Z_2^64: fixed point, additive shares, dealer, transport, protocols."""
