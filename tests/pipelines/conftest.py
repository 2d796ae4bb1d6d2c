"""Fixtures shared by the pipeline tests."""
from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def ray_cluster():
    """An embedded 2-CPU Ray for one test module (restarted clean, shut down afterwards)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
