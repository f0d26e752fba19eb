"""The example plugin (examples/finetune-plugin) importable by the suite without installing it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

FINETUNE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "finetune-plugin"


def finetune_class() -> Any:
    """Return the example's ``FineTune`` class, its ``src/`` appended to ``sys.path``."""
    src = str(FINETUNE_PLUGIN / "src")
    if src not in sys.path:
        sys.path.append(src)
    return importlib.import_module("fedunlearn_finetune.unlearner").FineTune
