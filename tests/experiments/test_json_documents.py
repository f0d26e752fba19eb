"""The messages of the two JSON document readers (``audit --result``, ``check-receipt``).

Both read through ``read_json_file``; their one-line errors are unchanged by sharing it.
"""

from __future__ import annotations

import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.experiments.audit import read_json_file, read_result_file
from fedunlearn.experiments.receipt_check import _read_document


def test_read_json_file_returns_the_value(tmp_path):
    path = tmp_path / "v.json"
    path.write_text('[1, {"a": null}]')
    assert read_json_file(path, "v") == [1, {"a": None}]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "result file {path} does not exist"),
        ("{not json", "result file {path} is not readable JSON: Expecting property name"),
        (b"\xff\xfe", "result file {path} is not readable JSON: 'utf-8' codec"),
    ],
)
def test_result_file_errors(tmp_path, content, expected):
    path = tmp_path / "r.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_result_file(path)
    assert str(err.value).startswith(expected.format(path=path))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "{path} does not exist; pass the JSON 'unlearn --out' or 'audit' wrote"),
        ("[1,", "{path} is not readable JSON: Expecting value"),
    ],
)
def test_receipt_document_errors(tmp_path, content, expected):
    path = tmp_path / "d.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        _read_document(path)
    assert str(err.value).startswith(expected.format(path=path))
    if content is None:
        assert str(err.value) == expected.format(path=path)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist$"):
        read_result_file(tmp_path)
