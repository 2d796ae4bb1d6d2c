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
                          _as_plain_tuples(batch.outputs), _as_plain_tuples(batch.metrics), batch.stats,
                          _as_plain_tuples(batch.rows)),
                         protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) <= 1.1 * len(plain), (len(data), len(plain))
    again = pickle.loads(data)
    assert again.calls == batch.calls and type(again.calls[0]) is type(batch.calls[0])
    assert again.rows.calls == batch.rows.calls and np.array_equal(again.rows.row_index, batch.rows.row_index)
    with torch.no_grad():
        assert torch.equal(compiler(again), compiler(batch))


def test_prepared_gathers_equal_one_by_one_gathers():
    """GatherBuilder.prepare/emit (vectorised over many gathers) gives the records and the
    index buffer that gather() gives one gather at a time, on random reads covering every
    kind: views, index gathers, runs, ordered and permuted concatenations, whole chunks."""
    rng = np.random.default_rng(0)
    sizes = {0: [int(x) for x in rng.integers(1, 90, size=12)]}
    kinds = set()
    for trial in range(60):
        specs = []
        for _ in range(int(rng.integers(1, 8))):
            kind = int(rng.integers(0, 5))
            if kind == 0:      # one run in one chunk (a view), or empty
                c = int(rng.integers(0, 12))
                n = int(rng.integers(0, sizes[0][c] + 1))
                s0 = int(rng.integers(0, sizes[0][c] - n + 1))
                chunks, rows = np.full(n, c), np.arange(s0, s0 + n)
            elif kind == 1:    # long runs from several chunks (RunsGather candidates)
                parts = [(c, np.arange(0, min(40, sizes[0][c]))) for c in rng.permutation(12)[:3].tolist()]
                chunks = np.concatenate([np.full(len(r), c) for c, r in parts])
                rows = np.concatenate([r for _, r in parts])
            else:              # random rows from some chunks
                n = int(rng.integers(1, 120))
                cs = rng.integers(0, int(rng.integers(1, 13)), size=n)
                if kind == 3:
                    cs = np.sort(cs)
                chunks = cs
                rows = np.array([int(rng.integers(0, sizes[0][c])) for c in cs], np.int64)
            specs.append((chunks.astype(np.int64), rows.astype(np.int64)))
        one = GatherBuilder({0: list(sizes[0])})
        expected = [one.gather(0, c, r) for c, r in specs]
        many = GatherBuilder({0: list(sizes[0])})
        lengths = np.array([len(r) for _, r in specs], np.int64)
        prepared = many.prepare([0] * len(specs), np.cumsum(lengths) - lengths, lengths,
                                np.concatenate([c for c, _ in specs]), np.concatenate([r for _, r in specs]))
        got = [many.emit(prepared, j) for j in range(len(specs))]
        assert got == expected and [type(g) for g in got] == [type(g) for g in expected], trial
        kinds |= {type(g).__name__ for g in got}
        kinds |= {"permuted" for g in got if type(g).__name__ == "ConcatGather" and g.perm_offset >= 0}
        assert np.array_equal(many.finish(), one.finish())
        assert (many.n_index_selects, many.n_run_gathers, many.gathered_rows) == \
            (one.n_index_selects, one.n_run_gathers, one.gathered_rows)
    assert kinds == {"EmptyGather", "ViewGather", "IndexGather", "RunsGather", "ConcatGather", "ChunksGather",
                     "permuted"}, kinds
