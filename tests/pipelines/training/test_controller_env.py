"""``pipelines.training.run.controller_env``: ``ray.poll_interval_s`` reaches Ray Train's
controller as ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (an environment variable Ray Train hands from
the driver to the controller), only while the trainer runs, and a value the user set wins."""
from __future__ import annotations

import os

from pipelines.config import BASE_SCHEMA, validate
from pipelines.training.run import POLL_INTERVAL_ENV, controller_env


def _ray_cfg(**over):
    return validate({"ray": over}, BASE_SCHEMA, source="test")["ray"]


def test_the_configured_interval_is_set_while_fitting_and_removed_after(monkeypatch):
    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    assert _ray_cfg()["poll_interval_s"] == 0.5
    with controller_env(_ray_cfg(poll_interval_s=0.25)):
        assert os.environ[POLL_INTERVAL_ENV] == "0.25"
    assert POLL_INTERVAL_ENV not in os.environ


def test_a_value_the_user_set_wins_and_stays(monkeypatch):
    monkeypatch.setenv(POLL_INTERVAL_ENV, "3")
    with controller_env(_ray_cfg(poll_interval_s=0.25)):
        assert os.environ[POLL_INTERVAL_ENV] == "3"
    assert os.environ[POLL_INTERVAL_ENV] == "3"


def test_it_is_restored_when_the_fit_fails(monkeypatch):
    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    try:
        with controller_env(_ray_cfg()):
            raise RuntimeError("fit failed")
    except RuntimeError:
        pass
    assert POLL_INTERVAL_ENV not in os.environ
