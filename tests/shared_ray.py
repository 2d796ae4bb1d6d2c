"""One embedded Ray per pytest process, shared by the test modules that ask for ``ray_cluster``
(tests/pipelines/conftest.py) one after another; tests/conftest.py stops it for every other test."""
from __future__ import annotations

import time
from typing import Optional


class SharedRay:
    """The embedded 2-CPU Ray (``ray.init(num_cpus=2)``, with ``pipelines.cluster.WORKER_POOL_CONFIG``,
    without a dashboard: ``pipelines.cluster.headless_kwargs``)
    behind the ``ray_cluster`` fixture, shared by the test modules of one pytest process that ask
    for it one after another: a Ray start costs about 4 s and 5 core-seconds, and a kept Ray's
    workers have their imports done.  Isolation is as if each module had its own:

    * :meth:`ensure` (a module's ``ray_cluster``) reuses the Ray only when this class started it and
      every CPU is free again (no actor, task or placement group of the last module holds one,
      waiting up to ``idle_wait_s`` for those being torn down); otherwise it starts a fresh one.
    * A test that does not ask for ``ray_cluster`` starts with no Ray (autouse ``_no_leftover_ray``,
      :meth:`stop`), unless its own module's ``ray_cluster`` is up: as before, when Ray lived from
      the module's first ``ray_cluster`` test to its end.
    * The session's end stops it."""

    gcs_address: Optional[str] = None     # the Ray this class started, while it is up
    module: Optional[str] = None          # the test module whose ray_cluster last ensured it
    idle_wait_s = 10.0

    @classmethod
    def ensure(cls, module: Optional[str] = None) -> None:
        import ray

        if cls.reusable():
            cls.module = module
            return
        cls.stop()
        from pipelines.cluster import WORKER_POOL_CONFIG, headless_kwargs

        ray.init(num_cpus=2, log_to_driver=False, _system_config=dict(WORKER_POOL_CONFIG), **headless_kwargs())
        cls.gcs_address, cls.module = ray.get_runtime_context().gcs_address, module

    @classmethod
    def reusable(cls) -> bool:
        import ray

        if cls.gcs_address is None or not ray.is_initialized() or ray.get_runtime_context().gcs_address != cls.gcs_address:
            return False
        deadline = time.monotonic() + cls.idle_wait_s
        while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    @classmethod
    def stop(cls) -> None:
        """Shut down this process's Ray, whoever started it (a test found no Ray before)."""
        import ray

        cls.gcs_address = cls.module = None
        if ray.is_initialized():
            ray.shutdown()
