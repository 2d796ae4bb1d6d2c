"""The house style of the per-epoch figures (pipelines.plots) and the experiments' plots, and the
headline figures a run puts on its MLflow page (pipelines.experiment.headline_tags,
pipelines.tracking.run_metadata.headline_note): integer epoch ticks, the legend outside the data,
a title, the trivial baseline dashed; every figure beside its baseline, flagged when not above."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

from pipelines.experiment import TableLayout, headline_tags
from pipelines.plots import Baseline, Panel, Series, epoch_figure
from pipelines.sst.experiment import SSTExperiment
from pipelines.sweep.report import TrialOutcome, curves_figure
from pipelines.tracking.run_metadata import entry_point_name, headline_note, markdown_table


def _history(epochs=3):
    return [{"epoch": e, "train/loss": 1.5 / e, "dev/loss": 1.6 / e, "dev/fine": 0.30 + 0.05 * e,
             "test/fine": 0.29 + 0.05 * e, "dev/binary": 0.6 + 0.08 * e, "test/binary": 0.6 + 0.07 * e,
             "test/majority_fine": 0.286, "test/majority_binary": 0.501, "dev/majority_fine": 0.25}
            for e in range(1, epochs + 1)]


def _outside(fig, ax) -> bool:
    """The axes' legend lies right of the axes (covers no data)."""
    fig.canvas.draw()
    legend = ax.get_legend()
    return legend is not None and legend.get_window_extent().x0 >= ax.get_window_extent().x1


def test_epoch_figure_has_integer_ticks_a_title_the_legend_outside_and_the_baseline_dashed():
    panel = Panel("fine root accuracy", "accuracy", [Series("dev/fine", "dev"), Series("test/fine", "test", "--")],
                  [Baseline(0.286, "majority class")])
    fig = epoch_figure(_history(3), [panel], title="title")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1, 2, 3]
    assert ax.get_title() == "fine root accuracy" and fig._suptitle.get_text() == "title"
    assert _outside(fig, ax)
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--" and set(line.get_ydata()) == {0.286}]
    assert dashed and "majority class (0.286)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_many_epochs_get_integer_ticks_only():
    fig = epoch_figure(_history(60), [Panel("loss", "loss", [Series("train/loss", "train")])])
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 60]
    assert ticks and all(float(t).is_integer() for t in ticks) and len(ticks) <= 21


def test_a_panel_without_data_is_left_out_and_no_data_gives_no_figure():
    panels = [Panel("a", "y", [Series("dev/fine", "dev")]), Panel("b", "y", [Series("dev/nothing", "dev")])]
    assert len(epoch_figure(_history(), panels).axes) == 1
    assert epoch_figure(_history(), panels[1:]) is None


def test_the_sst_plots_split_fine_and_binary_each_beside_its_majority_class():
    figs = dict(SSTExperiment().plots(_history()))
    assert set(figs) == {"loss", "root_accuracy"}
    fine, binary = figs["root_accuracy"].axes
    for ax, base in ((fine, 0.286), (binary, 0.501)):
        assert list(ax.get_xticks()) == [1, 2, 3] and _outside(figs["root_accuracy"], ax)
        assert any(line.get_linestyle() == "--" and set(line.get_ydata()) == {base} for line in ax.get_lines())
        assert len([l for l in ax.get_lines() if l.get_linestyle() != "--" or set(l.get_ydata()) != {base}]) == 2


def test_the_sweep_curves_show_the_dev_baseline_and_integer_epochs():
    trials = [TrialOutcome(f"t{i}", {"seed": i}, "FINISHED", 3, {"dev/majority_fine": 0.25},
                           [(e, 0.3 + 0.04 * e + 0.01 * i) for e in (1, 2, 3)]) for i in range(3)]
    base = SSTExperiment().baselines([trials[0].metrics], split="dev")["fine"]
    assert base == Baseline(0.25, "majority class, dev")
    fig = curves_figure(trials, "fine", "t1", "max", base)
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1, 2, 3] and _outside(fig, ax)
    assert any(set(line.get_ydata()) == {0.25} for line in ax.get_lines())


LAYOUT = TableLayout({"best/test/fine": "test fine", "best/test/binary": "test binary"}, scale=100.0,
                     baselines={"best/test/fine": "best/test/majority_fine",
                                "best/test/binary": "best/test/majority_binary"})


def test_headline_tags_put_each_figure_beside_its_baseline_and_flag_one_not_above_it():
    tags = headline_tags(LAYOUT, {"best/test/fine": 0.496, "best/test/binary": 0.40,
                                  "best/test/majority_fine": 0.286, "best/test/majority_binary": 0.501})
    assert tags == {"test fine": "49.6 (baseline 28.6)", "test binary": "40.0 (baseline 50.1, NOT ABOVE)"}
    auc = TableLayout({"best/test/auc": "test mean ROC-AUC"}, baselines={"best/test/auc": 0.5})
    assert headline_tags(auc, {"best/test/auc": 0.8312}) == {"test mean ROC-AUC": "0.831 (baseline 0.500)"}
    assert headline_tags(auc, {"best/test/auc": math.nan}) == {}


def test_headline_tags_of_a_sweep_give_the_mean_and_sd_over_seeds():
    tags = headline_tags(LAYOUT, {"mean/best/test/fine": 0.496, "sd/best/test/fine": 0.008,
                                  "mean/best/test/majority_fine": 0.286}, prefix="mean/", suffix=" mean")
    assert tags == {"test fine mean": "49.6 sd 0.8 (baseline 28.6)"}
    # a column name MLflow refuses as a tag name (commas, parentheses) is made one it takes
    odd = TableLayout({"best/test/r2": "test R2 (all, x100)"})
    assert list(headline_tags(odd, {"best/test/r2": 0.5})) == ["test R2  all  x100"]


def test_headline_note_renders_the_results_table_as_markdown_with_empty_cells_for_missing_values():
    table = pd.DataFrame([{"model": "ours", "test fine": 49.6, "best epoch": 13.0},
                          {"model": "paper | 30 runs", "test fine": None, "best epoch": math.nan}])
    note = headline_note("sst: trained", table)
    assert note.splitlines()[0] == "sst: trained"
    assert "| model | test fine | best epoch |" in note and "| ours | 49.6 | 13 |" in note
    assert "| paper \\| 30 runs |  |  |" in note and "nan" not in note.lower()
    assert markdown_table(table).count("\n") == 3


def test_the_entry_point_is_the_module_a_user_runs(monkeypatch):
    import sys
    import types

    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="pipelines.training.__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert entry_point_name() == "python -m pipelines.training"
    main.__spec__ = None
    monkeypatch.setattr(sys, "argv", ["/x/default_worker.py"])
    assert entry_point_name() == "default_worker.py"
