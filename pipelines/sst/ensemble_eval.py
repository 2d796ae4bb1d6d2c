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

__all__ = ["ensemble_sums", "evaluate_ensemble_streaming"]


def _members(experiment, context, configs, states) -> list:
    """The members' models, weights loaded, in eval mode; the ``load`` of
    :func:`pipelines.model.mapping.map_model`."""
    models = []
    for cfg, state in zip(configs, states):
        model = experiment.build_model(cfg, context)
        model.load_state_dict(state)
        model.eval()
        models.append(model)
    return models


def ensemble_sums(models, trees, batch_size: int) -> tuple[dict, list[dict]]:
    """``(ensemble count sums, [member count sums])`` (``count_stats`` summed) of ``models`` over
    ``trees``: the members' class probabilities averaged at every node."""
    ens_sums: dict[str, float] = {}
    member_sums: list[dict[str, float]] = [{} for _ in models]
    with torch.no_grad():
        for start in range(0, len(trees), batch_size):
            chunk = trees[start:start + batch_size]
            probs, labels, is_root = None, None, None
            for i, model in enumerate(models):
                logits, lab, root = node_outputs(model.run(model.build_batch(chunk)))
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


def _block_sums(models, table, batch_size: int):
    """One block of trees (rows ``pos``, ``rec``) -> one row, the pickled :func:`ensemble_sums`
    over it (count sums add up over blocks); the ``apply`` of :func:`pipelines.model.mapping.map_model`."""
    import pickle

    import pyarrow as pa

    trees = [pickle.loads(b) for b in table.column("rec").to_pylist()]
    sums = ensemble_sums(models, trees, batch_size) if trees else ({}, [])
    return pa.table({"sums": pa.array([pickle.dumps(sums)], pa.binary())})


def evaluate_ensemble_streaming(experiment: Experiment, configs: Sequence[dict], states: Sequence[dict],
                                split: str, batch_size: int = 250) -> tuple[dict, list[dict]]:
    """``(ensemble metrics, [member metrics])`` (keys of :func:`pipelines.sst.model.summarize_counts`)
    on ``split``, the trees read, parsed and evaluated in Ray Data tasks (:meth:`pipelines.sst.experiment.SSTExperiment.read_splits`
    of the first member's config; the members mapped over them by
    :func:`pipelines.model.mapping.map_model`): only per-block count sums reach the driver, never
    the trees.  Connects to (or starts) Ray as the training run does."""
    import functools
    import pickle

    import ray

    from pipelines.cluster import connect_ray
    from pipelines.model.mapping import map_model

    started = connect_ray(configs[0].get("ray", {}).get("address"), configs[0].get("verbose", False))
    try:
        splits = experiment.read_splits(configs[0])
        src = splits.sources.get(split)
        if src is None or not src.n:
            raise ValueError(f"split {split!r} has no trees")
        out = map_model(src.dataset, load=functools.partial(_members, experiment, splits.context, list(configs)),
                        apply=functools.partial(_block_sums, batch_size=batch_size), shared={"states": list(states)})
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
