"""own_app: a Flower App of its own (PyTorch quickstart shape) recorded by fedunlearn."""
