"""The ensemble of trained SST Tree-LSTMs scored on one split in Ray Data (paper Table 2's
"ensemble" row): the members' class probabilities averaged at every node and scored like one
model's softmax output (:func:`pipelines.sst.model.summarize_counts`).  Used by
:meth:`pipelines.sst.experiment.SSTExperiment.ensemble` (a seed sweep's ensemble) and by the
``python -m pipelines.sst.ensemble`` command; only per-block count sums reach the driver.
"""
from __future__ import annotations

from typing import Sequence

import torch

from pipelines.experiment import Experiment
from pipelines.metrics import sum_into
from pipelines.sst.model import count_stats, node_outputs, summarize_counts

__all__ = ["evaluate_ensemble_streaming"]


def _ensemble_sums(experiment, context, configs, states, trees, batch_size):
    """``(ensemble count sums, [member count sums])`` (``count_stats`` summed) over ``trees``;
    ``context``: what ``experiment.read_splits`` loaded for the members' shared data config."""
    models = []
    for cfg, state in zip(configs, states):
        model = experiment.build_model(cfg, context)
        model.load_state_dict(state)
        model.eval()
        models.append(model)
    ens_sums: dict[str, float] = {}
    member_sums: list[dict[str, float]] = [{} for _ in models]
    with torch.no_grad():
        for start in range(0, len(trees), batch_size):
            chunk = trees[start:start + batch_size]
            probs, labels, is_root = None, None, None
            for i, model in enumerate(models):
                model(model.build_batch(chunk))
                logits, lab, root = node_outputs(model)
                sum_into(member_sums[i], count_stats(logits, lab, root))
                p = torch.softmax(logits.double(), -1)
                if probs is None:
                    probs, labels, is_root = p, lab, root
                else:
                    if not torch.equal(lab, labels):
                        raise ValueError("ensemble members disagree on the node order of a batch")
                    probs += p
            probs /= len(models)
            # log of the mean probability: its softmax is that mean, so count_stats scores it
            sum_into(ens_sums, count_stats(probs.log(), labels, is_root))
    return ens_sums, member_sums


def _ensemble_block(table, experiment, configs, state_refs, context, batch_size):
    """Ray Data task: one block of trees (rows ``pos``, ``rec``) -> one row, the pickled
    :func:`_ensemble_sums` over it (count sums add up over blocks)."""
    import pickle

    import pyarrow as pa
    import ray

    from pipelines.data.cache import cached

    trees = [pickle.loads(b) for b in table.column("rec").to_pylist()]
    states = [cached(("member_state", r.hex()), lambda r=r: ray.get(r)) for r in state_refs]
    sums = _ensemble_sums(experiment, context, configs, states, trees, batch_size) if trees else ({}, [])
    return pa.table({"sums": pa.array([pickle.dumps(sums)], pa.binary())})


def evaluate_ensemble_streaming(experiment: Experiment, configs: Sequence[dict], states: Sequence[dict],
                                split: str, batch_size: int = 250) -> tuple[dict, list[dict]]:
    """``(ensemble metrics, [member metrics])`` (keys of :func:`pipelines.sst.model.summarize_counts`)
    on ``split``, the trees read, parsed and evaluated in Ray Data tasks (:meth:`pipelines.sst.experiment.SSTExperiment.read_splits`
    of the first member's config): only per-block count sums reach the driver, never the trees.
    Connects to (or starts) Ray as the training run does."""
    import pickle

    import ray

    from pipelines.cluster import connect_ray

    started = connect_ray(configs[0].get("ray", {}).get("address"), configs[0].get("verbose", False))
    try:
        splits = experiment.read_splits(configs[0])
        src = splits.sources.get(split)
        if src is None or not src.n:
            raise ValueError(f"split {split!r} has no trees")
        refs = [ray.put(s) for s in states]
        out = src.dataset.map_batches(_ensemble_block, batch_format="pyarrow", batch_size=None, fn_kwargs=dict(
            experiment=experiment, configs=list(configs), state_refs=refs, context=splits.context,
            batch_size=batch_size))
        ens_sums: dict[str, float] = {}
        member_sums: list[dict[str, float]] = [{} for _ in states]
        for row in out.iter_rows():
            ens, members = pickle.loads(row["sums"])
            sum_into(ens_sums, ens)
            for acc, m in zip(member_sums, members):
                sum_into(acc, m)
    finally:
        if started:
            ray.shutdown()
    return summarize_counts(ens_sums), [summarize_counts(m) for m in member_sums]
