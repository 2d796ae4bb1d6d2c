"""Ensemble of trained SST Tree-LSTMs (the paper's Table 2 "ensemble" row).

    python -m pipelines.sst.ensemble RUN_ID RUN_ID ... [--split test] [--batch-size 250] [--no-tracking]

Each ``RUN_ID`` is an MLflow run of ``pipelines.sst.train`` that logged its best model
(``weights/state_dict.pt`` and ``weights/meta.json`` with the run's config; ``tracking.log_model``,
on by default).  The members' class probabilities are averaged at every node, and the average
is scored like one model's softmax output (fine-grained = argmax, binary = p(3)+p(4) against
p(0)+p(1) on non-neutral nodes), on the root nodes for the paper's metrics.  Members must agree
on what defines the data and vocabulary (``sst.vocab_splits``, ``sst.embeddings``, ``sst.limit_*``,
``data.skip_bad``); the data directory comes from ``FOLD_DATA_DIR`` (or each run's ``sst.data_dir``).
With ``sst.limit_<split>`` set the evaluated trees are the sample the first member's ``seed`` picks
(:meth:`SSTExperiment.read_splits`); members of other seeds trained on other samples of the
training trees.
The split is read, parsed and evaluated in Ray Data tasks (:func:`evaluate_ensemble_streaming`:
count sums per block reach the driver, not the trees; Ray is started locally or reached at
``ray.address`` / ``RAY_ADDRESS``).

The store is ``MLFLOW_TRACKING_URI`` (default ``sqlite:///mlflow.db``); the result is logged there as
a run of experiment ``sst-ensemble`` (params: the member run ids; metrics ``<split>/fine`` etc. for
the ensemble and ``member<i>/<split>/fine`` for each member; table ``results.json`` next to the
paper's Table 2 rows).
"""
from __future__ import annotations

import argparse
import sys
from typing import Mapping, Optional, Sequence

import torch

from pipelines.config import get
from pipelines.metrics import sum_into
from pipelines.sst.experiment import PAPER_TABLE2, SSTContext, SSTExperiment
from pipelines.sst.model import count_stats, node_outputs, summarize_counts

__all__ = ["load_member", "evaluate_ensemble_streaming", "main"]

#: Config keys that decide the trees, the vocabulary and the embedding size: every member must agree
#: on them (seeds may differ: the logged state holds the trained embedding rows, and the vocabulary
#: is counted over the whole files, whatever sample of them ``sst.limit_*`` keeps).
DATA_KEYS = ("sst.vocab_splits", "sst.embeddings", "sst.limit_train", "sst.limit_dev", "sst.limit_test",
             "data.skip_bad")


def load_member(client, run_id: str) -> tuple[dict, dict]:
    """``(config, state_dict)`` of the best model a training run logged (clear errors naming the
    run when it does not exist or logged no model)."""
    from pipelines.tracking import load_logged_state_dict

    state, meta = load_logged_state_dict(client, run_id)
    if "config" not in meta:
        raise ValueError(f"run {run_id}: weights/meta.json has no config")
    return meta["config"], state


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


def evaluate_ensemble_streaming(experiment: SSTExperiment, configs: Sequence[dict], states: Sequence[dict],
                                split: str, batch_size: int = 250) -> tuple[dict, list[dict]]:
    """``(ensemble metrics, [member metrics])`` (keys of :func:`pipelines.sst.model.summarize_counts`)
    on ``split``, the trees read, parsed and evaluated in Ray Data tasks (:meth:`SSTExperiment.read_splits`
    of the first member's config): only per-block count sums reach the driver, never the trees.
    Connects to (or starts) Ray as the training run does."""
    import pickle

    import ray

    from pipelines.train import connect_ray

    started = connect_ray(configs[0])
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


def results_table(run_ids: Sequence[str], ensemble: Mapping[str, float], members: Sequence[Mapping[str, float]]):
    """Members, the ensemble and the paper's Table 2 rows (percent)."""
    import pandas as pd

    rows = [{"model": f"member {r}", "fine": round(100 * m["fine"], 2), "binary": round(100 * m["binary"], 2)}
            for r, m in zip(run_ids, members)]
    rows.append({"model": f"ensemble of {len(run_ids)} (ours)", "fine": round(100 * ensemble["fine"], 2),
                 "binary": round(100 * ensemble["binary"], 2)})
    rows += [{"model": name, "fine": fine, "binary": binary} for name, fine, binary in PAPER_TABLE2]
    return pd.DataFrame(rows)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description="Ensemble of trained SST Tree-LSTMs (paper Table 2).")
    ap.add_argument("run_ids", nargs="+", help="MLflow run ids of pipelines.sst.train runs")
    ap.add_argument("--split", default="test", choices=["train", "dev", "test"])
    ap.add_argument("--batch-size", type=int, default=250)
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    ap.add_argument("--no-tracking", action="store_true", help="print only; log no MLflow run")
    args = ap.parse_args(argv)

    from mlflow.tracking import MlflowClient

    from pipelines.tracking import Tracker, resolve_uri

    uri = resolve_uri(args.tracking_uri)
    client = MlflowClient(uri)
    configs, states = [], []
    for run_id in args.run_ids:
        cfg, state = load_member(client, run_id)
        if configs:
            for key in DATA_KEYS:
                if get(cfg, key) != get(configs[0], key):
                    raise ValueError(f"run {run_id}: {key} = {get(cfg, key)!r} differs from run "
                                     f"{args.run_ids[0]}'s {get(configs[0], key)!r}; members must share the data")
        configs.append(cfg)
        states.append(state)

    experiment = SSTExperiment()
    print(f"ensemble of {len(configs)} on {args.split}", flush=True)
    ens, members = evaluate_ensemble_streaming(experiment, configs, states, args.split, args.batch_size)
    table = results_table(args.run_ids, ens, members)
    print(table.to_string(index=False))
    out = {"ensemble": ens, "members": members, "run_id": None}
    if not args.no_tracking:
        run = Tracker.start(uri, "sst-ensemble", run_name=f"ensemble-of-{len(configs)}")
        run.params({"members": ",".join(args.run_ids), "split": args.split, "n_members": str(len(configs))})
        metrics = {f"{args.split}/{k}": v for k, v in ens.items()}
        for i, m in enumerate(members):
            metrics.update({f"member{i}/{args.split}/{k}": v for k, v in m.items()})
        run.metrics(metrics)
        run.table(table, "results.json")
        run.end("FINISHED")
        out["run_id"] = run.run_id
        print(f"MLflow run {run.run_id} (experiment sst-ensemble, {uri})")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
