"""Text to token ids: the AG News CSV reader, a regex tokenizer and a frequency vocabulary.

The pipeline is deliberately simple and deterministic: lowercase, words ``[a-z0-9']+``, the
``vocab_size`` most frequent training tokens (ties broken alphabetically) after ``<pad>`` = 0 and
``<unk>`` = 1, every text padded with 0 or truncated to ``max_len`` ids.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path

import numpy as np

from fedunlearn.errors import ConfigError, DataFormatError

__all__ = ["PAD", "SPECIALS", "UNK", "build_vocab", "encode", "read_labelled_csv", "tokenize"]

PAD, UNK = "<pad>", "<unk>"
SPECIALS = (PAD, UNK)  # ids 0 and 1
_WORD = re.compile(r"[a-z0-9']+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase tokens matching ``[a-z0-9']+``."""
    return _WORD.findall(text.lower())


def build_vocab(token_lists: Iterable[Sequence[str]], vocab_size: int) -> list[str]:
    """Return ``["<pad>", "<unk>"]`` plus the ``vocab_size`` most frequent tokens.

    Args:
        token_lists: Tokenized training texts.
        vocab_size: Number of regular tokens kept (the result has ``vocab_size + 2`` entries
            at most, fewer if the corpus has fewer distinct tokens).

    Returns:
        The vocabulary; a token's id is its index. Frequency ties are broken alphabetically.

    Raises:
        ConfigError: ``vocab_size < 1``.
    """
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be >= 1; got {vocab_size}")
    counts = Counter(chain.from_iterable(token_lists))
    for special in SPECIALS:
        counts.pop(special, None)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [*SPECIALS, *(token for token, _ in ranked[:vocab_size])]


def encode(token_lists: Sequence[Sequence[str]], vocab: Sequence[str], max_len: int) -> np.ndarray:
    """Map tokens to ids (unknown -> 1), truncate to ``max_len`` and right-pad with 0.

    Returns:
        int64 array of shape ``(len(token_lists), max_len)``.

    Raises:
        ConfigError: ``max_len < 1``.
    """
    if max_len < 1:
        raise ConfigError(f"max_len must be >= 1; got {max_len}")
    index = {token: i for i, token in enumerate(vocab)}
    unk = index.get(UNK, 1)
    ids = np.zeros((len(token_lists), max_len), dtype=np.int64)
    for row, tokens in enumerate(token_lists):
        kept = [index.get(token, unk) for token in tokens[:max_len]]
        ids[row, : len(kept)] = kept
    return ids


def read_labelled_csv(path: Path, num_classes: int) -> tuple[list[str], np.ndarray]:
    """Read a headerless ``class index (1-based), title, description`` CSV (AG News layout).

    Title and description (and any further columns) are joined with a space.

    Returns:
        The texts and int64 labels ``class index - 1``.

    Raises:
        DataFormatError: A row has fewer than two columns or a class index outside
            ``1..num_classes``; the message names the file and line.
    """
    texts: list[str] = []
    labels: list[int] = []
    try:
        with path.open(newline="", encoding="utf-8") as stream:
            for line, row in enumerate(csv.reader(stream), start=1):
                if not row:
                    continue
                label = row[0].strip()
                if len(row) < 2 or not label.isdigit() or not 1 <= int(label) <= num_classes:
                    raise DataFormatError(
                        f"{path}, line {line}: expected 'class index (1..{num_classes}), title, "
                        f"description'; got {row[:3]!r}"
                    )
                labels.append(int(label) - 1)
                texts.append(" ".join(row[1:]))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataFormatError(f"{path}: not a UTF-8 CSV file ({exc})") from exc
    return texts, np.asarray(labels, dtype=np.int64)
