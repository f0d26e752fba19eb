"""Starfish deployment: Stage I shares, the two servers, the clients service, the launcher."""
