"""Prediction on raw inputs with a trained model, in one process: the contract every experiment's
predictor keeps, and the chunked loop they share.

A :class:`Predictor` takes a list of raw inputs (strings: PTB trees, SMILES) and returns a
``pandas.DataFrame`` with exactly one row per input, in order: its prediction columns and an
``error`` column (``None`` for a good row; for a bad row the reason, and null predictions).  A
bad row never fails the call.  Good rows are batched with the engine (dynamic batching) in
chunks of ``chunk_size`` inputs.

    predictor = experiment.predictor(config, model_context, state_dict)
    frame = predictor.predict(["(3 (2 a) (3 good))", "(oops"])   # columns: label, prob_0.., error
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Predictor", "predict_in_chunks"]


class Predictor(abc.ABC):
    """One trained model, ready to predict raw inputs (see the module docstring).

    Attributes:
      input_column: the name of the input column in a DataFrame (``tree``, ``smiles``).
      output_columns: the prediction columns, in order (``error`` follows them).
      options: the keyword options ``predict`` takes besides ``chunk_size``, with their defaults.
    """

    input_column: str = "input"
    output_columns: Sequence[str] = ()
    options: dict = {}

    @abc.abstractmethod
    def predict(self, inputs: Sequence[Any], chunk_size: int = 256, **options) -> "pandas.DataFrame":  # noqa: F821
        """One row per input, in order: ``output_columns`` then ``error``."""


def predict_in_chunks(inputs: Sequence[Any], parse: Callable[[Any], Any],
                      run: Callable[[list], list], columns: Sequence[str], chunk_size: int = 256,
                      int_columns: Sequence[str] = ()):
    """The shared loop: ``parse(raw)`` each input (an exception marks the row bad, its message the
    row's ``error``), ``run(parsed_chunk) -> one dict of columns per input`` over chunks of the
    good rows, and the frame assembled in input order with nulls for bad rows.  Column dtypes do
    not depend on which rows were bad: ``int_columns`` are pandas ``Int64`` (nullable), the other
    columns of numbers ``float64`` (NaN when bad), ``error`` a pandas ``string``.

    Raises ``ValueError`` for ``chunk_size < 1``.
    """
    import pandas as pd

    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    rows: list = [None] * len(inputs)
    errors: list = [None] * len(inputs)
    good_idx, good = [], []
    for i, raw in enumerate(inputs):
        try:
            good.append(parse(raw))
            good_idx.append(i)
        except Exception as err:  # noqa: BLE001 - a bad row is reported, never fatal
            errors[i] = f"{type(err).__name__}: {err}"
    for a in range(0, len(good), chunk_size):
        for i, out in zip(good_idx[a:a + chunk_size], run(good[a:a + chunk_size])):
            rows[i] = out
    data = {c: [None if r is None else r[c] for r in rows] for c in columns}
    data["error"] = errors
    frame = pd.DataFrame(data, columns=[*columns, "error"])
    for c in columns:
        vals = [v for v in data[c] if v is not None]
        if c in int_columns:
            frame[c] = frame[c].astype("Int64")
        elif all(isinstance(v, (float, int, np.floating, np.integer)) for v in vals):
            frame[c] = frame[c].astype("float64")   # NaN for bad rows, also when every row is bad
    frame["error"] = frame["error"].astype("string")
    return frame
