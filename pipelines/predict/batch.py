"""Batch inference on Ray Data: a logged model (:mod:`pipelines.model.mlflow_model`) over files of
raw inputs, written as Parquet: ``python -m pipelines.predict --model runs:/<run_id>/model
--input 'data/*.txt' 'more/*.csv.gz' --output preds/``.

Inputs: text files (an input a line: PTB trees, SMILES) and CSV files (``.csv``, ``.csv.gz``; a
header; the model's input column, or ``column``).  Output: ``part-<task>-<block>.parquet`` in
``--output``, in input order, streamed (bounded memory); columns ``path``, ``line`` (``file:line``;
a CSV's header is line 1), ``input``, the predictor's and ``error`` (null, or the reason with null
predictions: a bad row is kept and counted, never fatal).  Blank lines are skipped and counted
(:class:`BlankLines`).  The counts and the throughput are printed and logged as an MLflow run in
experiment ``predict`` (``--no-tracking``: none).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import os
import sys
import time
import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from pipelines.cluster import connect_ray
from pipelines.console import configure, private_local_token
from pipelines.datadir import probe_writable
from pipelines.metrics import logged_value
from pipelines.model.mapping import map_model
from pipelines.model.stored import download_package, predictor_of
from pipelines.model.prediction import DEFAULT_CHUNK_SIZE

__all__ = ["PredictResult", "predict_rows", "SUCCESS_FILE", "resolve_inputs", "output_files", "check_output",
           "LOCK_FILE", "lock_output", "BlankLines", "PartNames", "written_counts",
           "input_rows", "actor_pool_size", "run", "main"]

#: CPUs kept free of actors for the read tasks (a Ray Data read task reserves one CPU)
READ_CPUS = 1.0


@dataclass(frozen=True)
class PredictResult:
    """What :func:`run` did: counts, seconds, throughput, where the Parquet files are, the MLflow run."""

    rows: int
    bad: int
    blank: int
    seconds: float
    output: str
    run_id: Optional[str] = None
    #: seconds from the start until the first batch was predicted (Ray Data's start, the actors
    #: loading the model); None when no batch was predicted
    startup_s: Optional[float] = None
    #: seconds from the first batch's start to the last batch's end (the model loaded)
    predict_s: Optional[float] = None

    @property
    def per_second(self) -> float:
        """Rows per second over the whole run, start-up included."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_per_second(self) -> float:
        """Rows per second once the model was loaded (the speed the benchmarks report)."""
        return self.rows / self.predict_s if self.predict_s else 0.0


def resolve_inputs(patterns: Sequence[str]) -> list[str]:
    """The files that ``patterns`` (paths or globs) name, sorted and absolute; raises
    ``FileNotFoundError`` with one line, ``<pattern, absolute>: missing; ...``, naming the first
    pattern that matches no file."""
    files: list[str] = []
    for pattern in patterns:
        found = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
        if not found:
            given = os.path.expanduser(pattern)
            path = os.path.abspath(given)
            if os.path.isdir(path):
                raise FileNotFoundError(f"{path}: a directory, not an input file; give its files "
                                        f"(--input '{os.path.join(given, '*.txt')}')")
            if os.path.islink(path):
                raise FileNotFoundError(f"{path}: a symbolic link that leads to no file (a loop, or its target "
                                        f"{os.readlink(path)!r} is missing)")
            where = "" if os.path.isabs(given) else f" (a relative one is taken from {os.getcwd()})"
            raise FileNotFoundError(f"{path}: missing; put the file there or "
                                    f"give --input paths or globs that exist{where}")
        files += [os.path.abspath(p) for p in found]
    return files


#: written into ``--output`` when every row is there (a directory without it holds partial output)
SUCCESS_FILE = "_SUCCESS"


def output_files(output: str) -> list:
    """The files an earlier run wrote into ``output``: its Parquet parts and :data:`SUCCESS_FILE`."""
    return sorted(glob.glob(os.path.join(output, "part-*.parquet"))
                  + glob.glob(os.path.join(output, SUCCESS_FILE)))


