from __future__ import annotations

import numpy as np
import pytest

from fedunlearn.data import load_dataset
from fedunlearn.data.text import build_vocab, encode, tokenize
from fedunlearn.errors import ConfigError, DataFormatError


def test_tokenize_lowercases_and_keeps_apostrophes_and_digits():
    assert tokenize("Wall St.'s Bears, 2004-Claw!") == ["wall", "st", "'s", "bears", "2004", "claw"]


def test_build_vocab_ranks_by_frequency_then_alphabet_after_specials():
    tokens = [["b", "a", "c", "c"], ["a", "b", "d"], ["<pad>"]]

    vocab = build_vocab(tokens, vocab_size=3)

    assert vocab == ["<pad>", "<unk>", "a", "b", "c"]  # a, b, c tie at 2; d (1) is cut


def test_build_vocab_rejects_non_positive_size():
    with pytest.raises(ConfigError, match="vocab_size must be >= 1; got 0"):
        build_vocab([["a"]], vocab_size=0)


def test_encode_maps_unknown_to_1_truncates_and_pads_with_0():
    vocab = ["<pad>", "<unk>", "a", "b"]

    ids = encode([["a", "zzz", "b", "a"], ["b"]], vocab, max_len=3)

    assert ids.dtype == np.int64
    assert ids.tolist() == [[2, 1, 3], [3, 0, 0]]


def test_ag_news_loads_ids_labels_and_vocab(tmp_path, write_ag_news, ag_rows):
    write_ag_news(tmp_path)

    ds = load_dataset("ag_news", data_dir=tmp_path, download=False, max_len=12)

    assert (ds.kind, ds.input_shape, ds.num_classes) == ("text", (12,), 4)
    assert ds.x_train.shape == (5, 12)
    assert ds.x_test.shape == (2, 12)
    assert ds.x_train.dtype == np.int64
    assert ds.y_train.tolist() == [int(row[0]) - 1 for row in ag_rows["train"]]
    vocab = ds.meta["vocab"]
    assert vocab[:2] == ["<pad>", "<unk>"]
    assert ds.meta["vocab_size"] == len(vocab)
    # The first training text decodes back to its first 12 tokens.
    label, title, description = ag_rows["train"][0]
    expected = tokenize(f"{title} {description}")[:12]
    assert [vocab[i] for i in ds.x_train[0] if i != 0] == expected
    # "startup" occurs only in the test split, so it maps to <unk>.
    assert 1 in ds.x_test[0]


def test_ag_news_vocab_size_caps_the_vocabulary(tmp_path, write_ag_news):
    write_ag_news(tmp_path)

    ds = load_dataset("ag_news", data_dir=tmp_path, download=False, vocab_size=3)

    assert ds.meta["vocab"] == [
        "<pad>",
        "<unk>",
        "the",
        "gold",
        "chip",
    ]  # 5, 4, 3 (chip before wins)
    assert ds.x_train.max() <= 4


def test_ag_news_bad_class_index_names_file_and_line(tmp_path, write_ag_news):
    folder = write_ag_news(tmp_path)
    with (folder / "test.csv").open("a", encoding="utf-8") as stream:
        stream.write('"5","Bad","row"\n')

    with pytest.raises(DataFormatError, match="test.csv, line 3: expected 'class index \\(1..4\\)"):
        load_dataset("ag_news", data_dir=tmp_path, download=False)


def test_ag_news_rejects_bad_options(tmp_path, write_ag_news):
    write_ag_news(tmp_path)
    with pytest.raises(ConfigError, match="max_len must be >= 1"):
        load_dataset("ag_news", data_dir=tmp_path, download=False, max_len=0)
