"""The Ray connection every wing uses: training, batch inference, serving, sweeps and the SST
ensemble connect (or start a local Ray) the same way, so one rule says where a command runs.

Where: ``address`` (a config's ``ray.address``), else ``$RAY_ADDRESS``, else a local Ray started
by this process.  Quiet unless ``verbose``: :func:`pipelines.console.ray_init_kwargs`.  A Ray
started here keeps its idle worker processes (:data:`WORKER_POOL_CONFIG`) and, started without
its dashboard, records a free port of its own as dashboard (:func:`headless_kwargs`), never
another Ray's (why: ``docs/pipeline-notes.md``).

Once connected: :func:`worker_resources` sizes a training worker from the cluster (checked by
:func:`preflight`), and :func:`configure_ray_data` sets this process's Ray Data context.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

from pipelines import console
from pipelines.config import ConfigError

__all__ = ["WORKER_POOL_CONFIG", "worker_pool_env", "headless_kwargs", "connect_ray", "worker_resources", "preflight", "configure_ray_data"]

logger = logging.getLogger("pipelines.cluster")

#: Ray system config for the worker pool of a Ray this project starts (``ray.init``'s
#: ``_system_config``; ``ray start --system-config``): up to ``num_workers_soft_limit`` idle workers
#: are kept for reuse, and idle ones beyond that live ``idle_worker_killing_time_threshold_ms``.
#: Each worker imports torch once instead of once per task burst; an idle one costs its memory.
#: Pass ``dict(WORKER_POOL_CONFIG)``, never this dict: ``ray.init`` (Ray 2.60) writes its session's
#: ``object_spilling_config`` into the dict it is given, and the next ``ray.init`` of the process
#: handed that dict would spill into the last session's directory and warn that "the object
#: spilling config is specified from an unstable API".
WORKER_POOL_CONFIG: dict[str, int] = {"num_workers_soft_limit": 32, "idle_worker_killing_time_threshold_ms": 600_000}


def worker_pool_env() -> dict[str, str]:
    """:data:`WORKER_POOL_CONFIG` as the ``RAY_<name>`` environment variables a ``ray start``
    (or any Ray process) reads, e.g. ``{"RAY_num_workers_soft_limit": "32", ...}``."""
    return {f"RAY_{k}": str(v) for k, v in WORKER_POOL_CONFIG.items()}


def headless_kwargs() -> dict[str, Any]:
    """``ray.init`` arguments for a local Ray without its dashboard: ``include_dashboard=False``
    and ``dashboard_port``, a port free now on 127.0.0.1.

    Why the port: such a Ray still records an API-server address, ``127.0.0.1:8265`` unless told
    otherwise, and Ray Train's placement-group cleaner (Ray 2.60) asks that address, through the
    state API, whether the run's controller actor is alive.  When another Ray on the machine
    has its dashboard on 8265, that dashboard answers "no such actor", and the cleaner removes the
    run's placement group: the workers die with "Destroying worker since its placement group was
    removed" a second after they start (seen beside a second local Ray).  At a port nobody
    listens on the query fails, and the cleaner keeps watching."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"include_dashboard": False, "dashboard_port": port}


def connect_ray(address: Optional[str] = None, verbose: bool = False, **init_kwargs: Any) -> bool:
    """Connect to Ray at ``address`` (else ``$RAY_ADDRESS``) or start a local one, unless Ray is
    already initialised in this process.  Returns True when this call started or connected it
    (the caller then calls ``ray.shutdown()`` when done), False when it was already up.
    ``init_kwargs`` go to ``ray.init`` on top of the quiet defaults; a local Ray also gets
    ``_system_config=WORKER_POOL_CONFIG`` unless ``init_kwargs`` names one (either passed as a
    copy: see :data:`WORKER_POOL_CONFIG`), and with ``include_dashboard=False`` a
    ``dashboard_port`` of its own (:func:`headless_kwargs`)."""
    import ray

    if address is not None and not isinstance(address, str):
        raise TypeError(f"connect_ray: address must be a Ray address string (ray.address), got {type(address).__name__}")
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    logger.info("connecting to Ray at %s" % address if address else "starting a local Ray")
    if not address:
        system_config = init_kwargs.get("_system_config", WORKER_POOL_CONFIG)
        init_kwargs["_system_config"] = None if system_config is None else dict(system_config)
        if init_kwargs.get("include_dashboard") is False and "dashboard_port" not in init_kwargs:
            init_kwargs.update(headless_kwargs())
    ray.init(address=address or None, **{**console.ray_init_kwargs(verbose), **init_kwargs})
    return True


def worker_resources(ray_cfg: Mapping[str, Any]) -> dict[str, float]:
    """The CPU (and GPU) each training worker reserves, per a config's ``ray`` section
    (``num_workers``, ``cpus_per_worker``: None sizes it from the cluster, leaving Ray Data at
    least one CPU; ``use_gpu``), checked against the cluster (:func:`preflight`) unless
    ``wait_for_resources``.  Ray must be connected."""
    import ray

    world = ray_cfg["num_workers"]
    res = ray.cluster_resources()
    cpus = float(res.get("CPU", 1))
    per = ray_cfg["cpus_per_worker"]
    if per is None:
        # Leave at least one CPU to Ray Data; fractional CPUs are fine for the workers.
        per = 1.0 if cpus - world >= 1 else max(0.1, round((cpus - 1) / world, 2))
        if cpus <= 1:
            per = max(0.1, round(cpus / (2 * world), 2))
    out = {"CPU": per}
    if ray_cfg["use_gpu"]:
        out["GPU"] = 1
    if not ray_cfg["wait_for_resources"]:
        preflight(out, world, res)
    return out


def preflight(per_worker: Mapping[str, float], world: int, cluster: Mapping[str, float]) -> None:
    """Fail in seconds, before any data or training work, when the cluster (``ray.cluster_resources()``)
    can never hold ``world`` training workers of ``per_worker`` resources: a GPU asked for where
    the cluster has none or too few, or more CPUs than it has.  Raises :class:`ConfigError`
    naming the key, the value, what the cluster has and the fix (``ray.wait_for_resources=true``
    waits for a cluster that will grow instead)."""
    gpus = float(cluster.get("GPU", 0))
    if per_worker.get("GPU"):
        need = world * per_worker["GPU"]
        if gpus < need:
            raise ConfigError(
                f"true asks for {need:g} GPU(s) ({world} worker(s) x {per_worker['GPU']:g}) but the Ray cluster has "
                f"{gpus:g}; set ray.use_gpu=false, fewer ray.num_workers, or ray.wait_for_resources=true for a "
                "cluster that will add GPU nodes", "ray.use_gpu")
    cpus = float(cluster.get("CPU", 0))
    need = world * per_worker["CPU"]
    if need > cpus + 1e-9:
        raise ConfigError(
            f"{world} workers x {per_worker['CPU']:g} CPUs = {need:g} CPUs, but the Ray cluster has {cpus:g}; "
            "lower ray.num_workers or ray.cpus_per_worker, or set ray.wait_for_resources=true for a cluster that "
            "will grow", "ray.num_workers")


def configure_ray_data(cfg: Mapping[str, Any]) -> None:
    """Set this process's Ray Data context for ordered, reproducible execution
    (``preserve_order``), ``ray.no_progress_timeout_s`` and ``data.progress_bars``; call before
    any dataset is created."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_no_progress_timeout_s = cfg["ray"]["no_progress_timeout_s"]
    ctx.execution_options.preserve_order = True  # step order must be reproducible
    bars = cfg["data"]["progress_bars"]
    ctx.enable_progress_bars = bool(bars)
