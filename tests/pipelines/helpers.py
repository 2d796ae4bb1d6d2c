"""Helpers shared by the pipeline tests."""
from __future__ import annotations

import os

import mlflow
import torch

from pipelines.config import load_config, merged_schema

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def finished_run(tracking_uri: str, experiment: str, run_id: str):
    """The MLflow run ``run_id`` of ``experiment``; asserts it exists once and FINISHED."""
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list",
                              filter_string=f"attributes.run_id = '{run_id}'")
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"
    return runs[0]


def sst_lines(data_dir, n: int) -> list:
    """``n`` short real SST trees (PTB lines) from ``<data_dir>/sst/dev.txt``, in file order:
    test inputs come from the datasets, not from copies in the repository."""
    with open(f"{data_dir}/sst/dev.txt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(300), f)]
    short = sorted(range(len(lines)), key=lambda i: (len(lines[i]), i))[:n]
    return [lines[i] for i in sorted(short)]


def esol_smiles(data_dir, n: int) -> list:
    """The first ``n`` SMILES of ``<data_dir>/molecules/esol.csv``."""
    import csv
    with open(f"{data_dir}/molecules/esol.csv", newline="") as f:
        return [row["smiles"].strip() for _, row in zip(range(n), csv.DictReader(f))]


def source_records(source) -> list:
    """The records of a :class:`pipelines.data.splits.SplitSource` in position order (checks that
    the positions are 0..n-1, each once)."""
    import pickle

    rows = source.dataset.take_all()
    pos = [int(r["pos"]) for r in rows]
    assert sorted(pos) == list(range(source.n)), "positions must be 0..n-1, each once"
    out = [None] * source.n
    for r in rows:
        out[int(r["pos"])] = pickle.loads(r["rec"])
    return out


def read_records(experiment, config):
    """``experiment.read_splits(config)`` and its records per split (brought to the caller)."""
    splits = experiment.read_splits(config)
    return splits, {name: source_records(src) for name, src in splits.sources.items()}


def untrained_sst(data_dir):
    """``(experiment, config, model_context, compiled model, lines)``: the SST model (state 6,
    embeddings 5) over the vocabulary of the first 8 of 12 short real dev trees, freshly
    initialised after ``torch.manual_seed(0)``; ``lines`` are the 12 PTB lines."""
    from pipelines.sst.data import parse_line
    from pipelines.sst.experiment import SCHEMA, SSTContext, SSTExperiment
    from pipelines.sst.vocab import build_vocab

    lines = sst_lines(data_dir, 12)
    exp = SSTExperiment()
    cfg = load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"), ["sst.state_size=6"], merged_schema(SCHEMA))
    vocab = build_vocab([parse_line(x) for x in lines[:8]])       # the last 4 trees hold unknown words
    torch.manual_seed(0)
    model = exp.batch_builder(cfg, SSTContext(vocab=vocab, emb_dim=5, embeddings=None))
    return exp, cfg, exp.model_context(cfg, SSTContext(vocab=vocab, emb_dim=5, embeddings=None)), model, lines


def untrained_esol():
    """``(experiment, config, model_context, compiled model)``: a small ESOL weave model with
    target scaling mean -3, std 2, freshly initialised after ``torch.manual_seed(0)``."""
    from pipelines.molecules.experiment import SCHEMA, MoleculeExperiment, TargetScaling

    exp = MoleculeExperiment("esol")
    cfg = load_config(os.path.join(REPO, "conf", "molecules_esol.yaml"),
                      ["molecules.atom_hidden=4", "molecules.pair_hidden=3", "molecules.mol_hidden=5"],
                      merged_schema(SCHEMA))
    scaling = TargetScaling(-3.0, 2.0)
    torch.manual_seed(0)
    model = exp.build_model(cfg, scaling)
    return exp, cfg, exp.model_context(cfg, scaling), model


def parsed_records(data, positions=None) -> list:
    """The records (unpickled) of ``data`` (a ``pipelines.data.sources.ParsedData``) in file
    order, or those at ``positions`` (ranks among the good records); brings them to the caller."""
    import pickle

    want = None if positions is None else set(int(data.good_idx[p]) for p in positions)
    out = []
    for row in data.dataset.iter_rows():
        if want is None or int(row["idx"]) in want:
            out.append((int(row["idx"]), pickle.loads(row["rec"])))
    out.sort(key=lambda x: x[0])
    return [r for _, r in out]


def read_until(proc, marker: str, timeout_s: float = 300.0) -> str:
    """The output of the text-mode ``subprocess.Popen`` ``proc`` (stdout, stderr merged into it)
    up to and including the line holding ``marker`` (a serving command's banner); fails when the
    process ends or ``timeout_s`` passes first, showing what it printed."""
    import time

    deadline, out = time.monotonic() + timeout_s, ""
    while marker not in out:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, out
        out += line
        assert time.monotonic() < deadline, out
    return out


def stop_process_group(proc, timeout_s: float = 90.0) -> None:
    """Ctrl-C (SIGINT) to the process group of ``proc`` (started with ``start_new_session=True``)
    unless it has ended, then wait up to ``timeout_s``; SIGKILL the group and raise
    ``subprocess.TimeoutExpired`` when it does not stop in time."""
    import signal
    import subprocess

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
