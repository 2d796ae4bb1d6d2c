"""A tiny Experiment for testing pipelines.training.run: 3-class classification of synthetic points.

Records are dicts ``{"x": [8 floats], "y": int, "kind": 0|1}``; kind-1 records go through an
extra layer, so a sub-batch without kind-1 records leaves parameters unused (what dynamic
batching does to DDP).  The "batch" is a picklable dict of numpy arrays built in Ray Data.
``toy.fail_at_call``/``toy.fail_marker`` make one training worker ``os._exit`` once;
``toy.pause_at_call``/``toy.pause_marker`` make one training worker stop (sleep ``toy.pause_s``) once,
mid-step, so a test can kill its node at a known point; ``toy.trace_dir`` makes every training
worker record its pid, rank and Ray node id there (one ``<pid>.json`` each).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pandas as pd
import torch

from pipelines.config import Field
from pipelines.experiment import Experiment
from pipelines.model.prediction import Predictor

DIM, CLASSES = 8, 3


def make_records(n: int, seed: int, bad_every: int = 0) -> list:
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(1234).normal(size=(CLASSES, DIM)) * 0.6
    out = []
    for i in range(n):
        y = int(rng.integers(CLASSES))
        x = centers[y] + rng.normal(size=DIM)
        rec = {"x": x.astype(np.float32).tolist(), "y": y, "kind": int(rng.random() < 0.3)}
        if bad_every and i % bad_every == bad_every - 1:
            rec = {"x": None, "y": y, "kind": 0}  # unparsable
        out.append(rec)
    return out


def _whereami() -> dict:
    """This training worker's pid, world rank and Ray node id."""
    import ray
    import ray.train

    return {"pid": os.getpid(), "rank": ray.train.get_context().get_world_rank(),
            "node_id": ray.get_runtime_context().get_node_id()}


def _toy_rows(table, n, seed, bad_every):
    """Ray Data task: ids -> ``pos`` (rank among the good records) and ``rec`` (pickled)."""
    import pickle

    import pyarrow as pa

    recs = make_records(n, seed, bad_every)
    ids = np.asarray(table.column("id"), np.int64)
    if bad_every:
        ids = ids[ids % bad_every != bad_every - 1]
        pos = ids - (ids + 1) // bad_every
    else:
        pos = ids
    return pa.table({"pos": pa.array(pos, pa.int64()),
                     "rec": pa.array([pickle.dumps(recs[int(i)]) for i in ids], pa.binary())})


