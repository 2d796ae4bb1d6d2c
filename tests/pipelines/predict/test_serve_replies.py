"""The serving deployment's request and reply helpers, without Ray: one JSON body per request cut
from one conversion of the batch's frame, the same records as converting each request's rows;
strict JSON (null for missing numbers); the request formats and their limits; Serve's INFO lines
kept off the console while the command starts it."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipelines.predict.serve import RequestError, parse_request, records_json, split_records_json


def _strict(name):
    raise ValueError(f"not strict JSON: {name}")


def test_one_body_per_request_equals_converting_each_requests_rows():
    frame = pd.DataFrame({"label": pd.array([3, None, 1, 0], dtype="Int64"),
                          "prob_0": [0.1234567891234, np.nan, 1e-9, 0.5],
                          "error": [None, 'ValueError: "quoted" \\ text', None, None]})
    bodies = split_records_json(frame, [1, 2, 0, 1])
    assert len(bodies) == 4
    start = 0
    for n, body in zip([1, 2, 0, 1], bodies):
        got = json.loads(body, parse_constant=_strict)
        want = json.loads(records_json(frame.iloc[start:start + n].reset_index(drop=True)), parse_constant=_strict)
        assert got == want
        start += n
    second = json.loads(bodies[1])["predictions"]
    assert second[0] == {"label": None, "prob_0": None, "error": 'ValueError: "quoted" \\ text'}
    assert second[1]["label"] == 1 and second[1]["prob_0"] == pytest.approx(1e-9)
    assert json.loads(bodies[2]) == {"predictions": []}
    with pytest.raises(ValueError, match="sizes add up to 3, the frame has 4 rows"):
        split_records_json(frame, [1, 2])


def test_request_formats_and_limits():
    assert parse_request(b'{"dataframe_records": [{"tree": "a"}, {"tree": "b"}]}', "tree", 5) == ["a", "b"]
    assert parse_request(b'{"dataframe_split": {"columns": ["x", "tree"], "data": [[1, "a"]]}}', "tree", 5) == ["a"]
    assert parse_request(b'{"inputs": {"tree": ["a"]}}', "tree", 5) == ["a"]
    assert parse_request(b'{"instances": "a"}', "tree", 5) == ["a"]
    with pytest.raises(RequestError, match="3 rows in one request > the limit of 2"):
        parse_request(b'{"inputs": ["a", "b", "c"]}', "tree", 2)
    with pytest.raises(RequestError, match="not JSON"):
        parse_request(b"nope", "tree", 2)


def test_serves_start_lines_are_quiet_and_its_warnings_stay():
    import logging

    from pipelines.predict import serve as serve_command   # its start lines only: nothing is served here

    quiet_serve_start = serve_command.quiet_serve_start
    serve_log = logging.getLogger("ray.serve")
    level = serve_log.level
    with quiet_serve_start():
        assert not serve_log.isEnabledFor(logging.INFO) and serve_log.isEnabledFor(logging.WARNING)
    assert serve_log.level == level
