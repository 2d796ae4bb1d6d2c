"""The driver machine's CPU, memory, disk and network use (and GPU where MLflow can read it) as
the run's ``system/*`` metrics, sent through the run's :class:`pipelines.tracking.tracker.Tracker`.

MLflow's own ``SystemMetricsMonitor`` writes with a client of its own: while the tracking server
is down it blocks in HTTP retries, then stops for good, and what it sampled is lost.  Here MLflow's
samplers (``mlflow.system_metrics.metrics``) are read by a thread of ours and each sample goes to
the tracker like any metric: buffered in the run's outbox during an outage and sent when the
server answers.  Metric names are MLflow's (``system/cpu_utilization_percentage``, ...), so the
MLflow UI shows them in its system metrics tab.
"""
from __future__ import annotations

import importlib
import logging
import threading
from typing import Optional

__all__ = ["SystemMetrics", "start_system_metrics"]

logger = logging.getLogger("pipelines.tracking.system_metrics")


def _samplers() -> list:
    """MLflow's samplers that work on this machine (CPU and memory need psutil; the GPU one is
    left out where no NVIDIA/AMD library answers)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    out = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for module, name in (("gpu_monitor", "GPUMonitor"), ("rocm_monitor", "ROCMMonitor")):
        try:
            out.append(getattr(importlib.import_module(f"mlflow.system_metrics.metrics.{module}"), name)())
            break
        except Exception:  # noqa: BLE001 - no such GPU library here: no GPU metrics
            continue
    return out


class SystemMetrics:
    """Samples every ``every_s`` seconds in a daemon thread and logs ``system/<name>`` at steps
    0, 1, 2, ... through ``tracker``.  :meth:`finish` stops it and returns within
    ``finish_timeout_s`` (a sample being sent when the server hangs is left to its thread, with
    one warning).  A sampler or logging error ends the thread with one warning; the run goes on."""

    def __init__(self, tracker, every_s: float, finish_timeout_s: float = 30.0):
        self.tracker = tracker
        self.every_s = float(every_s)
        self.finish_timeout_s = float(finish_timeout_s)
        self.step = 0
        self._samplers = _samplers()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "SystemMetrics":
        self._thread = threading.Thread(target=self._loop, name="foldengine-system-metrics", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> dict[str, float]:
        """One sample of every sampler, named ``system/<name>``."""
        out: dict[str, float] = {}
        for s in self._samplers:
            s.collect_metrics()
            out.update({f"system/{k}": v for k, v in s.aggregate_metrics().items()})
            s.clear_metrics()
        return out

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.every_s):
                self.tracker.metrics(self.sample(), step=self.step)
                self.step += 1
        except Exception as e:  # noqa: BLE001 - a run without its later system metrics is still a run
            logger.warning("system metrics stopped after %d sample(s): %s: %s", self.step, type(e).__name__, e)

    def finish(self) -> None:
        """Stop sampling (idempotent); waits at most ``finish_timeout_s`` for a sample being sent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(self.finish_timeout_s)
        if self._thread.is_alive():
            logger.warning("system metrics: the last sample was still being sent after %.0fs; left to its thread",
                           self.finish_timeout_s)
        self._thread = None


def start_system_metrics(tracker, every_s: float, finish_timeout_s: float = 30.0) -> Optional[SystemMetrics]:
    """A started :class:`SystemMetrics` on ``tracker``'s run, or None when tracking is off,
    ``every_s`` is 0 or MLflow's samplers cannot run here (e.g. no psutil: one warning)."""
    if not tracker.enabled or not every_s:
        return None
    try:
        return SystemMetrics(tracker, every_s, finish_timeout_s).start()
    except Exception as e:  # noqa: BLE001  (a run without system metrics is still a run)
        logger.warning("no system metrics: %s: %s", type(e).__name__, e)
        return None