class ToyNet(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.embed = torch.nn.Linear(DIM, hidden)
        self.extra = torch.nn.Linear(hidden, hidden)  # only for kind-1 records
        self.out = torch.nn.Linear(hidden, CLASSES)
        self.metrics: dict = {}

    def forward(self, batch):
        h = torch.tanh(self.embed(torch.from_numpy(batch["x"])))
        kind = torch.from_numpy(batch["kind"]).bool()
        if kind.any():
            h = torch.where(kind[:, None], torch.tanh(self.extra(h)), h)
        return self.out(h)


class ToyExperiment(Experiment):
    name = "toy"
    selection_metric = "accuracy"
    selection_mode = "max"
    config_schema = {
        "toy.n_train": Field(int, 240, min=8),
        "toy.n_dev": Field(int, 60, min=0),
        "toy.n_test": Field(int, 60, min=0),
        "toy.hidden": Field(int, 16, min=1),
        "toy.bad_every": Field(int, 0, min=0, doc="every k-th train record is unparsable"),
        "toy.embed_lr_scale": Field(float, 1.0, min=0.0),
        "toy.fail_at_call": Field(int, 0, min=0, doc="os._exit at this loss() call (0 = never)"),
        "toy.fail_marker": Field(str, None, nullable=True, doc="file guarding the single failure"),
        "toy.pause_at_call": Field(int, 0, min=0, doc="sleep at this loss() call (0 = never)"),
        "toy.pause_marker": Field(str, None, nullable=True, doc="file guarding the single pause"),
        "toy.pause_s": Field(float, 600.0, min=0.0, doc="how long the pause lasts"),
        "toy.trace_dir": Field(str, None, nullable=True, doc="training workers record pid/rank/node"),
    }

    def __init__(self):
        self._calls = 0
        self._fail = (0, None)
        self._pause = (0, None, 0.0)

    def read_splits(self, config):
        """The splits made in Ray Data tasks (rows ``pos`` / ``rec``, pickled; the driver holds
        no record): the same as ``tests/pipelines/reference_splits.toy_splits``."""
        import ray.data

        from pipelines.data.skips import SkippedRecord, SkipReport
        from pipelines.data.splits import SplitSource, StreamSplits

        t = config["toy"]
        seed = config["seed"]
        bad_every = t["bad_every"]
        bad = t["n_train"] // bad_every if bad_every else 0
        if bad and not config["data"]["skip_bad"]:
            raise ValueError("unparsable toy record (use data.skip_bad=true)")
        sources = {}
        for split, n, s, be in (("train", t["n_train"], seed, bad_every), ("dev", t["n_dev"], seed + 1, 0),
                                ("test", t["n_test"], seed + 2, 0)):
            ds = ray.data.range(n, override_num_blocks=min(max(n, 1), 4)).map_batches(
                _toy_rows, batch_format="pyarrow", batch_size=None, fn_kwargs=dict(n=n, seed=s, bad_every=be))
            sources[split] = SplitSource(ds, n - (n // be if be else 0))
        skipped = SkipReport(config["data"]["skip_report_max"])
        skipped.count("train/unparsable", bad, [
            SkippedRecord("train/unparsable", f"toy train record {i}", "x is missing", id=str(i), order=i)
            for i in range(bad_every - 1, t["n_train"], bad_every)] if bad else [])
        return StreamSplits(sources, skipped)

    def build_model(self, config, context):
        self._fail = (config["toy"]["fail_at_call"], config["toy"]["fail_marker"])
        self._pause = (config["toy"]["pause_at_call"], config["toy"]["pause_marker"],
                       config["toy"]["pause_s"])
        torch.manual_seed(config["seed"])
        return ToyNet(config["toy"]["hidden"])

    def make_batch(self, builder, records):
        return {"x": np.asarray([r["x"] for r in records], dtype=np.float32),
                "y": np.asarray([r["y"] for r in records], dtype=np.int64),
                "kind": np.asarray([r["kind"] for r in records], dtype=np.int64)}

    def _maybe_fail(self):
        self._calls += 1
        at, marker = self._fail
        if at and marker and self._calls == at:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, f"pid {os.getpid()} call {self._calls}\n".encode())
            os.close(fd)
            os._exit(3)

    def _maybe_pause(self):
        at, marker, seconds = self._pause
        if at and marker and self._calls == at:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, json.dumps(_whereami()).encode())
            os.close(fd)
            time.sleep(seconds)

    def _forward(self, model, batch):
        logits = model(batch)
        y = torch.from_numpy(batch["y"])
        loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
        correct = float((logits.argmax(-1) == y).sum())
        return loss, {"loss_sum": float(loss.detach()), "correct": correct, "count": float(len(y))}

    def loss(self, model, batch):
        self._maybe_fail()
        self._maybe_pause()
        return self._forward(model, batch)

    def eval_stats(self, model, batch):
        return self._forward(model, batch)[1]

    def summarize(self, sums):
        n = max(sums.get("count", 0.0), 1.0)
        return {"accuracy": sums.get("correct", 0.0) / n, "loss": sums.get("loss_sum", 0.0) / n}

    def param_groups(self, model, config):  # called once per training worker (pipelines.training.worker.setup)
        if config["toy"]["trace_dir"]:
            me = _whereami()
            with open(os.path.join(config["toy"]["trace_dir"], f"{me['pid']}.json"), "w") as f:
                json.dump(me, f)
        o = config["optimizer"]
        return [{"params": list(model.embed.parameters()),
                 "lr": o["lr"] * config["toy"]["embed_lr_scale"], "weight_decay": 0.0},
                {"params": list(model.extra.parameters()) + list(model.out.parameters())}]

    def results_table(self, best):
        ours = {"model": "toy MLP (ours)", "dev accuracy": best.get("dev/accuracy"),
                "test accuracy": best.get("test/accuracy"), "epoch": best.get("epoch")}
        paper = {"model": "oracle (paper)", "dev accuracy": 1.0, "test accuracy": 1.0, "epoch": None}
        return pd.DataFrame([paper, ours])

    def after_run(self, run, tracker):
        """Inside the run: a figure of the dev accuracy per epoch and the number of epochs seen,
        so tests can tell that a command-line run and a sweep trial both ran it."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([h["epoch"] for h in run.history], [h.get("dev/accuracy", 0.0) for h in run.history])
        tracker.figures([("after_run_dev_accuracy", fig)])
        return {"toy/after_run_epochs": float(len(run.history))}

    # ------------------------------------------------------------------ the exported model

    def model_context(self, config, context):
        """Nothing besides the weights and the config: the input is the point itself."""
        return {"dim": DIM}

    def predictor(self, config, model_context, state_dict):
        net = ToyNet(config["toy"]["hidden"])
        net.load_state_dict(state_dict)
        return ToyPredictor(net.eval())

    def example_inputs(self):
        return [",".join(["0.5"] * DIM), ",".join(["-1.0"] * DIM)]


class ToyPredictor(Predictor):
    """Raw input: ``DIM`` comma-separated floats (a kind-0 point); output: the class and its
    probabilities."""

    input_column = "point"
    output_columns = ("label",) + tuple(f"prob_{c}" for c in range(CLASSES))
    int_columns = ("label",)
    max_size = DIM
    size_unit = "values"

    def __init__(self, net: ToyNet):
        self.net = net

    def parse(self, raw):
        values = [float(v) for v in str(raw).split(",")]
        if len(values) > self.max_size:
            raise self.too_large(len(values), "the toy model's input size")
        if len(values) != DIM:
            raise ValueError(f"a toy point has {DIM} values, got {len(values)}")
        return values

    def run(self, parsed, **options):
        batch = {"x": np.asarray(parsed, np.float32), "kind": np.zeros(len(parsed), np.int64)}
        with torch.no_grad():
            probs = torch.softmax(self.net(batch), -1).numpy()
        return [{"label": int(p.argmax()), **{f"prob_{c}": float(p[c]) for c in range(CLASSES)}} for p in probs]