def check_output(output: str, overwrite: bool = False) -> None:
    """Raise ``ValueError`` with one line when the local directory ``output`` cannot take a file
    (``<output, absolute>: not writable (<reason>); ...``; what it made for the check is removed
    again: :func:`pipelines.datadir.probe_writable`), or holds an earlier run's output and not
    ``overwrite`` (its rows would be read back with the new ones)."""
    try:
        probe_writable(output)
    except OSError as err:
        raise ValueError(f"{os.path.abspath(output)}: not writable ({type(err).__name__}: {err.strerror or err}); "
                         "give --output a directory this user can write") from None
    earlier = output_files(output)
    if earlier and not overwrite:
        state = "complete" if os.path.exists(os.path.join(output, SUCCESS_FILE)) else "partial (no _SUCCESS)"
        raise ValueError(f"{os.path.abspath(output)}: holds the output of an earlier run ({len(earlier)} file(s), "
                         f"{state}); give a new --output, or --overwrite to replace it")


#: the lock file a run holds in ``--output`` while it writes there (:func:`lock_output`)
LOCK_FILE = ".pipelines-predict.lock"


def lock_output(output: str):
    """An open file holding an exclusive lock (``flock``) on the local directory ``output`` (made
    if missing) for as long as it stays open; raises ``ValueError`` with one line naming the
    directory and the process holding it when another run writes there (two runs into one
    folder would mix their rows, and one's ``--overwrite`` would delete the other's parts).
    The holder removes the file (:data:`LOCK_FILE`) before closing it."""
    import fcntl

    os.makedirs(output, exist_ok=True)
    f = open(os.path.join(output, LOCK_FILE), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise ValueError(f"{os.path.abspath(output)}: another pipelines.predict ({holder}) is writing into it; "
                         f"wait for it to finish, or give another --output") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


#: the rows every input file is read into (:func:`input_rows`)
INPUT_SCHEMA = (("path", "string"), ("line", "int64"), ("text", "string"), ("error", "string"))


class PredictClock:
    """Ray actor: when the predictor actors' batches started and ended (wall clock), so the run
    reports its start-up apart from its steady-state speed."""

    def __init__(self):
        self.first: Optional[float] = None
        self.last: Optional[float] = None

    def add(self, start: float, end: float) -> None:
        self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)

    def span(self) -> tuple:
        return self.first, self.last


class BlankLines:
    """Ray actor: the blank lines the read tasks left out, per (file, first line of a batch), so
    that a task Ray runs again counts its batch once."""

    def __init__(self):
        self.per_batch: dict = {}

    def add(self, key: tuple, n: int) -> None:
        self.per_batch[key] = n

    def total(self) -> int:
        return int(sum(self.per_batch.values()))


def _rows_table(path: str, lines: list, texts: list, errors: list, blanks: list, counter):
    """The input rows of one batch, its blank lines left out and counted in ``counter``."""
    import pyarrow as pa
    import ray

    if any(blanks):
        ray.get(counter.add.remote((path, int(lines[0])), int(sum(blanks))))
    keep = [k for k, b in enumerate(blanks) if not b]
    types = {name: getattr(pa, t)() for name, t in INPUT_SCHEMA}
    cols = {"path": [path] * len(keep), "line": [lines[k] for k in keep], "text": [texts[k] for k in keep],
            "error": [errors[k] for k in keep]}
    return pa.table({name: pa.array(cols[name], types[name]) for name, _ in INPUT_SCHEMA})


def _line_rows(table, path: str, counter):
    """Ray Data task: a text file's lines (:func:`~pipelines.data.sources.read_lines`) -> input rows
    (UTF-8 decoded, undecodable bytes replaced; newline and a leading BOM removed)."""
    texts = [t.decode("utf-8", errors="replace").rstrip("\r\n").lstrip("\ufeff")
             for t in table.column("text").to_pylist()]
    errors = table.column("error").to_pylist()          # a line over the reader's length limit
    return _rows_table(path, table.column("line").to_pylist(), texts, errors,
                       [not t.strip() and e is None for t, e in zip(texts, errors)], counter)


def _csv_rows(table, path: str, column: str, counter):
    """Ray Data task: a CSV file's rows (:func:`~pipelines.data.sources.read_csv_columns` of
    ``column``) -> input rows; a row the reader refused or an empty field is a bad row."""
    texts, errors, blanks = [], [], []
    for fields, err in zip(table.column("fields").to_pylist(), table.column("error").to_pylist()):
        if err is None and fields is not None and fields and not fields[0].strip():
            err = f"empty {column!r} field"
        texts.append(fields[0] if err is None and fields else None)
        errors.append(None if err is None else f"CSV: {err}")
        blanks.append(err is None and not fields)
    return _rows_table(path, table.column("line").to_pylist(), texts, errors, blanks, counter)


