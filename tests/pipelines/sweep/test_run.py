"""pipelines.sweep: Ray Tune sweeps with one MLflow parent run and a nested run per trial.

The search syntax and the plan's checks run without Ray.  Two real sweeps of the toy experiment
(real Ray Tune over real Ray Train, real MLflow on sqlite): a seed sweep whose driver (a real
subprocess with its own local Ray) is SIGKILLed after its first trial finished and which
``--resume`` completes; a seed sweep whose trial errors (exit 1 naming ``--resume``, which reruns
it); an ASHA search in which the trial that cannot learn (lr 0) is stopped after its first epoch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from pipelines.config import ConfigError, load_config, merged_schema
from pipelines.sweep.run import PLAN_FILE, SweepPlan, plan_sweep, run_sweep, trial_config
from pipelines.sweep.report import FINISHED, STOPPED
from pipelines.sweep.space import parse_search
from tests.pipelines.helpers import REPO
from tests.pipelines.toy_experiment import ToyExperiment

TOY = "tests.pipelines.toy_experiment.ToyExperiment"
SCHEMA = merged_schema(ToyExperiment.config_schema)


def _toy_overrides(tmp, epochs=2):
    return [f"epochs={epochs}", "batch_size=20", "optimizer.name=adagrad", "optimizer.lr=0.1",
            "toy.n_train=120", "toy.n_dev=40", "toy.n_test=40", "ray.num_workers=1",
            "ray.no_progress_timeout_s=120", "log_every=0", "name=toy-sweep", "seed=3",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db"]


# ------------------------------------------------------------------------------ no Ray

@pytest.mark.parametrize("spec, words", [
    ("optimizer.lr=loguniform(0,0.1)", ["'optimizer.lr'", "0 < low", "0.0"]),
    ("optimizer.lr=loguniform(0.1,0.01)", ["'optimizer.lr'", "below high"]),
    ("optimizer.lr=uniform(0.1)", ["'optimizer.lr'", "two bounds"]),
    ("optimizer.lr=normal(0,1)", ["'optimizer.lr'", "'normal'", "loguniform"]),
    ("optimizer.lrr=choice(0.1,0.2)", ["'optimizer.lrr'", "unknown key", "did you mean 'optimizer.lr'"]),
    ("optimizer.name=choice(adam,nadam)", ["'optimizer.name'", "'nadam'", "not one of"]),
    ("optimizer.name=loguniform(1,2)", ["'optimizer.name'", "draws floats"]),
    ("toy.hidden=randint(4,2.5)", ["'toy.hidden'", "expected int", "2.5"]),
    ("toy.hidden=choice(4,4)", ["'toy.hidden'", "listed twice"]),
    ("optimizer.lr=choice(0.1,-1)", ["'optimizer.lr'", "-1", "minimum"]),
    ("optimizer.lr", ["KEY=KIND(ARGS)"]),
])
def test_bad_search_specs_name_the_key_and_value(spec, words):
    with pytest.raises(ConfigError) as err:
        parse_search(spec, SCHEMA)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert "--search" in str(err.value)


def test_trial_lines_show_whole_figures_never_a_cut_value():
    """The per-epoch and per-trial lines show the first few metrics whole and say how many more
    there are (a fixed character cut once printed 'majority_fine 0.2' for 0.286)."""
    from pipelines.sweep.trials import figures_line

    result = {f"best/test/m{i}": 0.28571 for i in range(7)} | {"best/test/loss": 3.0, "best/dev/x": 1.0,
                                                               "best/test/flag": True}
    line = figures_line(result, "best/test/")
    assert line == "m0 0.286  m1 0.286  m2 0.286  m3 0.286  (+3 more in MLflow)"
    assert figures_line({"dev/accuracy": 0.5}, "dev/") == "accuracy 0.500"
    # on the scale of the experiment's tables: SST's accuracies in percent, as its tables print them
    from pipelines import console
    from pipelines.sst.experiment import SSTExperiment

    sst = SSTExperiment()
    scale = console.table_scale(sst.sweep_layout(), sst.key_metrics)
    assert figures_line({"dev/fine": 0.28571, "dev/binary": 0.5}, "dev/", scale=scale) == "binary 50.0%  fine 28.6%"
    # the key metrics first, then the others by name
    dev = {"dev/all_binary": 0.8, "dev/all_fine": 0.7, "dev/binary": 0.5, "dev/fine": 0.28571, "dev/majority_fine": 0.2}
    assert figures_line(dev, "dev/", scale=scale, first=sst.key_metrics) == (
        "fine 28.6%  binary 50.0%  all_binary 80.0%  all_fine 70.0%  (+1 more in MLflow)")


def test_search_specs_parse_to_typed_values():
    s = parse_search("optimizer.lr=loguniform(1e-3, 1e-1)", SCHEMA)
    assert (s.key, s.kind, s.values) == ("optimizer.lr", "loguniform", (1e-3, 1e-1))
    s = parse_search("toy.hidden=grid(4,8)", SCHEMA)
    assert s.values == (4, 8) and all(type(v) is int for v in s.values)
    s = parse_search("optimizer.name=choice(adam, adagrad)", SCHEMA)
    assert s.values == ("adam", "adagrad")


def test_plan_checks_the_sweep_definition(tmp_path):
    cfg = load_config(None, _toy_overrides(tmp_path), SCHEMA)
    with pytest.raises(ConfigError, match="nothing to sweep"):
        plan_sweep(TOY, cfg, cluster_cpus=2)
    with pytest.raises(ConfigError, match="'seed'.*set by the sweep"):
        plan_sweep(TOY, cfg, seeds=2, searches=["seed=choice(1,2)"], cluster_cpus=2)
    with pytest.raises(ConfigError, match="--samples"):
        plan_sweep(TOY, cfg, seeds=2, samples=3, cluster_cpus=2)
    with pytest.raises(ConfigError, match="--grace-period"):
        plan_sweep(TOY, cfg, seeds=2, scheduler="asha", grace_period=5, cluster_cpus=2)
    off = load_config(None, _toy_overrides(tmp_path) + ["tracking.mode=off"], SCHEMA)
    with pytest.raises(ConfigError, match="tracking.mode"):
        plan_sweep(TOY, off, seeds=2, cluster_cpus=2)
    two = load_config(None, _toy_overrides(tmp_path) + ["ray.num_workers=2"], SCHEMA)
    with pytest.raises(ConfigError, match="do not fit"):
        plan_sweep(TOY, two, seeds=4, max_concurrent=60, cluster_cpus=2)
    plan = plan_sweep(TOY, cfg, seeds=3, searches=["toy.hidden=grid(4,8)"], max_concurrent=2, cluster_cpus=2,
                      name="p", storage=str(tmp_path))
    assert plan.seeds == [3, 4, 5] and plan.metric == "dev/accuracy" and plan.mode == "max"
    assert plan.n_trials == 6          # 3 seeds x a grid of 2: what the heartbeat counts before Tune made them
    # two trials x one worker, plus the trials' own actors, leave one CPU to Ray Data
    assert 2 * plan.config["ray"]["cpus_per_worker"] + 2 * 0.01 <= 1.0
    tc = trial_config(plan, {"seed": 4, "toy.hidden": 8}, "abc_00001")
    assert tc["seed"] == 4 and tc["toy"]["hidden"] == 8
    assert tc["tracking"]["tags"]["sweep.trial_id"] == "abc_00001"
    assert tc["ray"]["run_name"] == "abc_00001" and tc["ray"]["storage_path"].startswith(plan.directory)
    assert SweepPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


# ------------------------------------------------------------------------------ real sweeps

def _children(client, parent):
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")


def _sweep_cmd(tmp, *args):
    return [sys.executable, "-m", "pipelines.sweep", "--experiment", TOY, *args, "--storage", str(tmp / "sweeps"),
            "--name", "seeds", "--max-concurrent", "1", "--result-json", str(tmp / "out.json")]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_seed_sweep_survives_a_killed_driver(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled", TUNE_GLOBAL_CHECKPOINT_S="1")
    env.pop("RAY_ADDRESS", None)
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(_sweep_cmd(tmp_path, "--seeds", "2", *_toy_overrides(tmp_path)), cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = MlflowClient(uri)
    sweep_dir = tmp_path / "sweeps" / "seeds"
    finished_before = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (sweep_dir / PLAN_FILE).exists():
                parent = json.loads((sweep_dir / PLAN_FILE).read_text())["parent_run_id"]
                done = [r for r in _children(client, parent) if r.info.status == "FINISHED"]
                if done:
                    time.sleep(3)  # > TUNE_GLOBAL_CHECKPOINT_S: Tune has saved the trial as finished
                    finished_before = {r.data.tags["sweep.trial_id"]: r.info.run_id for r in done}
                    break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
        proc.wait()
        log.close()
    assert finished_before, (tmp_path / "first.log").read_text()[-3000:]
    assert len(finished_before) == 1, "both trials finished before the kill: the test needs a slower trial"

    out = subprocess.run([sys.executable, "-m", "pipelines.sweep", "--resume", str(sweep_dir),
                          "--result-json", str(tmp_path / "out.json")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    parent = report["run_id"]
    assert parent == json.loads((sweep_dir / PLAN_FILE).read_text())["parent_run_id"]
    exp_id = client.get_run(parent).info.experiment_id
    parents = client.search_runs([exp_id], filter_string="tags.`sweep.role` = 'parent'")
    assert [p.info.run_id for p in parents] == [parent]          # not duplicated
    p = client.get_run(parent)
    assert p.info.status == "FINISHED"
    assert p.data.params["sweep.seeds"] == "3,4" and p.data.params["sweep.n_seeds"] == "2"
    assert p.data.metrics["sweep/n_finished"] == 2

    children = _children(client, parent)
    by_trial: dict[str, list] = {}
    for r in children:
        by_trial.setdefault(r.data.tags["sweep.trial_id"], []).append(r)
    assert len(by_trial) == 2
    for tid, run_id in finished_before.items():                   # the finished trial did not rerun
        assert [r.info.run_id for r in by_trial[tid]] == [run_id]
    (other,) = set(by_trial) - set(finished_before)
    # the rerun (the latest run) finished; a run the killed driver left behind, if the trial had
    # started one, was marked KILLED
    statuses = [r.info.status for r in sorted(by_trial[other], key=lambda r: r.info.start_time)]
    assert statuses[-1] == "FINISHED" and set(statuses[:-1]) <= {"KILLED"}, statuses
    finished = [r for r in children if r.info.status == "FINISHED"]
    assert sorted(r.data.params["seed"] for r in finished) == ["3", "4"]

    # mean and sd over the two seeds, from the children's own best metrics (each logged, like the
    # parent's figures, to 4 significant digits: pipelines.metrics.logged_value)
    vals = [r.data.metrics["best/test/accuracy"] for r in finished]
    mean = sum(vals) / 2
    assert p.data.metrics["mean/best/test/accuracy"] == pytest.approx(mean, rel=1e-3)
    assert p.data.metrics["sd/best/test/accuracy"] == pytest.approx(abs(vals[0] - vals[1]) / 2 ** 0.5, rel=2e-3, abs=2e-4)
    assert report["best/test/accuracy"] == pytest.approx(mean, rel=1e-3)
    arts = {a.path for a in client.list_artifacts(parent)} | {a.path for a in client.list_artifacts(parent, "tables")}
    assert {"trials.json", "table.json", "tables/trials.csv", "tables/table.csv"} <= arts
    assert [a.path for a in client.list_artifacts(parent, "plots")] == ["plots/dev_curves.png"]
    table = json.loads(open(client.download_artifacts(parent, "trials.json", str(tmp_path))).read())
    assert sorted(table["columns"][:4]) == sorted(["trial", "mlflow_run_id", "status", "epochs"])
    assert {row[table["columns"].index("status")] for row in table["data"]} == {FINISHED}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_an_errored_trial_fails_the_sweep_and_resume_reruns_it(tmp_path):
    """A trial that errors (here its worker exits once, with ray.max_failures=0; in the field, a
    trial started during a tracking outage longer than its retry budget) leaves the sweep
    incomplete: exit status 1 naming --resume, the parent FAILED with a ``sweep.incomplete`` tag;
    ``--resume`` reruns the errored trial only and completes the same parent."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    marker = tmp_path / "failed-once"
    first = subprocess.run(_sweep_cmd(tmp_path, "--seeds", "2", *_toy_overrides(tmp_path), "ray.max_failures=0",
                                      "toy.fail_at_call=3", f"toy.fail_marker={marker}"),
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = first.stdout[-3000:] + first.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "seeds"
    assert first.returncode == 1 and marker.exists(), out
    assert "1 of 2 trial(s) errored" in first.stderr and f"--resume {sweep_dir}" in first.stderr, out
    client = MlflowClient(uri)
    parent = json.loads((sweep_dir / PLAN_FILE).read_text())["parent_run_id"]
    p = client.get_run(parent)
    assert p.info.status == "FAILED" and f"--resume {sweep_dir}" in p.data.tags["sweep.incomplete"]
    done_before = {r.data.tags["sweep.trial_id"]: r.info.run_id for r in _children(client, parent)
                   if r.info.status == "FINISHED"}
    assert len(done_before) == 1, out

    again = subprocess.run([sys.executable, "-m", "pipelines.sweep", "--resume", str(sweep_dir),
                            "--result-json", str(tmp_path / "out.json")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    p = client.get_run(parent)
    assert p.info.status == "FINISHED"
    assert p.data.metrics["sweep/n_finished"] == 2 and p.data.metrics["sweep/n_errored"] == 0
    finished = [r for r in _children(client, parent) if r.info.status == "FINISHED"]
    assert sorted(r.data.params["seed"] for r in finished) == ["3", "4"]
    for tid, run_id in done_before.items():                     # the finished trial did not rerun
        assert [r.info.run_id for r in finished if r.data.tags["sweep.trial_id"] == tid] == [run_id]


def _artifacts(client, run_id, path=None) -> set:
    out = set()
    for f in client.list_artifacts(run_id, path):
        out |= _artifacts(client, run_id, f.path) if f.is_dir else {f.path}
    return out


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_sweep_trial_logs_what_a_command_line_run_of_its_config_logs(ray_cluster, tmp_path, monkeypatch):
    """Experiment.after_run runs inside the run, so a sweep trial's MLflow run holds the same
    artifacts and after-run metrics as a run of the same config from the command line's run()."""
    from pipelines.training.run import run

    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, _toy_overrides(tmp_path, epochs=1), SCHEMA)
    plan = plan_sweep(TOY, cfg, seeds=1, max_concurrent=1, name="one", storage=str(tmp_path / "sweeps"),
                      ensemble=False)
    swept = run_sweep(plan)
    trial = swept.trials[0]
    cli = run(ToyExperiment(), load_config(None, _toy_overrides(tmp_path, epochs=1) +
                                           [f"{k}={v}" for k, v in trial.params.items()], SCHEMA))
    client = MlflowClient(plan.config["tracking"]["uri"])
    got, want = _artifacts(client, trial.run_id), _artifacts(client, cli.run_id)
    assert "plots/after_run_dev_accuracy.png" in want and got == want, (got ^ want)
    assert client.get_run(trial.run_id).data.metrics["toy/after_run_epochs"] == 1.0
    assert cli.extra == {"toy/after_run_epochs": 1.0}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_asha_stops_the_trial_that_cannot_learn(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root ./mlruns lands in tmp_path
    cfg = load_config(None, _toy_overrides(tmp_path, epochs=3) + ["optimizer.name=adam"], SCHEMA)
    plan = plan_sweep(TOY, cfg, searches=["optimizer.lr=grid(0.05,0.0)"], scheduler="asha", grace_period=1,
                      reduction_factor=2, max_concurrent=1, name="asha", storage=str(tmp_path / "sweeps"))
    res = run_sweep(plan)
    by_lr = {t.params["optimizer.lr"]: t for t in res.trials}
    assert by_lr[0.05].status == FINISHED and by_lr[0.05].epochs == 3
    assert by_lr[0.0].status == STOPPED and by_lr[0.0].epochs == 1, by_lr[0.0]
    assert res.summary.n_stopped == 1 and res.summary.best_trial == by_lr[0.05].trial_id
    client = MlflowClient(plan.config["tracking"]["uri"])
    stopped = client.get_run(by_lr[0.0].run_id)
    assert stopped.info.status == "KILLED" and stopped.data.tags["sweep.stopped_early"] == "true"
    assert client.get_run(res.parent_run_id).data.params["sweep.search.optimizer.lr"] == "grid(0.05,0.0)"


def test_summary_and_paper_table_from_trial_outcomes():
    from pipelines.sweep.report import ERROR, TableLayout, TrialOutcome, paper_table, summarize, trial_table

    trials = [TrialOutcome("t0", {"seed": 0}, FINISHED, 2, {"best/dev/fine": 0.50, "best/test/fine": 0.52}, [(1, .4), (2, .5)]),
              TrialOutcome("t1", {"seed": 1}, FINISHED, 2, {"best/dev/fine": 0.48, "best/test/fine": 0.50}, [(1, .48)]),
              TrialOutcome("t2", {"seed": 2}, STOPPED, 1, {"best/dev/fine": 0.60, "best/test/fine": 0.10}, [(1, .6)]),
              TrialOutcome("t3", {"seed": 3}, ERROR, 0, {}, [], error="boom")]
    s = summarize(trials, "fine", "max")
    assert (s.n_trials, s.n_finished, s.n_stopped, s.n_errored) == (4, 2, 1, 1)
    assert s.mean["best/test/fine"] == pytest.approx(0.51)                 # finished trials only
    assert s.sd["best/test/fine"] == pytest.approx(0.02 / 2 ** 0.5)        # sample sd
    assert s.best_trial == "t2" and s.metrics()["sweep/n_stopped_early"] == 1
    table = paper_table(s, TableLayout({"best/test/fine": "fine"}, 100.0, (("paper", "52.3 (0.7)"),)), "m",
                        {"test/fine": 0.5349}, 2)
    assert table.to_dict("records") == [{"model": "m (ours), mean (sd) over 2 runs", "fine": "51.00 (1.41)"},
                                        {"model": "m (ours), ensemble of 2", "fine": "53.49"},
                                        {"model": "paper", "fine": "52.3 (0.7)"}]
    rows = trial_table(trials).to_dict("records")
    assert [r["status"] for r in rows] == [FINISHED, FINISHED, STOPPED, ERROR] and rows[3]["error"] == "boom"


def test_the_sweep_table_shows_each_figure_beside_its_trivial_baseline():
    """A column with a baseline (a metric of the trials, or a number) gets a baseline row, and a
    figure not above it is marked: a model at the majority class learned nothing measurable."""
    from pipelines.sweep.report import TableLayout, TrialOutcome, paper_table, summarize

    trials = [TrialOutcome(f"t{i}", {"seed": i}, FINISHED, 1,
                           {"best/dev/fine": 0.3, "best/test/fine": f, "best/test/majority_fine": 0.286,
                            "best/test/auc": 0.5}, [(1, 0.3)]) for i, f in enumerate((0.28, 0.29))]
    s = summarize(trials, "fine", "max")
    layout = TableLayout({"best/test/fine": "fine", "best/test/auc": "auc"}, 100.0,
                         baselines={"best/test/fine": "best/test/majority_fine", "best/test/auc": 0.5},
                         baseline_name="majority class / chance")
    rows = paper_table(s, layout, "m", {"test/fine": 0.40}, 2).to_dict("records")
    assert rows[0] == {"model": "m (ours), mean (sd) over 2 runs", "fine": "28.50 (0.71) NOT ABOVE BASELINE",
                       "auc": "50.00 (0.00) NOT ABOVE BASELINE"}
    assert rows[1] == {"model": "m (ours), ensemble of 2", "fine": "40.00", "auc": ""}
    assert rows[2] == {"model": "majority class / chance", "fine": "28.60", "auc": "50.00"}


def test_the_sweep_runs_the_experiment_its_config_names(tmp_path):
    """The config's ``experiment:`` key (or ``--experiment``) names the experiment; the sweep does
    not guess it from the config's sections, and a train entry point refuses another's config."""
    from pipelines.experiment import experiment_class
    from pipelines.sweep.run import sweep_experiment
    from pipelines.training.checks import check_experiment

    assert sweep_experiment(None, "conf/sst_tai2015.yaml") == "sst"
    assert sweep_experiment(None, "conf/molecules_tox21.yaml") == "molecules"
    assert sweep_experiment(TOY, "conf/sst_tai2015.yaml") == TOY
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: mine\nsst:\n  state_size: 30\n")
    with pytest.raises(ConfigError, match=r"names no experiment.*--experiment"):
        sweep_experiment(None, str(bare))
    with pytest.raises(ConfigError, match="unknown experiment 'nope'"):
        experiment_class("nope")
    toy = experiment_class(TOY)()
    cfg = load_config(None, ["experiment=sst"], merged_schema(toy.config_schema))
    with pytest.raises(ConfigError, match=r"for the experiment 'sst', not ToyExperiment"):
        check_experiment(toy, cfg)
    check_experiment(toy, {**cfg, "experiment": TOY})
