"""Fixtures shared by the pipeline tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """An embedded 2-CPU Ray for one test module (restarted clean, shut down afterwards)."""
    import ray
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_data_ordered(ray_cluster):
    """Ray Data as the pipeline runs it (ordered, no progress bars) with a 120 s stall
    timeout, so that a hang fails the test instead of waiting 30 minutes."""
    import ray.data
    ctx = ray.data.DataContext.get_current()
    ctx.execution_no_progress_timeout_s = 120
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield
