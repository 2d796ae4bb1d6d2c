"""pipelines.cluster: a local Ray started without its dashboard records a port of its own as its
API-server address, never the default 8265 that another Ray's dashboard on the machine may hold
(Ray Train's placement-group cleaner asks that address whether a run's controller is alive)."""
from __future__ import annotations

import socket

import pytest

from pipelines.cluster import headless_kwargs

DEFAULT_DASHBOARD_PORT = 8265


def test_headless_kwargs_name_no_dashboard_and_a_free_port():
    kw = headless_kwargs()
    assert kw["include_dashboard"] is False and kw["dashboard_port"] != DEFAULT_DASHBOARD_PORT
    with socket.socket() as s:                      # free when handed out
        s.bind(("127.0.0.1", kw["dashboard_port"]))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_local_ray_without_dashboard_answers_state_queries_at_its_own_address(monkeypatch):
    import ray
    from ray.dashboard.utils import get_address_for_submission_client
    from ray.util.state import get_actor
    from ray.util.state.exception import RayStateApiException

    from pipelines.cluster import connect_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    assert connect_ray(include_dashboard=False, num_cpus=1)
    try:
        gcs = ray.get_runtime_context().gcs_address
        url = get_address_for_submission_client(gcs)
        assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) != DEFAULT_DASHBOARD_PORT, url
        # nobody answers there: "unavailable" (the cleaner keeps watching), never another Ray's
        # "no such actor" (the cleaner would remove the run's placement group)
        with pytest.raises(RayStateApiException):
            get_actor("ff" * 16, address=gcs, timeout=5)
    finally:
        ray.shutdown()


def test_connect_ray_hands_ray_a_copy_of_the_worker_pool_config(monkeypatch):
    """``ray.init`` writes its session's ``object_spilling_config`` into the ``_system_config`` it
    is given (Ray 2.60, ``Node.validate_external_storage``); handed the module's dict, the next
    local Ray of the process would spill into the last session's directory and warn "The object
    spilling config is specified from an unstable API"."""
    import ray

    from pipelines import cluster

    given = []

    def fake_init(address=None, _system_config=None, **kwargs):   # what Ray does to the dict
        given.append(dict(_system_config))
        _system_config["object_spilling_config"] = '{"type": "filesystem", "params": {"directory_path": "/tmp/x"}}'

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    before = dict(cluster.WORKER_POOL_CONFIG)
    assert cluster.connect_ray() and cluster.connect_ray(num_cpus=1)
    assert given == [before, before] and cluster.WORKER_POOL_CONFIG == before
