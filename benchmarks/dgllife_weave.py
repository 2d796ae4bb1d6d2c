"""dgllife's weave model at its best, in its own process, for :mod:`benchmarks.tox21_peers`.

dgl and dgllife need a torch of their own (dgl 2.1's graphbolt is built for torch 2.2 at the
newest), so they run in their own interpreter: ``bash scripts/make_dgllife_venv.sh`` makes
``.venv-dgllife`` (torch 2.2.1, dgl 2.1.0, dgllife 0.3.2, RDKit), and
``python -m benchmarks.tox21_peers --dgllife-python .venv-dgllife/bin/python`` drives this module
there (``python -m benchmarks.dgllife_weave --serve``, the wire format of
:mod:`benchmarks.peer_process`).  This module imports neither foldengine nor pipelines.

The model and data path are dgllife's own, as its MoleculeNet example
(``examples/property_prediction/moleculenet``) writes them for ``Weave``:

* featurisation: ``smiles_to_complete_graph(smiles, add_self_loop=True,
  node_featurizer=WeaveAtomFeaturizer(), edge_featurizer=WeaveEdgeFeaturizer(max_distance=2))``:
  a complete graph with self loops (``N x N`` edges, as the weave model's pair features),
  27 atom and 12 pair features;
* batching: ``dgl.batch`` of the batch's graphs (the example's ``collate_molgraphs``), labels
  stacked;
* model: ``WeavePredictor(node_in_feats, edge_in_feats, num_gnn_layers, gnn_hidden_feats,
  graph_feats, gaussian_expand, n_tasks)``; ``gaussian_expand=False`` is the sum readout
  (``gather: sum`` of the foldengine model), the last layer atoms only (``node_only=True``, as
  foldengine's ``pair_output=False``);
* loss: binary cross-entropy with logits over the labelled entries (NaN labels masked), summed,
  divided by tasks and molecules (the foldengine epoch's arithmetic); Adam.

The one difference of model: dgllife puts a ``BatchNorm1d`` after its atom-to-molecule layer;
foldengine's weave model does not.  It runs on one CPU thread.

Requests (each timed one answers with the process's own ``(wall_s, cpu_s, ...)``):

* ``("featurise", smiles)`` -> ``(wall_s, cpu_s, n_graphs)``: dgllife's featurisation of every
  SMILES (RDKit parse included), the one-time cost;
* ``("data", smiles, labels)`` -> ``kept``: featurise and keep the graphs (indices of the SMILES
  dgllife could featurise);
* ``("model", n_tasks, sizes, lr, seed, batch)`` -> ``n_parameters``: a new model and optimizer,
  the kept graphs cut into batches of ``batch``;
* ``("epoch",)`` -> ``(wall_s, cpu_s, (batch_s, step_s))``: one training epoch;
* ``("infer", smiles, batch)`` -> ``(wall_s, cpu_s, probabilities)``: from SMILES, featurisation
  and batching included, eval mode, sigmoid of the logits (NaN rows for SMILES dgllife rejects).

Arrays cross the pipe as lists: the peer's numpy (1.26 beside torch 2.2) cannot unpickle numpy 2's.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .peer_process import PeerProcess, reply_stream, serve_loop

__all__ = ["DgllifeWeave", "DgllifeProcess", "available", "main"]

#: the weave sizes of ``conf/molecules_tox21.yaml`` as dgllife's arguments
DEFAULT_SIZES = {"num_gnn_layers": 2, "gnn_hidden_feats": 50, "graph_feats": 128, "gaussian_expand": False}


class DgllifeWeave:
    """dgllife's featurisation, batching and ``WeavePredictor`` (module docstring)."""

    def __init__(self):
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import torch
        from dgllife.utils import WeaveAtomFeaturizer, WeaveEdgeFeaturizer

        from rdkit import RDLogger
        RDLogger.DisableLog("rdApp.*")   # a rejected SMILES is counted, not printed
        torch.set_num_threads(1)
        self.torch = torch
        self.node_featurizer = WeaveAtomFeaturizer()
        self.edge_featurizer = WeaveEdgeFeaturizer(max_distance=2)
        self.graphs: List = []
        self.labels: Optional[np.ndarray] = None
        self.model = self.optimizer = None
        self.chunks: List[Tuple] = []

    def graph(self, smiles: str):
        """One molecule's complete graph with self loops, or ``None`` when RDKit rejects it."""
        from dgllife.utils import smiles_to_complete_graph
        return smiles_to_complete_graph(smiles, add_self_loop=True, node_featurizer=self.node_featurizer,
                                        edge_featurizer=self.edge_featurizer)

    def featurise(self, smiles: Sequence[str]) -> Tuple[float, float, int]:
        c0, t0 = time.process_time(), time.perf_counter()
        graphs = [self.graph(s) for s in smiles]
        return time.perf_counter() - t0, time.process_time() - c0, sum(g is not None for g in graphs)

    def data(self, smiles: Sequence[str], labels: np.ndarray) -> List[int]:
        graphs = [self.graph(s) for s in smiles]
        kept = [i for i, g in enumerate(graphs) if g is not None]
        self.graphs = [graphs[i] for i in kept]
        self.labels = np.asarray(labels, np.float32)[kept]
        return kept

    def build(self, n_tasks: int, sizes: Dict, lr: float, seed: int, batch: int) -> int:
        import dgl
        from dgllife.model import WeavePredictor
        torch = self.torch
        torch.manual_seed(seed)
        self.model = WeavePredictor(self.node_featurizer.feat_size(), self.edge_featurizer.feat_size(),
                                    n_tasks=int(n_tasks), **{**DEFAULT_SIZES, **sizes})
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.chunks = [(self.graphs[a:a + batch], torch.from_numpy(self.labels[a:a + batch]))
                       for a in range(0, len(self.graphs), batch)]
        self._dgl_batch = dgl.batch
        return sum(p.numel() for p in self.model.parameters())

    def epoch(self) -> Tuple[float, float, Tuple[float, float]]:
        torch, model, opt = self.torch, self.model, self.optimizer
        model.train()
        clock = time.perf_counter
        c0, t0 = time.process_time(), clock()
        build = step = 0.0
        for graphs, labels in self.chunks:
            a = clock()
            g = self._dgl_batch(graphs)
            b = clock()
            opt.zero_grad(set_to_none=True)
            logits = model(g, g.ndata["h"], g.edata["e"])
            mask = ~torch.isnan(labels)
            y = torch.where(mask, labels, torch.zeros_like(labels))
            per = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
            loss = torch.where(mask, per, torch.zeros_like(per)).sum()
            (loss / labels.shape[1] / len(graphs)).backward()
            opt.step()
            build, step = build + (b - a), step + (clock() - b)
        return clock() - t0, time.process_time() - c0, (build, step)

    def infer(self, smiles: Sequence[str], batch: int) -> Tuple[float, float, np.ndarray]:
        torch, model = self.torch, self.model
        model.eval()
        c0, t0 = time.process_time(), time.perf_counter()
        n_tasks = model.predict.out_features
        out = np.full((len(smiles), n_tasks), np.nan, np.float32)
        with torch.no_grad():
            for a in range(0, len(smiles), batch):
                graphs = [self.graph(s) for s in smiles[a:a + batch]]
                idx = [a + i for i, g in enumerate(graphs) if g is not None]
                if idx:
                    g = self._dgl_batch([x for x in graphs if x is not None])
                    out[idx] = torch.sigmoid(model(g, g.ndata["h"], g.edata["e"])).numpy()
        return time.perf_counter() - t0, time.process_time() - c0, out.tolist()


