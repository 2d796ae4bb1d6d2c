"""Gather records and lowering (``foldengine.plan``): numpy only."""
import pickle

import numpy as np

from foldengine.plan import GatherBuilder, IndexGather, RunsGather, ViewGather


def test_gather_builder_runs():
    """Few long runs of consecutive rows become a RunsGather; overlapping runs (a row read
    twice) or short runs keep the index-based gathers."""
    b = GatherBuilder({0: [10, 100, 100]})
    chunks = np.array([2] * 40 + [1] * 40)
    rows = np.concatenate([np.arange(50, 90), np.arange(0, 40)])
    spec = b.gather(0, chunks, rows)
    assert spec == RunsGather(0, ((2, 50, 40), (1, 0, 40)), 80)
    assert b.n_index_selects == 0
    twice = b.gather(0, np.array([1] * 80), np.concatenate([np.arange(40, 80), np.arange(30, 70)]))
    assert type(twice) is not RunsGather
    short = b.gather(0, np.array([1] * 80), np.arange(80)[::-1].copy())
    assert type(short) is IndexGather
    whole = b.gather(0, np.array([1] * 80), np.arange(10, 90))
    assert type(whole) is ViewGather and whole == ViewGather(0, 1, 10, 80)



def _as_plain_tuples(x):
    """Records (NamedTuples) turned into plain tuples, recursively: the pre-record format."""
    if isinstance(x, tuple):
        return tuple(_as_plain_tuples(v) for v in x)
    if isinstance(x, dict):
        return {k: _as_plain_tuples(v) for k, v in x.items()}
    return x


def test_batch_records_pickle_compactly_and_round_trip():
    """A Batch's records pickle within 10% of the same data as plain tuples, and a
    round-tripped Batch computes the same outputs."""
    import random

    import torch

    from .helpers import random_tree
    from .test_executor import _pair_model

    compiler = _pair_model()
    rng = random.Random(0)
    batch = compiler.build_batch([random_tree(rng, rng.randint(1, 30)) for _ in range(50)])
    data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    plain = pickle.dumps((batch.consts, _as_plain_tuples(batch.calls), batch.step_bounds, batch.index_data,
                          _as_plain_tuples(batch.outputs), _as_plain_tuples(batch.metrics), batch.stats),
                         protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) <= 1.1 * len(plain), (len(data), len(plain))
    again = pickle.loads(data)
    assert again.calls == batch.calls and type(again.calls[0]) is type(batch.calls[0])
    with torch.no_grad():
        assert torch.equal(compiler(again), compiler(batch))
