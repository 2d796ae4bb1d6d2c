"""pipelines.data.feed.declare_feed's refusals, before any Ray Data work (no Ray needed)."""
from __future__ import annotations

import pytest

from pipelines.config import ConfigError, load_config, merged_schema
from pipelines.data.feed import declare_feed
from pipelines.data.splits import SplitSource, StreamSplits
from tests.pipelines.toy_experiment import ToyExperiment


def _declare(n_train, skipped, *overrides):
    exp = ToyExperiment()
    cfg = load_config(None, ["batch_size=4", *overrides], merged_schema(exp.config_schema))
    return declare_feed(exp, cfg, StreamSplits({"train": SplitSource(None, n_train)}, skipped), world=2)


def test_every_row_skipped_says_so_not_batch_size():
    with pytest.raises(ConfigError, match=r"config key 'data': the training split has no records: every record was skipped as "
                                          r"bad \(skipped \{'train/unparsable': 240\}"):
        _declare(0, {"train/unparsable": 240}, "data.skip_bad=true")
    with pytest.raises(ConfigError, match="config key 'data': the training split has no records: the file"):
        _declare(0, {"train/unparsable": 0})


def test_too_few_records_for_the_workers_names_batch_size():
    with pytest.raises(ConfigError, match=r"config key 'batch_size': 1 training records cannot make one step of 2 worker"):
        _declare(1, {})
