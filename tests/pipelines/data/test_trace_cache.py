"""Batches built from records' traces (``data.cache_traces``) are the batches built from records."""
from __future__ import annotations

import pickle

import numpy as np

from pipelines.molecules.experiment import MoleculeExperiment, MolRecord, TargetScaling

from ..helpers import esol_smiles


def _plan_bytes(batch) -> bytes:
    """A Batch's pickled plan and constants (its stats hold timings, so they differ)."""
    return pickle.dumps((batch.size, batch.consts, batch.calls, batch.step_bounds, batch.index_data,
                         batch.outputs, batch.metrics, batch.signature))


def _molecule_records(data_dir):
    return [MolRecord(i, s, np.zeros(12, np.float32)) for i, s in enumerate(esol_smiles(data_dir, 8))]


def test_molecule_batches_from_cached_traces_equal_batches_from_records(data_dir):
    exp = MoleculeExperiment("tox21")
    cfg = {"molecules": {"atom_hidden": 5, "pair_hidden": 4, "n_weave": 2, "gather": "sum",
                         "mol_hidden": 6, "final_pair_output": False}}
    builder = exp.batch_builder(cfg, TargetScaling())
    records = _molecule_records(data_dir)
    traces = exp.trace_records(builder, records)   # every record traced once, then reused
    assert len(traces) == len(records) and all(t is not None for t in traces)
    for idx in (np.array([3, 1, 4]), np.array([0, 1, 2, 3, 4, 5, 6, 7]), np.array([7, 3])):
        recs = [records[int(j)] for j in idx]
        a = exp.make_batch(builder, recs)
        b = exp.make_batch(builder, recs, [traces[int(j)] for j in idx])
        assert _plan_bytes(a.batch) == _plan_bytes(b.batch)
        np.testing.assert_array_equal(a.labels, b.labels)


def test_sst_batches_from_cached_traces_equal_batches_from_records(data_dir):
    import torch

    from pipelines.sst.data import load_split
    from pipelines.sst.experiment import SSTExperiment
    from pipelines.sst.model import SentimentModules, build_compiler
    from pipelines.sst.vocab import build_vocab

    trees, _ = load_split("dev", data_dir=data_dir)
    trees = trees[:30]
    vocab = build_vocab(trees)
    torch.manual_seed(0)
    builder = build_compiler(SentimentModules(len(vocab.itos), 8, 6), vocab.stoi, scheduler="coalesce")
    exp = SSTExperiment()
    traces = exp.trace_records(builder, trees)
    for idx in (np.arange(10), np.array([29, 0, 5, 17]), np.arange(30)):
        recs = [trees[int(j)] for j in idx]
        assert _plan_bytes(exp.make_batch(builder, recs)) == \
            _plan_bytes(exp.make_batch(builder, recs, [traces[int(j)] for j in idx]))


def test_trace_block_in_pieces_equals_one_trace_call(data_dir, monkeypatch):
    """``pipelines.data.step.trace_block`` traces a block ``TRACE_CHUNK_RECORDS`` records at a
    time (bounded memory); the traces are those of one ``trace_records`` call over the block."""
    import pyarrow as pa

    from pipelines.data import step as steps

    exp = MoleculeExperiment("tox21")
    cfg = {"seed": 0, "molecules": {"atom_hidden": 5, "pair_hidden": 4, "n_weave": 2, "gather": "sum",
                                    "mol_hidden": 6, "final_pair_output": False}}
    records = _molecule_records(data_dir)
    table = pa.table({"pos": pa.array(range(len(records)), pa.int64()),
                      "rec": pa.array([pickle.dumps(r) for r in records], pa.binary())})
    monkeypatch.setattr(steps, "TRACE_CHUNK_RECORDS", 3)
    pieces = steps.trace_block(table, exp, cfg, TargetScaling())
    assert pieces.column_names == ["pos", "rec", "trace"] and pieces.num_rows == len(records)
    builder = steps.batch_builder(exp, cfg, TargetScaling())
    whole = exp.trace_records(builder, records)
    traced = [pickle.loads(b) for b in pieces.column("trace").to_pylist()]
    for idx in ([0, 1, 2, 3, 4, 5, 6, 7], [6, 2]):
        recs = [records[j] for j in idx]
        a = exp.make_batch(builder, recs, [whole[j] for j in idx])
        b = exp.make_batch(builder, recs, [traced[j] for j in idx])
        assert _plan_bytes(a.batch) == _plan_bytes(b.batch)


class _NoTraces:
    def batch_builder(self, config, context):
        return None

    def trace_records(self, builder, records):
        return None


def test_trace_block_leaves_traces_null_for_experiments_without_traces():
    """An experiment whose ``trace_records`` returns None gets a ``trace`` column of nulls (and
    its batches are then built from the records)."""
    import pyarrow as pa

    from pipelines.data import step as steps

    table = pa.table({"pos": pa.array([0, 1, 2], pa.int64()),
                      "rec": pa.array([pickle.dumps(i) for i in range(3)], pa.binary())})
    out = steps.trace_block(table, _NoTraces(), {"seed": 0, "no_traces": True}, None)
    assert out.column("trace").to_pylist() == [None, None, None]
