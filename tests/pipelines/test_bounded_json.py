"""JSON from outside with bounded nesting (:mod:`pipelines.bounded_json`): a deep document is a
named error measured without recursing, even while tracing has the recursion limit raised."""
from __future__ import annotations

import json

import pytest

from foldengine.recursion import raised_recursion_limit
from pipelines import bounded_json
from pipelines.predict.serve import RequestError, parse_request


def test_depth_counts_brackets_outside_strings_only():
    assert bounded_json.nesting_depth('{"a": [1, [2]], "b": "[[[\\"[[["}') == 3
    assert bounded_json.nesting_depth("3") == 0
    doc = {"x": [[{"y": "]]]{{{"}]], "z": "\\"}
    assert bounded_json.loads(json.dumps(doc), max_depth=4) == doc
    with pytest.raises(bounded_json.JSONTooDeep, match="nested 5 levels deep .at most 4 allowed"):
        bounded_json.loads(json.dumps([doc]), max_depth=4)


def test_bytes_in_any_json_encoding_and_decode_errors_as_json_loads():
    assert bounded_json.loads('{"a": 1}'.encode("utf-16")) == {"a": 1}
    with pytest.raises(json.JSONDecodeError):
        bounded_json.loads(b"{")


def test_a_request_nested_100000_deep_is_a_400_while_the_limit_is_raised():
    body = b"[" * 100_000 + b"]" * 100_000
    with raised_recursion_limit(1_000_000):       # as while another thread traces deep trees
        with pytest.raises(RequestError, match="nested 100000 levels deep") as err:
            parse_request(body, "tree", 5)
    assert err.value.status == 400
