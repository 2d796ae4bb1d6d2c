"""Every benchmark runs from the repository root as ``python -m benchmarks.<name>`` (its ``main``:
argparse and one call into its ``run``); benchmarks/ is not installed (only foldengine, schedulers
and pipelines are).  The Python scripts left in scripts/ start from any directory, without
PYTHONPATH, and parse their flags."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
NAMES = ["ab_build_vs_commit"]
#: The scripts/<name>.py that put the checkout on sys.path to import it: now ``python -m benchmarks.<name>``.
MOVED_SCRIPTS = ["summarize_reproduction", "ui_screenshots"]
#: The benchmarks that had a scripts/bench_<name>.py wrapper (issue 47): each has a command line.
BENCHMARKS = ["build", "engine", "gpu_utilization", "input_scale", "peers", "predict", "row_blocking", "row_layout",
              "schedulers", "sst_device", "table1", "tox21_peers", "tox21_prepare"]
#: Every module of benchmarks/ with a command line (``if __name__ == "__main__":``).
CLI_MODULES = sorted(f.stem for f in (ROOT / "benchmarks").glob("*.py")
                     if 'if __name__ == "__main__":' in f.read_text())


@pytest.mark.parametrize("name", NAMES)
def test_script_help_runs_from_elsewhere(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout


def test_every_benchmark_has_a_command_line_and_no_wrapper_script():
    assert set(BENCHMARKS + MOVED_SCRIPTS) <= set(CLI_MODULES)
    assert sorted(p.name for p in SCRIPTS.glob("bench_*.py")) == []
    assert not (SCRIPTS / "repo_path.py").exists()
    assert [n for n in MOVED_SCRIPTS if (SCRIPTS / f"{n}.py").exists()] == []


def test_no_script_edits_sys_path():
    """The project is installed (editable) and benchmarks/ runs from the root: no script puts the
    checkout on ``sys.path``."""
    assert [p.name for p in sorted(SCRIPTS.glob("*.py")) if "sys.path" in p.read_text()] == []


@pytest.mark.parametrize("name", CLI_MODULES)
def test_benchmark_module_help_from_the_repository_root(name):
    """``python -m benchmarks.<name> --help`` from the root, without PYTHONPATH: exit 0 and a usage."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout
    if name in BENCHMARKS + MOVED_SCRIPTS:
        assert f"usage: python -m benchmarks.{name} " in res.stdout


