"""``python -m fedunlearn``: the ``fedunlearn`` command (``fedunlearn.cli.main``)."""

from fedunlearn.cli.main import main

if __name__ == "__main__":  # pragma: no cover
    main()