def serve(stdin=None, stdout=None) -> None:
    """The dgllife process's loop (module docstring's requests)."""
    w = DgllifeWeave()
    serve_loop({"featurise": w.featurise, "data": w.data, "model": w.build, "epoch": w.epoch,
                "infer": w.infer}, stdin, stdout)


class DgllifeProcess(PeerProcess):
    """dgllife in its own process (``python``: an interpreter where dgl and dgllife import,
    ``.venv-dgllife/bin/python`` after ``bash scripts/make_dgllife_venv.sh``)."""

    def __init__(self, python: Optional[str] = None):
        super().__init__("benchmarks.dgllife_weave", python, name="dgllife", env={"DGLBACKEND": "pytorch"})

    def featurise(self, smiles: Sequence[str]) -> Tuple[float, float, int]:
        return self.call("featurise", list(smiles))

    def data(self, smiles: Sequence[str], labels: np.ndarray) -> List[int]:
        # plain lists both ways: the peer's numpy may be another major version than ours
        return self.call("data", list(smiles), np.asarray(labels, np.float32).tolist())

    def model(self, n_tasks: int, sizes: Dict, lr: float, seed: int, batch: int) -> int:
        return self.call("model", int(n_tasks), dict(sizes), float(lr), int(seed), int(batch))

    def epoch(self) -> Tuple[float, float, Tuple[float, float]]:
        return self.call("epoch")

    def infer(self, smiles: Sequence[str], batch: int) -> Tuple[float, float, np.ndarray]:
        wall, cpu, rows = self.call("infer", list(smiles), int(batch))
        return wall, cpu, np.asarray(rows, np.float32)


def available(python: Optional[str] = None) -> Tuple[bool, str]:
    """``(True, version line)`` when dgl and dgllife import in ``python`` (default this
    interpreter); else ``(False, why)``."""
    import subprocess
    code = ("import torch, dgl, dgllife, rdkit; "
            "print(f'torch {torch.__version__}, dgl {dgl.__version__}, dgllife {dgllife.__version__}, "
            "rdkit {rdkit.__version__}')")
    env = {**os.environ, "DGLBACKEND": "pytorch"}
    try:
        res = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"import dgllife failed: {err}"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"import dgllife failed: {last}"
    return True, res.stdout.strip().splitlines()[-1]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks.dgllife_weave --serve``: the dgllife process (:func:`serve`)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.dgllife_weave",
                                 description="The dgllife process of benchmarks.tox21_peers: requests on stdin, "
                                             "replies on stdout (see the module docstring).")
    ap.add_argument("--serve", action="store_true", required=True, help="answer requests until stdin closes")
    ap.parse_args(argv)
    serve(sys.stdin.buffer, reply_stream())
    return 0


if __name__ == "__main__":
    sys.exit(main())