def input_rows(path: str, column: str, counter):
    """A lazy ``ray.data.Dataset`` of one input file as rows ``path``, ``line``, ``text``, ``error``
    (:data:`INPUT_SCHEMA`): a CSV file (:func:`pipelines.data.sources.is_csv`) by its ``column``,
    any other file by lines; blank lines are left out and counted in ``counter`` (a
    :class:`BlankLines` actor).  Raises ``ValueError`` naming a CSV file whose header lacks
    ``column`` or cannot be read."""
    from pipelines.data.sources import is_csv, read_csv_columns, read_lines

    if is_csv(path):
        return read_csv_columns(path, [column]).map_batches(
            _csv_rows, batch_format="pyarrow", fn_kwargs={"path": path, "column": column, "counter": counter})
    return read_lines(path).map_batches(_line_rows, batch_format="pyarrow",
                                        fn_kwargs={"path": path, "counter": counter})


def predict_rows(predictor, batch, chunk_size: int, clock=None):
    """One batch of input rows (:func:`input_rows`, numpy format) -> its prediction rows (pandas):
    ``path``, ``line``, ``input``, the predictor's columns and ``error`` (a row the reader refused:
    null predictions, the reader's error).  The ``apply`` of :func:`pipelines.model.mapping.map_model`."""
    read_error = batch["error"]
    ok = [k for k, e in enumerate(read_error) if e is None]
    texts = batch["text"]
    start = time.time()
    frame = predictor.predict([texts[k] for k in ok], chunk_size=chunk_size)
    if clock is not None:   # waited for: the run reads the span only after every batch's call returned
        import ray

        ray.get(clock.add.remote(start, time.time()))
    if len(ok) < len(texts):
        frame.index = ok
        frame = frame.reindex(range(len(texts)))
        bad = [k for k, e in enumerate(read_error) if e is not None]
        frame.loc[bad, "error"] = [read_error[k] for k in bad]
    frame.insert(0, "input", list(texts))
    frame.insert(0, "line", batch["line"].astype(np.int64))
    frame.insert(0, "path", [str(p) for p in batch["path"]])
    return frame


class PartNames:
    """``Dataset.write_parquet``'s file names (a ``ray.data.datasource.FilenameProvider``, duck-typed
    so that this module imports no Ray): ``part-<write task>-<write uuid>...parquet``, in the
    order of the rows (the write tasks follow the dataset's order)."""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return f"part-{task_index:06d}-{write_uuid}"

    def get_filename_for_block(self, block, write_uuid: str, task_index: int, block_index: int) -> str:
        return f"part-{task_index:06d}-{block_index:06d}.parquet"

    def get_filename_for_row(self, row, write_uuid: str, task_index: int, block_index: int, row_index: int) -> str:
        return f"part-{task_index:06d}-{block_index:06d}-{row_index:06d}.parquet"


def written_counts(output: str) -> tuple[int, int]:
    """``(rows, bad rows)`` of the Parquet parts in ``output``, from their metadata and ``error``
    column alone."""
    import pyarrow.parquet as pq

    rows = bad = 0
    for path in glob.glob(os.path.join(output, "part-*.parquet")):
        errors = pq.read_table(path, columns=["error"]).column("error")
        rows += len(errors)
        bad += len(errors) - errors.null_count
    return rows, bad


