"""Train the SST Tree-LSTM (paper Table 2) through the shared Ray Data -> Ray Train -> MLflow glue.

    python -m pipelines.sst.train --config conf/sst_treelstm.yaml [key=value ...]
    python -m pipelines.sst.train --config conf/sst_tai2015.yaml --embeddings glove.840B.300d.txt

``--embeddings PATH`` is ``sst.embeddings=PATH`` (a GloVe-format text file; default GloVe 6B 50d
from the installed package).  ``--skip-bad`` skips malformed SST lines (counted as MLflow metrics
``skipped/<split>/malformed``, each named in the run's ``data/skipped.csv``).  After
:func:`pipelines.training.run.run` this adds to the same MLflow run: embedding coverage (``embeddings/*``),
training throughput in trees per second (``time/trees_per_s``: the glue's records per second) and
the results table beside the paper's Table 2 (logged by the glue as ``results.json``; printed
here).
"""
from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

from pipelines import console
from pipelines.config import merged_schema, parse_cli
from pipelines.errors import entry_point
from pipelines.training.run import RunResult, check_only, report, run

from pipelines.sst.experiment import SCHEMA, SSTExperiment

log = logging.getLogger("pipelines.sst.train")


def _split_embeddings_flag(argv: Sequence[str]) -> list[str]:
    """``--embeddings PATH`` / ``--embeddings=PATH`` -> the override ``sst.embeddings=PATH``."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--embeddings":
            path = next(it, None)
            if path is None:
                raise SystemExit("--embeddings needs a PATH")
            out.append(f"sst.embeddings={path}")
        elif a.startswith("--embeddings="):
            out.append("sst.embeddings=" + a.split("=", 1)[1])
        else:
            out.append(a)
    return out


def after_run(experiment: SSTExperiment, res: RunResult) -> dict[str, float]:
    """Extra MLflow logging on the finished run ``res`` of ``experiment``: the embedding coverage
    of the run's loaded context (``res.context``, an ``SSTContext``) and the throughput in trees
    per second; returns what it logged."""
    from pipelines.tracking.tracker import Tracker

    extra: dict[str, float] = {}
    st = res.context.embedding_stats if res.context is not None else None
    if st is not None:
        extra.update({"embeddings/dim": float(st.dim), "embeddings/n_words": float(st.n_words),
                      "embeddings/n_found": float(st.n_found), "embeddings/n_oov": float(st.n_oov),
                      "embeddings/coverage": float(st.coverage)})
        if st.token_coverage is not None:
            extra["embeddings/token_coverage"] = float(st.token_coverage)
    rates = [h["time/records_per_s"] for h in res.history if "time/records_per_s" in h]
    if rates:
        extra["time/trees_per_s"] = float(sum(rates) / len(rates))
    tracker = Tracker(res.tracking_uri, res.run_id, enabled=bool(res.run_id))
    tracker.metrics(extra, step=len(res.history))
    if st is not None:
        tracker.params({"sst.embedding_source": st.source})
    return extra


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunResult]:
    argv = _split_embeddings_flag(list(sys.argv[1:] if argv is None else argv))
    with entry_point("pipelines.sst.train", argv):
        cfg, args = parse_cli(argv, merged_schema(SCHEMA),
                              "Train the SST Tree-LSTM (fine-grained + binary root accuracy, paper Table 2). "
                              "--embeddings PATH: a GloVe text file (default GloVe 6B 50d).")
        console.configure(cfg["verbose"])
        experiment = SSTExperiment()
        if args.check:
            check_only("pipelines.sst.train", experiment, cfg)
            return None
        res = run(experiment, cfg)
        report(experiment, res, after_run(experiment, res), args.result_json, args.brief)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
