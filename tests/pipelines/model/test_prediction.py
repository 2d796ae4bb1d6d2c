"""The predictor contract (:class:`pipelines.model.prediction.Predictor`): ``predict`` is ``parse`` per
input joined to ``run`` per chunk; bad rows get their error and nulls, never fail the call; the
columns and their dtypes follow the options."""
from __future__ import annotations

import pandas as pd
import pytest

from pipelines.model.prediction import DEFAULT_CHUNK_SIZE, Predictor


class WordLengths(Predictor):
    input_column = "word"
    output_columns = ["length"]
    int_columns = ("length",)
    options = {"upper": False}

    def __init__(self):
        self.chunks = []

    def columns(self, upper: bool = False) -> list:
        return ["length", "upper"] if upper else ["length"]

    def parse(self, raw):
        if not raw:
            raise ValueError("empty word")
        return raw

    def run(self, parsed, upper: bool = False):
        self.chunks.append(len(parsed))
        out = {"length": [len(w) for w in parsed]}
        if upper:
            out["upper"] = [w.upper() for w in parsed]
        return pd.DataFrame(out)


def test_predict_joins_parse_and_run_in_chunks_and_reports_bad_rows():
    p = WordLengths()
    out = p.predict(["ab", "", "cde", "f", "", "gh"], chunk_size=2)
    assert p.chunks == [2, 2]                                   # the 4 good words, 2 per chunk
    assert list(out.columns) == ["length", "error"]
    assert out["length"].tolist() == [2, pd.NA, 3, 1, pd.NA, 2] and str(out["length"].dtype) == "Int64"
    assert out["error"].tolist() == [pd.NA, "ValueError: empty word", pd.NA, pd.NA, "ValueError: empty word", pd.NA]


def test_options_reach_run_and_choose_the_columns():
    out = WordLengths().predict(["ab", "", "c"], upper=True)
    assert list(out.columns) == ["length", "upper", "error"]
    assert out["upper"][0] == "AB" and pd.isna(out["upper"][1]) and out["upper"][2] == "C"


def test_the_default_chunk_is_one_engine_batch_of_default_size():
    p = WordLengths()
    p.predict(["w"] * (DEFAULT_CHUNK_SIZE + 1))
    assert p.chunks == [DEFAULT_CHUNK_SIZE, 1]


def test_a_predictor_without_both_stages_cannot_be_made():
    class ParseOnly(Predictor):
        def parse(self, raw):
            return raw

    with pytest.raises(TypeError, match="run"):
        ParseOnly()
