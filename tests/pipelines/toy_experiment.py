"""A tiny Experiment for testing pipelines.train: 3-class classification of synthetic points.

Records are dicts ``{"x": [8 floats], "y": int, "kind": 0|1}``; kind-1 records go through an
extra layer, so a sub-batch without kind-1 records leaves parameters unused (what dynamic
batching does to DDP).  The "batch" is a picklable dict of numpy arrays built in Ray Data.
``toy.fail_at_call``/``toy.fail_marker`` make one training worker ``os._exit`` once.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch

from pipelines.config import Field
from pipelines.experiment import Experiment, Splits

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
    }

    def __init__(self):
        self._calls = 0
        self._fail = (0, None)

    def load_splits(self, config):
        t = config["toy"]
        seed = config["seed"]
        raw = make_records(t["n_train"], seed, t["bad_every"])
        train, bad = [], 0
        for r in raw:
            if r["x"] is None:
                if not config["data"]["skip_bad"]:
                    raise ValueError("unparsable toy record (use data.skip_bad=true)")
                bad += 1
                continue
            train.append(r)
        return Splits({"train": train, "dev": make_records(t["n_dev"], seed + 1),
                       "test": make_records(t["n_test"], seed + 2)}, {"train/unparsable": bad})

    def build_model(self, config, context):
        self._fail = (config["toy"]["fail_at_call"], config["toy"]["fail_marker"])
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

    def _forward(self, model, batch):
        logits = model(batch)
        y = torch.from_numpy(batch["y"])
        loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
        correct = float((logits.argmax(-1) == y).sum())
        return loss, {"loss_sum": float(loss.detach()), "correct": correct, "count": float(len(y))}

    def loss(self, model, batch):
        self._maybe_fail()
        return self._forward(model, batch)

    def eval_stats(self, model, batch):
        return self._forward(model, batch)[1]

    def summarize(self, sums):
        n = max(sums.get("count", 0.0), 1.0)
        return {"accuracy": sums.get("correct", 0.0) / n, "loss": sums.get("loss_sum", 0.0) / n}

    def param_groups(self, model, config):
        o = config["optimizer"]
        return [{"params": list(model.embed.parameters()),
                 "lr": o["lr"] * config["toy"]["embed_lr_scale"], "weight_decay": 0.0},
                {"params": list(model.extra.parameters()) + list(model.out.parameters())}]

    def results_table(self, best):
        ours = {"model": "toy MLP (ours)", "dev accuracy": best.get("dev/accuracy"),
                "test accuracy": best.get("test/accuracy"), "epoch": best.get("epoch")}
        paper = {"model": "oracle (paper)", "dev accuracy": 1.0, "test accuracy": 1.0, "epoch": None}
        return pd.DataFrame([paper, ours])
