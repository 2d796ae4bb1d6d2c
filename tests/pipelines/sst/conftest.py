"""Fixtures shared by the SST tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """Private cache dir (shared by the SST test modules of one session)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FOLD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fold-cache"))
        yield
