"""Fixtures shared by the pipeline tests."""
from __future__ import annotations

import os

import pytest

# the tests' toy experiment exports its models (tests/pipelines/toy_experiment.py): trusted as a
# package's experiment the documented way (pipelines.model.package.EXPERIMENTS_ENV), so every toy
# run logs and reloads its model as a registered domain's does
os.environ.setdefault("FOLDENGINE_EXPERIMENTS", "tests.pipelines.toy_experiment.ToyExperiment")

from tests.shared_ray import SharedRay


@pytest.fixture(scope="module")
def ray_cluster(request):
    """An embedded 2-CPU Ray for one test module, with the worker pool a Ray started by the
    pipelines has (``pipelines.cluster.WORKER_POOL_CONFIG``): :class:`tests.shared_ray.SharedRay`,
    kept up for the next module that asks for it too when it is left idle."""
    SharedRay.ensure(request.module.__name__)
    yield


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


@pytest.fixture
def nodes():
    """Start-and-stop bookkeeping for ``tests.pipelines.two_node.RayNode`` s: every node appended
    here is stopped at teardown (and the driver disconnected), and none may leave a process."""
    import threading

    import ray
    started = []
    if ray.is_initialized():
        ray.shutdown()
    try:
        yield started
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stoppers = [threading.Thread(target=node.stop, kwargs={"grace": 5}) for node in started]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        left = {n.name: n.pids() for n in started if n.pids()}
        assert not left, f"processes left running: {left}"
