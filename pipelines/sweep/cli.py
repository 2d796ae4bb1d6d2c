"""``python -m pipelines.sweep``: plan and run a sweep (``--seeds N``, ``--search KEY=KIND(ARGS)``),
or ``--resume DIR`` one, then print the paper-style table and a JSON summary (``--result-json``).
Exit status 3: interrupted (``--resume`` continues); 1: no trial finished, a trial errored or the
tracking server was lost.  ``--check``: the config and data files only.  See docs/reproducing.md.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Optional, Sequence

from pipelines import console
from pipelines.config import ConfigError, load_config
from pipelines.datadir import check_files
from pipelines.errors import entry_point
from pipelines.experiment import experiment_class
from pipelines.sweep.plan import SweepPlan, experiment_schema, plan_sweep, sweep_experiment
from pipelines.sweep.report import ERROR
from pipelines.sweep.run import SweepInterrupted, SweepResult, resume_sweep, run_sweep
from pipelines.tracking.store import TrackingUnavailable

__all__ = ["main"]

log = logging.getLogger("pipelines.sweep")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipelines.sweep", description="Seeds and hyperparameter sweeps on Ray Tune (one MLflow parent run "
                                             "with a nested run per trial).")
    ap.add_argument("--config", "-c", metavar="PATH", help="YAML config (conf/*.yaml)")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every trial")
    ap.add_argument("--experiment", help="sst, molecules or package.module.Class (default: the config's experiment: key)")
    ap.add_argument("--seeds", type=int, default=0, metavar="N", help="N trials with seeds seed..seed+N-1")
    ap.add_argument("--search", action="append", default=[], metavar="KEY=KIND(ARGS)",
                    help="KIND: loguniform(a,b) uniform(a,b) randint(a,b) choice(x,y,...) grid(x,y,...)")
    ap.add_argument("--samples", type=int, default=1, metavar="K", help="samples drawn from the --search space")
    ap.add_argument("--scheduler", default="fifo", help="fifo (default) or asha (stops poor trials early)")
    ap.add_argument("--grace-period", type=int, default=1, help="ASHA: epochs before a trial may be stopped")
    ap.add_argument("--reduction-factor", type=float, default=2.0, help="ASHA: keep 1/this of the trials per rung")
    ap.add_argument("--max-concurrent", type=int, default=None, help="trials at once (default: from the CPUs)")
    ap.add_argument("--name", help="sweep name (default <config name>-sweep-<time>)")
    ap.add_argument("--storage", help="directory (or URI) for sweeps (default ./ray_results/sweeps)")
    ap.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR (others options are ignored)")
    ap.add_argument("--no-ensemble", dest="ensemble", action="store_false", help="skip the ensemble of a seed sweep")
    ap.add_argument("--result-json", metavar="PATH", help="also write the final JSON here")
    ap.add_argument("--brief", action="store_true", help="no paper table at the end (scripts that summarise, "
                                                          "e.g. scripts/reproduce.sh, print their own)")
    ap.add_argument("--verbose", "-v", action="store_true", help="verbose=true: everything the libraries log")
    ap.add_argument("--check", action="store_true",
                    help="check the config and the data files (a missing one is downloaded into the cache when it "
                         "can be), then exit: neither Ray nor an MLflow run starts")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> Optional[SweepResult]:
    """``python -m pipelines.sweep`` (the module docstring); None after ``--check``."""
    from pipelines.cluster import connect_ray

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        if args.resume:
            saved = SweepPlan.load(args.resume)
            plan_cfg, cls = saved.config, experiment_class(saved.experiment)
        else:
            exp = sweep_experiment(args.experiment, args.config)
            cls = experiment_class(exp)
            plan_cfg = load_config(args.config, list(args.overrides) + (["verbose=true"] if args.verbose else []),
                                   experiment_schema(cls))
        experiment = cls.from_config(plan_cfg)
    except (ConfigError, OSError) as err:
        ap.error(str(err))
    console.configure(plan_cfg["verbose"] or args.verbose)
    with entry_point("pipelines.sweep", argv):  # before Ray and the parent run: a missing data file is one line
        found = check_files(experiment.data_files(plan_cfg))
    if args.check:
        print(f"pipelines.sweep: check passed: the config and {len(found)} data file(s)"
              + (f": {', '.join(map(str, found))}" if found else ""))
        return None
    started = connect_ray(plan_cfg["ray"]["address"], plan_cfg["verbose"] or args.verbose)
    try:
        if args.resume:
            result = resume_sweep(args.resume)
        else:
            try:
                plan = plan_sweep(exp, plan_cfg, name=args.name, storage=args.storage, seeds=args.seeds,
                                  searches=args.search, samples=args.samples, scheduler=args.scheduler,
                                  grace_period=args.grace_period, reduction_factor=args.reduction_factor,
                                  max_concurrent=args.max_concurrent, ensemble=args.ensemble,
                                  config_path=args.config, overrides=args.overrides)
            except ConfigError as err:
                ap.error(str(err))
            result = run_sweep(plan)
    except SweepInterrupted as err:
        log.error("%s", err)
        raise SystemExit(3) from None
    except TrackingUnavailable as err:
        log.error("%s", err)
        raise SystemExit(1) from None
    finally:
        if started:
            import ray

            ray.shutdown()
    if not args.brief:
        print(result.table.to_string(index=False))
    report = result.report()
    text = json.dumps(report, indent=2, default=str)
    if args.result_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.result_json)), exist_ok=True)
        with open(args.result_json, "w") as f:
            f.write(text + "\n")
    if plan_cfg["verbose"] or args.verbose:
        print(text)
    else:
        print(f"sweep: {result.summary.n_finished} trial(s) finished"
              + (f"; the best trial: run {report['best_run_id']}, model {report['best_model_uri']} (for an "
                 f"experiment that logs models)" if report.get("best_run_id") else "")
              + f"; parent MLflow run {result.parent_run_id} ({result.tracking_uri})"
              + (f"; the full result in {args.result_json}" if args.result_json else
                 "; --result-json PATH writes the full result (every mean, sd and ensemble figure)"))
    if not result.summary.n_finished:
        log.error("no trial finished (%d errored, %d stopped early): see the trials' errors in %s; rerun them "
                  "with python -m pipelines.sweep --resume %s", result.summary.n_errored, result.summary.n_stopped,
                  result.tracking_uri, result.directory)
        raise SystemExit(1)
    if result.summary.n_errored:
        first = next((t for t in result.trials if t.status == ERROR), None)
        log.error("%d of %d trial(s) errored (first: %s); the figures above are over the %d finished; rerun the "
                  "errored ones with python -m pipelines.sweep --resume %s", result.summary.n_errored,
                  len(result.trials), first.error if first else "?", result.summary.n_finished, result.directory)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
