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

__all__ = ["DEFAULT_CHUNK_SIZE", "MAX_CHUNK_SIZE", "InputTooLarge", "Predictor", "predict_in_chunks"]

#: inputs per engine batch when the caller names none
DEFAULT_CHUNK_SIZE = 256
#: the most inputs one engine batch may hold: with each input capped (:attr:`Predictor.max_size`)
#: this bounds a call's memory whatever the number of rows
MAX_CHUNK_SIZE = 1024


class InputTooLarge(ValueError):
    """One input exceeds the predictor's size cap (atoms of a molecule, nodes of a tree); the
    message names the size, the cap and the setting that raises it.  A row error, never fatal."""


class Predictor(abc.ABC):
    """One trained model, ready to predict raw inputs (see the module docstring), in two stages:
    :meth:`parse` (one raw input -> the model's input, per input) and :meth:`run` (a list of
    parsed inputs -> their predictions, one engine batch).  :meth:`predict` is the two joined by
    :func:`predict_in_chunks`.

    Attributes:
      input_column: the name of the input column in a DataFrame (``tree``, ``smiles``).
      output_columns: the prediction columns, in order (``error`` follows them).
      int_columns: those of ``output_columns`` that are integers (pandas ``Int64``).
      options: the keyword options ``predict`` and ``run`` take besides ``chunk_size``, with
        their defaults.
      max_size: the largest input :meth:`parse` accepts, in ``size_unit`` (the training limit by
        default); a larger one is a row error (:class:`InputTooLarge`), refused before the work
        (and memory) that grows with it.  Together with ``chunk_size <= MAX_CHUNK_SIZE`` this
        bounds the memory of any call.
      size_unit: what ``max_size`` counts (``atoms``, ``nodes``).
    """

    input_column: str = "input"
    output_columns: Sequence[str] = ()
    int_columns: Sequence[str] = ()
    options: dict = {}
    max_size: int = 0
    size_unit: str = "items"

    def too_large(self, size: int, setting: str) -> InputTooLarge:
        """The row error of an input of ``size`` (> :attr:`max_size`); ``setting`` names the
        config key that sets the cap."""
        return InputTooLarge(f"{size} {self.size_unit} > the limit of {self.max_size} ({setting}; the model "
                             f"was trained on inputs within it)")

    @abc.abstractmethod
    def parse(self, raw: Any) -> Any:
        """The model's input for one raw input; raises (any exception) for a bad one, whose
        message becomes the row's ``error``."""

    @abc.abstractmethod
    def run(self, parsed: list, **options) -> Any:
        """The predictions of ``parsed`` (outputs of :meth:`parse`), one per input, in order:
        a ``pandas.DataFrame`` with :meth:`columns` or a list of one dict per input."""

    def columns(self, **options) -> list:
        """The prediction columns for ``options`` (``output_columns`` unless a subclass adds
        some)."""
        return list(self.output_columns)

    def predict(self, inputs: Sequence[Any], chunk_size: int = DEFAULT_CHUNK_SIZE,
                **options) -> "pandas.DataFrame":  # noqa: F821
        """One row per input, in order: :meth:`columns` then ``error``."""
        return predict_in_chunks(list(inputs), self.parse, lambda chunk: self.run(chunk, **options),
                                 self.columns(**options), chunk_size, int_columns=self.int_columns)


def predict_in_chunks(inputs: Sequence[Any], parse: Callable[[Any], Any],
                      run: Callable[[list], Any], columns: Sequence[str], chunk_size: int = DEFAULT_CHUNK_SIZE,
                      int_columns: Sequence[str] = ()):
    """The shared loop: ``parse(raw)`` each input (an exception marks the row bad, its message the
    row's ``error``), ``run(parsed_chunk)`` over chunks of the good rows, and the frame assembled
    in input order with nulls for bad rows.

    ``run`` returns the chunk's predictions, one per input, in order: a ``pandas.DataFrame`` with
    ``columns`` (assembled column by column, with no Python work per row), or a list of one dict
    of ``columns`` per input.  Column dtypes do not depend on which rows were bad:
    ``int_columns`` are pandas ``Int64`` (nullable), the other columns of numbers ``float64``
    (NaN when bad), other columns ``object`` (pandas' ``str`` for strings), null when bad;
    ``error`` a pandas ``string``.

    Raises ``ValueError`` for ``chunk_size < 1``, and when ``run`` returns another number of
    predictions than the inputs it was given (naming the chunk).
    """
    import pandas as pd

    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size must be in 1..{MAX_CHUNK_SIZE}, got {chunk_size}")
    n = len(inputs)
    errors: list = [None] * n
    good_idx, good = [], []
    for i, raw in enumerate(inputs):
        try:
            good.append(parse(raw))
            good_idx.append(i)
        except Exception as err:  # noqa: BLE001 - a bad row is reported, never fatal
            errors[i] = f"{type(err).__name__}: {err}"
    parts: list = []
    for a in range(0, len(good), chunk_size):
        chunk = good[a:a + chunk_size]
        out = run(chunk)
        if not isinstance(out, pd.DataFrame):
            out = pd.DataFrame.from_records(out, columns=list(columns))
        if len(out) != len(chunk):
            raise ValueError(f"the predictions of inputs {good_idx[a]}..{good_idx[a + len(chunk) - 1]}: "
                             f"{len(out)} rows for {len(chunk)} inputs")
        parts.append(out)
    rows = np.asarray(good_idx, dtype=np.int64)
    data = {c: _column([p[c].to_numpy() for p in parts], rows, n, c in int_columns) for c in columns}
    data["error"] = pd.array(errors, dtype="string")
    return pd.DataFrame(data, columns=[*columns, "error"])


def _column(pieces: list, rows: np.ndarray, n: int, is_int: bool):
    """One output column of ``n`` rows: the values of ``pieces`` (concatenated) at ``rows``,
    nulls elsewhere, typed as :func:`predict_in_chunks` says."""
    import pandas as pd

    values = np.concatenate(pieces) if pieces else np.empty(0, dtype=object)
    if is_int:
        data, mask = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
        data[rows], mask[rows] = values.astype(np.int64), False
        return pd.arrays.IntegerArray(data, mask)
    if values.dtype.kind in "biuf" or (values.dtype == object and all(
            isinstance(v, (float, int, np.floating, np.integer)) for v in values)):
        out = np.full(n, np.nan)
        out[rows] = values.astype(np.float64)
        return out
    out = np.empty(n, dtype=object)
    for i, v in zip(rows.tolist(), values.tolist() if values.dtype != object else values):
        out[i] = v
    return out