def test_benchmarks_is_not_an_installed_package(tmp_path):
    """From elsewhere, without PYTHONPATH: the installed packages import, ``benchmarks`` does not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.util as u; print([u.find_spec(m) is not None "
            "for m in ('foldengine', 'schedulers', 'pipelines', 'benchmarks')])")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[True, True, True, False]"


def test_reproduction_summary(tmp_path):
    """The summary of a reproduction: one table (accuracy and timing beside the paper and the
    expected range) from a Table 1 JSON and the entry points' result JSONs; figures outside their
    range are marked; CSV/JSON copies beside the Markdown."""
    import json

    from benchmarks import reproduction
    t1 = {"rows": [{"mode": m, "scheduler": "depth", "batch_size": b, "cost_ratio": 1.0 + b / 1000,
                    "speedup_ratio": 2.0} for m in ("inference", "training") for b in (1, 256)],
          "paper_cpu": {"256": {"cost_ratio": 1.26, "speedup_ratio": 25.23}}}
    (tmp_path / "t1.json").write_text(json.dumps(t1))
    (tmp_path / "sst.json").write_text(json.dumps({"best/test/fine": 0.5, "best/test/binary": 0.999,
                                                   "best/test/majority_fine": 0.29, "best/test/majority_binary": 0.52,
                                                   "time/mean_epoch_s": 20.04, "time/mean_records_per_s": 427.2,
                                                   "time/mean_build_share": 0.123}))
    (tmp_path / "ranges.yaml").write_text("full:\n  sst.test_fine: [45, 54]\n  sst.test_binary: [84, 91]\n"
                                          "  table1.inference.cost_big: [0.7, 1.3]\n")
    rows = reproduction.summary_rows(str(tmp_path / "t1.json"), str(tmp_path / "sst.json"),
                                     ranges_path=str(tmp_path / "ranges.yaml"))
    text = reproduction.markdown(rows)
    assert "| experiment | figure | ours | baseline | expected | paper | anchor | run |" in text
    assert ("| Table 1 (speed) | inference cost ratio dynamic/manual, batch 256 | **1.26** |  | 0.70 to 1.30 | 1.26 |"
            in text)
    assert ("| Table 2 (SST; GloVe 6B 50d; paper: 840B 300d) | test fine-grained accuracy % | **50.0** | 29.0 | "
            "45.0 to 54.0 | 52.3 | 51.0 |") in text
    assert "| test binary accuracy % | **99.9 (outside)** | 52.0 | 84.0 to 91.0 |" in text
    assert "| seconds per epoch (mean) | **20.0** |  |" in text
    assert "| trees per second, training (mean) | **427** |" in text
    assert "OUTSIDE the expected range: test binary accuracy %." in text and "NOT ABOVE" not in text
    assert [r.inside for r in rows if r.key.startswith("sst.test")] == [True, False]
    assert [r.above_baseline for r in rows if r.key.startswith("sst.test")] == [True, True]
    term = reproduction.terminal_table(rows).splitlines()
    assert term[1].split() == ["experiment", "figure", "ours", "baseline", "expected", "paper", "anchor"]
    assert "99.9 OUTSIDE" in term[1 + 1 + 7] and "84.0-91.0" in term[1 + 1 + 7]
    assert term[-1] == "OUTSIDE the expected range: test binary accuracy %"

    out = tmp_path / "summary.md"   # the repository's ranges, files beside the Markdown
    rows = reproduction.run(table1=str(tmp_path / "t1.json"), sst=str(tmp_path / "sst.json"), out=str(out),
                            mlflow=False, log=lambda s: None)
    assert len(rows) == 6 + 5
    records = json.loads((tmp_path / "summary.json").read_text())
    assert records[0]["figure"].startswith("inference cost ratio") and records[-1]["ours"] == 0.12
    assert [(r["baseline"], r["above_baseline"]) for r in records if r["key"].startswith("sst.test")] == [
        (29.0, True), (52.0, True)]
    assert (tmp_path / "summary.csv").read_text().splitlines()[0].startswith("experiment,figure,ours,expected_low")


def test_reproduction_summary_of_a_seed_sweep(tmp_path):
    """The Table 2 rows from ``pipelines.sweep --seeds N``'s result JSON: mean (sd) over the seeds
    and the ensemble beside the paper's rows, then the timings."""
    import json

    from benchmarks import reproduction
    sweep = {"run_id": None, "n_finished": 8, "best/test/fine": 0.5012, "best/test/binary": 0.8751,
             "sd/best/test/fine": 0.0071, "sd/best/test/binary": 0.0043,
             "ensemble/test/fine": 0.5213, "ensemble/test/binary": 0.8894, "time/mean_epoch_s": 20.0,
             "best/test/majority_fine": 0.2864, "best/test/majority_binary": 0.5008,
             "ensemble/test/majority_binary": 0.5008, "config_name": "sst-treelstm", "embeddings": None}
    (tmp_path / "sst.json").write_text(json.dumps(sweep))
    (tmp_path / "ranges.yaml").write_text("full:\n  sst.test_fine: [45, 54]\n")
    rows = reproduction.summary_rows(sst=str(tmp_path / "sst.json"), ranges_path=str(tmp_path / "ranges.yaml"))
    assert [r.key for r in rows[:4]] == ["sst.test_fine", "sst.test_binary", "sst.ensemble_fine",
                                         "sst.ensemble_binary"]
    text = reproduction.markdown(rows)
    assert ("| Table 2 (SST; paper preset, GloVe 6B 50d; paper: 840B 300d) | test fine-grained accuracy %, mean (sd) "
            "over 8 seeds (paper: sd 0.7 over 30) | **50.1 (0.7)** | 28.6 | 45.0 to 54.0 | 52.3 | 51.0 |") in text
    assert "| test binary accuracy %, ensemble of 8 (paper: of 30) | **88.9** | 50.1 |  | 90.2 |  |" in text
    assert "| test fine-grained accuracy %, ensemble of 8 (paper: of 30) | **52.1** |  |  | 53.6 |  |" in text
    assert rows[0].record()["sd"] == 0.7
    assert "50.1 (0.7)" in reproduction.terminal_table(rows)


def test_the_tai_preset_is_compared_with_tai_et_al_only(tmp_path):
    """A run of ``conf/sst_tai2015.yaml`` is not the paper's model: its rows name Tai et al. and
    their protocol, and carry no paper (Looks et al.) figure to be compared with."""
    import json

    from benchmarks import reproduction

    (tmp_path / "sst.json").write_text(json.dumps({
        "n_finished": 8, "best/test/fine": 0.477, "best/test/binary": 0.858, "ensemble/test/fine": 0.488,
        "ensemble/test/binary": 0.872, "best/test/majority_fine": 0.286, "best/test/majority_binary": 0.501,
        "config_name": "sst-tai2015", "embeddings": None}))
    (tmp_path / "ranges.yaml").write_text("full: {}\n")
    rows = reproduction.summary_rows(sst=str(tmp_path / "sst.json"), ranges_path=str(tmp_path / "ranges.yaml"))
    sst = [r for r in rows if r.key.startswith("sst.") and r.key[4:] in
           ("test_fine", "test_binary", "ensemble_fine", "ensemble_binary")]
    assert len(sst) == 4 and all(r.paper is None for r in sst)
    assert [r.anchor for r in sst[:2]] == [51.0, 88.0]
    assert all(r.experiment == "Tai et al. 2015 (SST; Tai et al. preset, GloVe 6B 50d; Tai: 840B 300d, binary "
                               "from a binary model)" for r in rows)
    assert "paper" not in sst[0].figure and "paper" not in sst[2].figure