def actor_pool_size(actors: Optional[int], cpus_per_actor: float, cluster_cpus: float, gpus_per_actor: float = 0.0,
                    cluster_gpus: float = 0.0) -> int:
    """The predictor actors to start on a cluster of ``cluster_cpus`` CPUs and ``cluster_gpus``
    GPUs: ``actors``, or with None as many as fit beside :data:`READ_CPUS` for the read tasks
    (and in the GPUs, for GPU actors), at least one.

    Raises ``ValueError`` naming ``--actors``, the per-actor reservation, what the cluster has
    and the values that fit, when the actors would leave the read tasks no CPU or need more GPUs
    than there are: Ray Data would start what fits and then wait for ever.
    """
    free = cluster_cpus - READ_CPUS
    fit = int(free // cpus_per_actor) if cpus_per_actor > 0 else max(1, int(cluster_cpus))
    if gpus_per_actor > 0:
        fit = min(fit, int(cluster_gpus // gpus_per_actor))
    if actors is None:
        actors = max(1, fit)
    if actors < 1:
        raise ValueError(f"--actors must be at least 1, got {actors}")
    use = f"use --actors {fit}" if fit >= 1 else "use a cluster with more of them"
    if actors * cpus_per_actor > free + 1e-9:
        raise ValueError(f"--actors {actors} x --cpus-per-actor {cpus_per_actor:g} reserve "
                         f"{actors * cpus_per_actor:g} CPUs, but the cluster has {cluster_cpus:g} and the read tasks "
                         f"need {READ_CPUS:g} beside the actors (Ray Data would wait for ever); {use}")
    if actors * gpus_per_actor > cluster_gpus + 1e-9:
        raise ValueError(f"--actors {actors} x --gpus-per-actor {gpus_per_actor:g} need {actors * gpus_per_actor:g} "
                         f"GPUs, but the cluster has {cluster_gpus:g} (Ray Data would wait for ever); {use}")
    return actors


def run(model_uri: str, inputs: Sequence[str], output: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
        actors: Optional[int] = None, cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0,
        tracking_uri: Optional[str] = None, tracking: bool = True, column: Optional[str] = None, log=print,
        overwrite: bool = False) -> PredictResult:
    """Predict every input of ``inputs`` (text files' lines, CSV files' ``column``: by default the
    model's input column) with ``model_uri``; Parquet into ``output``. Needs Ray (connects to
    ``$RAY_ADDRESS`` or starts a local instance when none is initialised).  ``actors``: the
    predictor actors, each reserving ``cpus_per_actor`` CPUs and ``gpus_per_actor`` GPUs; None:
    as many as the cluster holds (:func:`actor_pool_size`, which also refuses a pool that leaves
    the read tasks no CPU).  Checks ``inputs`` (:func:`resolve_inputs`) and ``output``
    (:func:`check_output`; ``overwrite``: an earlier run's files there are removed) first, before
    the model is fetched and before Ray starts, then hold ``output``'s lock (:func:`lock_output`)
    to the end.  :data:`SUCCESS_FILE` is written last."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    files = resolve_inputs(inputs)
    check_output(output, overwrite)   # before the model is fetched and Ray starts
    lock = lock_output(output)        # held to the end: no other run writes here meanwhile
    try:
        return _run_locked(model_uri, files, output, chunk_size=chunk_size, actors=actors,
                           cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor, tracking=tracking,
                           column=column, log=log, overwrite=overwrite)
    finally:
        with contextlib.suppress(OSError):   # removed while still held: a later run makes its own
            os.remove(lock.name)
        lock.close()


def _run_locked(model_uri: str, files: list, output: str, *, chunk_size: int, actors: Optional[int],
                cpus_per_actor: float, gpus_per_actor: float, tracking: bool, column: Optional[str], log,
                overwrite: bool) -> PredictResult:
    """:func:`run` once ``output`` is checked and locked."""
    import mlflow
    import ray
    import ray.data

    from pipelines.data.sources import csv_header, is_csv

    check_output(output, overwrite)   # again under the lock: a run that finished meanwhile left its files
    package = download_package(model_uri)
    for f in output_files(output):    # --overwrite: the earlier run's files go
        os.remove(f)
    if any(is_csv(f) for f in files):
        column = column or package.predictor().input_column
        for f in filter(is_csv, files):   # before Ray starts: a file without the column is named at once
            header = csv_header(f)
            if column not in header:
                raise ValueError(f"{f}: no column {column!r} (header: {header}); name the input column with --column")
    started = connect_ray()
    try:
        have = ray.cluster_resources()
        actors = actor_pool_size(actors, cpus_per_actor, float(have.get("CPU", 0.0)), gpus_per_actor,
                                 float(have.get("GPU", 0.0)))
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        t0 = time.perf_counter()
        blanks = ray.remote(num_cpus=0)(BlankLines).remote()
        clock = ray.remote(num_cpus=0)(PredictClock).remote()
        t0_wall = time.time()
        parts = [input_rows(path, column, blanks) for path in files]
        ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
        preds = map_model(ds, load=predictor_of, apply=functools.partial(predict_rows, chunk_size=chunk_size, clock=clock),
                          shared={"package": package}, actors=actors, num_cpus=cpus_per_actor, num_gpus=gpus_per_actor,
                          batch_size=4 * chunk_size, batch_format="numpy")
        preds.write_parquet(output, filename_provider=PartNames())
        rows, bad = written_counts(output)
        blank = ray.get(blanks.total.remote())
        seconds = time.perf_counter() - t0
        first, last = ray.get(clock.span.remote())
        with open(os.path.join(output, SUCCESS_FILE), "w") as f:
            f.write(f"{rows} rows\n")
    finally:
        if started:
            ray.shutdown()
    result = PredictResult(rows=rows, bad=bad, blank=blank, seconds=seconds, output=os.path.abspath(output),
                           startup_s=None if first is None else max(0.0, first - t0_wall),
                           predict_s=None if first is None else max(1e-9, last - first))
    speed = (f"{result.startup_s:.1f}s start-up (Ray Data, loading the model), then {result.predict_s:.3g}s "
             f"predicting at {result.steady_per_second:.3g} rows/s" if result.predict_s else "no rows predicted")
    log(f"predicted {rows} rows ({bad} bad, {blank} blank lines skipped) from {len(files)} file(s) in "
        f"{seconds:.1f}s: {speed} -> {result.output}")
    if tracking:
        from pipelines.tracking.run_metadata import ensure_experiment

        client = mlflow.MlflowClient()
        run_id = client.create_run(ensure_experiment(client, "predict"),
                                   tags={"mlflow.note.content": f"batch inference with {model_uri}"}).info.run_id
        client.log_param(run_id, "model_uri", model_uri)
        client.log_param(run_id, "inputs", json.dumps(files)[:500])
        for k, v in (("rows", rows), ("bad_rows", bad), ("blank_lines", blank), ("seconds", seconds),
                     ("rows_per_s", result.per_second), ("startup_s", result.startup_s),
                     ("predict_s", result.predict_s), ("steady_rows_per_s", result.steady_per_second),
                     ("actors", actors)):
            if v is None:
                continue
            client.log_metric(run_id, k, logged_value(v))
        client.set_terminated(run_id)
        result = dataclasses.replace(result, run_id=run_id)
        log(f"MLflow run {run_id} (experiment predict)")
    return result


def main(argv: Optional[Sequence[str]] = None) -> Optional[PredictResult]:
    """``python -m pipelines.predict`` (the module docstring): a missing input or an unwritable
    output is one line, ``pipelines.predict: <file>: ...``, and exit status 1, before Ray starts
    and before any MLflow run; None after ``--check``."""
    ap = argparse.ArgumentParser(prog="python -m pipelines.predict", description="Batch inference with a logged foldengine model on Ray Data "
                                             "(raw inputs: text lines or a CSV column; Parquet out).")
    ap.add_argument("--model", required=True, help="runs:/<run_id>/model, models:/<name>/<version>, or a path")
    ap.add_argument("--input", required=True, nargs="+",
                    help="files or globs: text (one tree / SMILES per line) or CSV (.csv, .csv.gz; a header row)")
    ap.add_argument("--column", help="the input column of CSV files (default: the model's, tree / smiles)")
    ap.add_argument("--output", required=True, help="directory for the Parquet files")
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE,
                    help=f"inputs per engine batch (default {DEFAULT_CHUNK_SIZE})")
    ap.add_argument("--actors", type=int, help="predictor actors (default: as many as the cluster's CPUs hold "
                                                "beside one CPU for reading)")
    ap.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs each actor reserves (default 1)")
    ap.add_argument("--gpus-per-actor", type=float, default=0.0)
    ap.add_argument("--tracking-uri", help="MLflow store (default MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    ap.add_argument("--no-tracking", dest="tracking", action="store_false")
    ap.add_argument("--overwrite", action="store_true", help="replace an earlier run's output in --output")
    ap.add_argument("--check", action="store_true", help="check the --input files and that --output is writable, "
                                                         "then exit: neither Ray nor an MLflow run starts")
    a = ap.parse_args(argv)
    if a.check:
        try:
            files = resolve_inputs(a.input)
            check_output(a.output, a.overwrite)
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"pipelines.predict: {err}")
        print(f"pipelines.predict: check passed: {len(files)} input file(s), --output {os.path.abspath(a.output)}")
        return None
    private_local_token()   # before Ray is imported
    configure(False)        # MLflow's and Ray's notes at WARNING
    uri = a.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    out = os.path.abspath(a.output)
    try:
        return run(a.model, a.input, a.output, chunk_size=a.chunk_size, actors=a.actors,
                   cpus_per_actor=a.cpus_per_actor, gpus_per_actor=a.gpus_per_actor, tracking_uri=uri,
                   tracking=a.tracking, column=a.column, overwrite=a.overwrite)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"pipelines.predict: {err}")
    except KeyboardInterrupt:
        parts = len(glob.glob(os.path.join(out, "part-*.parquet")))
        raise SystemExit(f"pipelines.predict: interrupted: {parts} Parquet file(s) in {out} hold partial output "
                         f"(no {SUCCESS_FILE}); rerun the same command with --overwrite") from None


if __name__ == "__main__":
    main(sys.argv[1:])
