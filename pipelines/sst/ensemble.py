"""Ensemble of trained SST Tree-LSTMs (the paper's Table 2 "ensemble" row).

``python -m pipelines.sst.ensemble RUN_ID ... [--split test] [--batch-size 250] [--no-tracking]``:
each ``RUN_ID`` is a ``pipelines.training`` SST run that logged its best model
(:func:`pipelines.model.stored.run_package`).  Members' class probabilities are averaged at every
node and scored like one model's softmax output.  Members must agree on ``sst.vocab_splits``,
``sst.embeddings``, ``sst.limit_*`` (then the trees are their common sample), ``data.skip_bad``;
data: ``FOLD_DATA_DIR`` or each run's ``sst.data_dir``.  Evaluated in Ray Data tasks (Ray local
or at ``ray.address`` / ``RAY_ADDRESS``); logged to ``MLFLOW_TRACKING_URI`` (default
``sqlite:///mlflow.db``) as a run of ``sst-ensemble``: params the member run ids, metrics
``<split>/fine`` etc. and ``member<i>/<split>/fine``, table ``results.json``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Mapping, Optional, Sequence

from pipelines.config import get
from pipelines.sst.ensemble_eval import evaluate_ensemble_streaming
from pipelines.sst.experiment import PAPER_TABLE2, SSTExperiment

__all__ = ["load_member", "results_table", "main"]

#: Config keys that decide the trees, the vocabulary and the embedding size: every member must agree
#: on them (seeds may differ: the logged state holds the trained embedding rows, and the vocabulary
#: is counted over the whole files, whatever sample of them ``sst.limit_*`` keeps).
DATA_KEYS = ("sst.vocab_splits", "sst.embeddings", "sst.limit_train", "sst.limit_dev", "sst.limit_test",
             "data.skip_bad", "data.sample_seed")


def load_member(client, run_id: str) -> tuple[dict, dict]:
    """``(config, state_dict)`` of the best model a training run logged (clear errors naming the
    run when it does not exist or logged no model)."""
    from pipelines.model.stored import run_package

    try:
        client.get_run(run_id)
    except Exception as err:  # noqa: BLE001 - MLflow raises several types here
        raise LookupError(f"run {run_id!r} not found in the MLflow store {client.tracking_uri} "
                          f"({type(err).__name__}); give the full run id") from None
    package = run_package(run_id, client.tracking_uri)
    return package.config, package.state_dict()


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

    from pipelines.tracking.store import resolve_uri
    from pipelines.tracking.tracker import Tracker

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
