"""What a run shows on the terminal: quiet logs, one line per epoch, progress.

* :func:`configure` (driver, once, before Ray starts): ``pipelines.*`` at INFO, Ray / Ray Data /
  Ray Train / MLflow at WARNING, :data:`HARMLESS_WARNINGS` filtered, MLflow's artifact bars off
  (``verbose=True`` leaves all as the libraries set it); with :func:`private_local_token` a local
  Ray's token stays in this process's environment, not in ``~/.ray``.
* :func:`ray_init_kwargs`: ``ray.init`` arguments; workers' output not forwarded unless ``verbose``.
* :func:`epoch_line`: one line per epoch from the reported metrics (``dict[str, float]``), on the
  scale of the experiment's tables (:func:`table_scale`).
* :func:`results_text`: a results table (ours beside the references) as text.
* :class:`Heartbeat`: a phase without steps; off a terminal, ``<what> (45s)`` every ``interval_s``.
* :class:`ProgressBoard` (Ray actor) and :class:`ProgressPrinter` (driver thread): rank 0 posts
  ``(epoch, step, steps)``: a bar on a terminal, else a line every ``interval_s`` per long epoch.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from typing import Mapping, Optional, Sequence

__all__ = ["HARMLESS_WARNINGS", "STARTUP_EVERY_S", "configure", "ray_init_kwargs", "private_local_token", "epoch_line",
           "table_scale", "scaled_figure", "results_text", "Heartbeat", "ProgressBoard", "ProgressPrinter"]

#: ``(category, message regex)`` of warnings known to be harmless in these pipelines.
HARMLESS_WARNINGS: tuple[tuple[type, str], ...] = (
    (UserWarning, r"Sparse invariant checks are implicitly disabled"),
    (UserWarning, r".*Add type hints to the `predict` method"),
    (UserWarning, r"Hint: Inferred schema contains integer column"),
    (DeprecationWarning, r".*"),
    (FutureWarning, r".*"),
)
#: Ray Data warnings that describe how these pipelines work on purpose: bars off where the output
#: is no terminal (``data.progress_bars``); training workers holding the CPUs while Ray Data
#: waits for the fraction left to it (``ray.cpus_per_worker``).
RAY_DATA_EXPECTED = ("Progress bars disabled", "Warning: The Ray cluster currently does not have any available CPUs")
QUIET_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune", "mlflow", "alembic", "urllib3")


def filter_harmless_warnings() -> None:
    """Ignore :data:`HARMLESS_WARNINGS` in this process (also called in the training workers)."""
    for category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    try:  # Ray's own deprecation category does not derive from DeprecationWarning
        from ray.util.annotations import RayDeprecationWarning
        warnings.filterwarnings("ignore", category=RayDeprecationWarning)
    except ImportError:
        pass


def quiet_ray_data_console() -> None:
    """Ray Data's console handler to WARNING (its per-dataset INFO lines stay in Ray's log files)."""
    import ray.data  # noqa: F401  (configures the ray.data logger)

    for h in logging.getLogger("ray.data").handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            h.setLevel(logging.WARNING)
            h.addFilter(lambda record: not record.getMessage().startswith(RAY_DATA_EXPECTED))


def configure(verbose: bool = False) -> None:
    """Set up the driver's logging and warnings, and :func:`private_local_token` (see the module
    docstring); call first, before Ray is imported."""
    private_local_token()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if verbose:
        return
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's own "View run ... / View experiment ..." lines at each run's end: the pipelines
    # print their own links ("MLflow UI: run ...") once
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # read when mlflow is first imported
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # e.g. DDP's find_unused_parameters note
    filter_harmless_warnings()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # the pipelines log their models from their own code on purpose (see pipelines.model.mlflow_model)
    logging.getLogger("mlflow.pyfunc").addFilter(
        lambda record: "Passing a Python object as `python_model`" not in record.getMessage())
    quiet_ray_data_console()


def private_local_token() -> None:
    """Token authentication for a local Ray this process may start, without ``~/.ray``: a token
    for this process and its children only (``RAY_AUTH_TOKEN`` in the environment), unless the
    user chose (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH``, ``RAY_ADDRESS``);
    with an existing ``~/.ray/auth_token`` token mode is set explicitly (Ray's notice about it
    stays away).  Left to itself Ray writes a token into ``~/.ray`` and warns.  Must run before
    ``ray`` is imported: Ray reads its auth mode once per process."""
    chosen = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
    if any(k in os.environ for k in chosen) or "ray" in sys.modules:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if not os.path.exists(os.path.expanduser("~/.ray/auth_token")):
        import secrets

        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def ray_init_kwargs(verbose: bool = False) -> dict:
    """Keyword arguments for ``ray.init`` (see the module docstring)."""
    if verbose:
        return {}
    return {"log_to_driver": False, "logging_level": logging.WARNING}


def table_scale(layout, key_metrics: Sequence[str]) -> float:
    """The scale (``layout.scale``: 100 for percent) of the experiment's tables
    (:class:`pipelines.experiment.TableLayout`, its ``sweep_layout()``) when every one of
    ``key_metrics`` is a column of them (``best/<split>/<metric>``), else 1: the epoch line shows
    a figure on the scale the tables show it."""
    columns = [str(c).rsplit("/", 1)[-1] for c in getattr(layout, "columns", {})]
    if key_metrics and all(m in columns for m in key_metrics):
        return float(getattr(layout, "scale", 1.0))
    return 1.0


def scaled_figure(v: float, scale: float = 1.0) -> str:
    """A figure on its table's scale (:func:`table_scale`): ``45.1%`` for ``scale`` 100, else
    ``scale * v`` to 3 decimals."""
    return f"{100.0 * v:.1f}%" if scale == 100.0 else f"{scale * v:.3f}"


def epoch_line(metrics: Mapping[str, float], epochs: int, key_metrics: Sequence[str], scale: float = 1.0) -> str:
    """``epoch 2/10  31.2s  train loss/record 0.5496  dev auc 0.712 (best 0.731 @1)  812 rec/s  build 12%``.

    ``key_metrics``: metric names without split (e.g. ``("fine", "binary")``), shown for the
    dev split (train when there is none) and, for the first one, its best value so far (``@``
    the epoch of that best value).  ``scale``: what the key metrics are multiplied by, as in the
    experiment's tables (:func:`table_scale`); 100 shows them as percent (``dev fine 45.1%``).
    ``train loss/record``: the training objective, ``train/objective`` (the training split's
    loss summed over its records, divided by their number), 4 significant digits.
    """
    split = "dev" if any(k.startswith("dev/") for k in metrics) else "train"
    parts = [f"epoch {int(metrics['epoch'])}/{epochs}", f"{metrics.get('time/epoch_s', float('nan')):.1f}s",
             f"train loss/record {metrics.get('train/objective', float('nan')):.4g}"]
    shown = [f"{m} {scaled_figure(metrics[f'{split}/{m}'], scale)}" for m in key_metrics if f"{split}/{m}" in metrics]
    if shown:
        parts.append(f"{split} " + " ".join(shown))
    best_key = f"best/{split}/{key_metrics[0]}" if key_metrics else None
    if best_key and best_key in metrics and "best/epoch" in metrics:
        parts.append(f"(best {scaled_figure(metrics[best_key], scale)} @{int(metrics['best/epoch'])})")
    if "time/records_per_s" in metrics:
        parts.append(f"{metrics['time/records_per_s']:.0f} rec/s")
    if "time/build_share" in metrics:
        parts.append(f"build {100 * metrics['time/build_share']:.0f}%")
    return "  ".join(parts)


#: What :func:`results_text` shows for a cell without a value (a reference row without that figure).
MISSING_CELL = "-"


def results_text(table, max_columns: int = 6, digits: int = 4) -> str:
    """A results table (a ``pandas.DataFrame``: our row beside the references) as the terminal
    shows it: its first ``max_columns`` columns; numbers rounded to ``digits`` decimal places, a
    column's decimals aligned; a column of integers, or an epoch column (its name has ``epoch``)
    of whole numbers, as integers; a missing value (None, NaN) as :data:`MISSING_CELL`."""
    import math

    import pandas as pd

    def missing(v) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    shown = table.iloc[:, :max_columns]
    cells = {}
    for col in shown.columns:
        values = [None if missing(v) else (v.item() if hasattr(v, "item") else v) for v in shown[col].tolist()]
        present = [v for v in values if v is not None]
        if present and all(number(v) and math.isfinite(v) for v in present):
            rounded = [round(float(v), digits) for v in present]
            if all(isinstance(v, int) for v in present) or (
                    "epoch" in str(col).lower() and all(v == int(v) for v in rounded)):
                places = 0
            else:
                places = max(1, max(len(f"{v:.{digits}f}".rstrip("0").partition(".")[2]) for v in rounded))
            cells[col] = [MISSING_CELL if v is None else f"{round(float(v), digits):.{places}f}" for v in values]
        else:
            cells[col] = [MISSING_CELL if v is None else str(v) for v in values]
    return pd.DataFrame(cells, columns=list(shown.columns)).to_string(index=False)


#: Seconds between the lines of a start-up phase (Ray starting, the splits read, the workers
#: starting): a user sees what the run waits for within this time, on a terminal too.
STARTUP_EVERY_S = 10.0


class Heartbeat:
    """``with Heartbeat("reading the splits", 10):`` logs ``reading the splits (10s)``,
    ``(20s)``, ... while the block runs, when ``interval_s`` > 0 (on a terminal too: a phase of
    unknown length has no bar); nothing otherwise.  The lines come from a daemon thread, stopped
    when the block ends."""

    def __init__(self, what: str, interval_s: float, log: Optional[logging.Logger] = None):
        self.what, self.interval_s = what, float(interval_s)
        self.log = log or logging.getLogger("pipelines.training.run")
        self.active = self.interval_s > 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.log.info("%s (%.0fs)", self.what, time.monotonic() - t0)

    def __enter__(self) -> "Heartbeat":
        if self.active:
            self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class ProgressBoard:
    """What rank 0 tells the driver: its latest ``(epoch, step, steps)`` and the epoch lines;
    run as a Ray actor (``ray.remote(num_cpus=0)(ProgressBoard).remote()``)."""

    def __init__(self):
        self.state: tuple[int, int, int] = (0, 0, 0)
        self.lines: list[str] = []

    def post(self, epoch: int, step: int, steps: int) -> None:
        self.state = (int(epoch), int(step), int(steps))

    def say(self, line: str) -> None:
        self.lines.append(str(line))

    def read(self, since: int = 0) -> tuple[tuple[int, int, int], list[str]]:
        """``(state, lines[since:])``."""
        return self.state, self.lines[since:]


class ProgressPrinter:
    """A daemon thread polling a :class:`ProgressBoard` actor every ``poll_s`` seconds: it logs
    each new line, and shows the step progress as a tqdm bar per epoch when ``stream`` is a
    terminal, else as a line ``epoch 3/10: step 120/400 (30%), 45s`` every ``interval_s`` seconds
    (0: none).  ``stop()`` polls once more (the last epoch's line) and ends it."""

    def __init__(self, board, epochs: int, interval_s: float = 30.0, poll_s: float = 1.0,
                 stream=None, log: Optional[logging.Logger] = None):
        self.board, self.epochs, self.interval_s, self.poll_s = board, epochs, interval_s, poll_s
        self.stream = stream or sys.stderr
        self.log = log or logging.getLogger("pipelines.training.run")
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.seen = 0
        self._bar = None
        self._t0 = time.monotonic()
        self._epoch, self._epoch_t0, self._last_line = 0, self._t0, self._t0
        self._started = False     # a step or an epoch line was seen: no more start-up lines
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def start(self) -> "ProgressPrinter":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _loop(self) -> None:
        while True:
            stopping = self._stop.wait(self.poll_s)
            try:
                self.poll()
            except Exception:  # noqa: BLE001  (the board went away with the cluster)
                break
            if stopping:
                break
        self._close_bar()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def poll(self) -> None:
        """Read the board once; log new lines, update the bar or print a progress line."""
        import ray

        (epoch, step, steps), lines = ray.get(self.board.read.remote(self.seen), timeout=10)
        if lines:
            self._close_bar()
            for line in lines:
                self.log.info("%s", line)
            self.seen += len(lines)
            self._started = True
        now = time.monotonic()
        if not steps:  # no step yet: the workers start, the first batches are built
            every = min(self.interval_s, STARTUP_EVERY_S)
            if not self._started and every and now - self._last_line >= every:
                self._last_line = now
                self.log.info("training workers starting, first batches building (%.0fs)", now - self._t0)
            return
        self._started = True
        if step >= steps:
            return
        if epoch != self._epoch:
            self._epoch, self._epoch_t0, self._last_line = epoch, now, now
        if self.tty:
            from tqdm import tqdm

            if self._bar is None or self._bar.desc != f"epoch {epoch}/{self.epochs}":
                self._close_bar()
                self._bar = tqdm(total=steps, desc=f"epoch {epoch}/{self.epochs}", unit="step",
                                 file=self.stream, leave=False)
            self._bar.n = step
            self._bar.refresh()
        elif self.interval_s and now - self._last_line >= self.interval_s:
            self._last_line = now
            self.log.info("epoch %d/%d: step %d/%d (%.0f%%), %.0fs", epoch, self.epochs, step, steps,
                          100.0 * step / steps, now - self._epoch_t0)