def test_a_figure_not_above_its_trivial_baseline_is_flagged(tmp_path):
    """Each accuracy stands beside its trivial baseline: SST's the majority class of the evaluated
    test trees (``best/test/majority_*``, ``ensemble/test/majority_*`` of the result JSON), Tox21's
    chance AUC 0.5.  A figure not above it is flagged even inside its expected range (a model that
    always says "positive" scored 92.1 binary on a 92%-positive slice), and the summary does not
    say that all is well."""
    import json

    from benchmarks import reproduction
    sst = {"n_finished": 2, "best/test/fine": 0.478, "best/test/binary": 0.921,
           "best/test/majority_fine": 0.478, "best/test/majority_binary": 0.921,
           "ensemble/test/fine": 0.41, "ensemble/test/binary": 0.80,
           "ensemble/test/majority_fine": 0.2864, "ensemble/test/majority_binary": 0.5008}
    (tmp_path / "sst.json").write_text(json.dumps(sst))
    (tmp_path / "tox21.json").write_text(json.dumps({"best/test/auc": 0.49}))
    (tmp_path / "ranges.yaml").write_text("quick:\n  sst.test_fine: [30, 58]\n  sst.test_binary: [70, 95]\n"
                                          "  sst.ensemble_binary: [70, 95]\n  tox21.test_auc: [0.4, 0.85]\n")
    rows = reproduction.summary_rows(sst=str(tmp_path / "sst.json"), tox21=str(tmp_path / "tox21.json"), quick=True,
                                     ranges_path=str(tmp_path / "ranges.yaml"))
    by_key = {r.key: r for r in rows}
    assert [(k, by_key[k].baseline, by_key[k].inside, by_key[k].above_baseline) for k in (
        "sst.test_fine", "sst.test_binary", "sst.ensemble_fine", "sst.ensemble_binary", "tox21.test_auc")] == [
        ("sst.test_fine", pytest.approx(47.8), True, False), ("sst.test_binary", pytest.approx(92.1), True, False),
        ("sst.ensemble_fine", pytest.approx(28.64), None, True),
        ("sst.ensemble_binary", pytest.approx(50.08), True, True),
        ("tox21.test_auc", 0.5, True, False)]
    assert by_key["sst.epoch_s"].baseline is None and by_key["sst.epoch_s"].above_baseline is None
    text = reproduction.markdown(rows, quick=True)
    assert "| **92.1 (not above baseline)** | 92.1 | 70.0 to 95.0 |" in text
    assert "| **0.490 (not above baseline)** | 0.500 | 0.400 to 0.850 |" in text
    assert ("NOT ABOVE the trivial baseline (the model learned nothing measurable): test fine-grained accuracy %, "
            "mean (sd) over 2 seeds (paper: sd 0.7 over 30); test binary accuracy %, mean (sd) over 2 seeds "
            "(paper: sd 0.4 over 30); mean test ROC-AUC (12 tasks).") in text
    assert "All figures" not in text and "OUTSIDE" not in text
    term = reproduction.terminal_table(rows, quick=True).splitlines()
    assert "92.1 NOT ABOVE BASELINE" in term[3] and term[-1].startswith("NOT ABOVE the trivial baseline: ")
    above = dict(sst, **{"best/test/majority_fine": 0.30, "best/test/majority_binary": 0.52})
    (tmp_path / "sst.json").write_text(json.dumps(above))
    rows = reproduction.summary_rows(sst=str(tmp_path / "sst.json"), quick=True,
                                     ranges_path=str(tmp_path / "ranges.yaml"))
    assert reproduction.markdown(rows, quick=True).endswith(
        "All figures inside their expected ranges and above their baselines.\n")


@pytest.mark.parametrize("section", ["full", "quick"])
def test_expected_ranges_start_above_the_trivial_baselines(section):
    """The repository's expected ranges (conf/reproduce.yaml) start above what a model that learned
    nothing scores: the majority class of SST's test split (633 of 2210 roots fine-grained, 912 of
    1821 non-neutral roots binary) and chance ROC-AUC."""
    from benchmarks import reproduction
    ranges = reproduction.expected_ranges(section == "quick")
    baselines = {"sst.test_fine": 100 * 633 / 2210, "sst.ensemble_fine": 100 * 633 / 2210,
                 "sst.test_binary": 100 * 912 / 1821, "sst.ensemble_binary": 100 * 912 / 1821,
                 "tox21.test_auc": reproduction.CHANCE_AUC}
    for key, base in baselines.items():
        assert ranges[key][0] > base, (section, key, ranges[key], base)
