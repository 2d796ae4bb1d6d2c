"""A 2-layer graph attention network (GAT) from inputs: foldengine against a per-example loop.

The model (Velickovic et al. 2018), on graphs of ``N`` nodes with feature rows ``x_v``:

    z_v = W x_v  (H heads of D),   e_vu = LeakyReLU(a_dst . z_v + a_src . z_u)  for u in N(v) + {v}
    h_v = ELU(sum_u softmax_u(e_vu) z_u)  (heads concatenated), then a second layer (one head),
    y   = w . sum_v h_v  (a graph's output)

written with foldengine's blocks as a user would (``Map(Function(W))`` of the node rows,
:class:`~foldengine.blocks.MessagePassing` of an :class:`~foldengine.blocks.Aggregate` of the
attention over each node's neighbourhood), and as a per-example PyTorch loop with the same
modules: one graph at a time, each layer a few dense tensor operations over the graph's
``N x N`` masked attention (the peer at its best: tensor operations per graph, not per node).

Graphs are seeded and random: ``N`` uniform in ``[min_nodes, max_nodes]``, a random spanning
tree plus ``extra_edges x N`` random pairs, each edge both ways, no self loops or duplicates;
node features uniform in ``[0, 1)``.  Measured side by side in interleaved rounds (wall and
process CPU seconds, one thread):

* ``featurise``: the raw graphs (Python lists, as parsed from a file) into the model's inputs
  (a dict of a float32 ``[N, F]`` array and an int64 ``[2, E]`` edge array);
* ``trace``: ``compiler.trace(inputs)`` (``trace_templates_off``: the same with
  ``trace_templates.enabled = False``); ``build_batch``: ``compiler.build_batch(inputs)``
  (trace, merge, schedule, lower);
* ``fe_fwd_bwd``: ``compiler(batch)``, the loss, ``backward``;
* ``ref_fwd_bwd``: the per-example loop's forward, loss and backward.

The end-to-end ratio is ``(build_batch + fe_fwd_bwd) / ref_fwd_bwd`` per round (median and
quartiles over rounds; below 1: foldengine from inputs is faster).  Values and gradients of
the two are checked equal before timing.

    python -m benchmarks.gat [--graphs 200] [--batch-size 200] [--repeats 7] [--threads 1]
                             [--scheduler depth] [--mlflow]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import foldengine as fe
from foldengine import blocks as fb
from foldengine.segments import segment_first, segment_softmax, segment_sum

from .reporting import echo, format_table
from .timing import interleaved, ratio_quartiles

__all__ = ["RawGraph", "random_graphs", "featurise", "featurise_adjacency", "GATModules", "gat_block",
           "gat_block_per_node", "reference_forward", "check_equal", "VARIANTS", "run"]


class RawGraph(NamedTuple):
    """A graph as parsed from a file: node feature lists and undirected edges ``(u, v)``."""
    features: List[List[float]]
    edges: List[tuple]


def random_graphs(n: int, min_nodes: int = 1, max_nodes: int = 30, n_features: int = 8,
                  extra_edges: float = 0.2, seed: int = 0) -> List[RawGraph]:
    """``n`` seeded random graphs (see the module docstring)."""
    rng = random.Random(seed)
    graphs = []
    for _ in range(n):
        size = rng.randint(min_nodes, max_nodes)
        edges = {(rng.randrange(v), v) for v in range(1, size)}
        for _ in range(int(round(extra_edges * size))):
            u, v = rng.randrange(size), rng.randrange(size)
            if u != v:
                edges.add((min(u, v), max(u, v)))
        graphs.append(RawGraph([[rng.random() for _ in range(n_features)] for _ in range(size)], sorted(edges)))
    return graphs


def featurise(g: RawGraph) -> dict:
    """A raw graph as the model's input: ``x`` float32 ``[N, F]``, ``edges`` int64 ``[2, E]``
    (each undirected edge both ways)."""
    e = np.asarray(g.edges, np.int64).reshape(-1, 2).T
    return {"x": np.asarray(g.features, np.float32), "edges": np.concatenate([e, e[::-1]], axis=1)}


class HeadLinear(nn.Module):
    """``x [B, F] -> W x`` as ``[B, heads, dim]`` (no bias)."""

    def __init__(self, n_in: int, heads: int, dim: int):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.linear = nn.Linear(n_in, heads * dim, bias=False)

    def forward(self, x):
        return self.linear(x).view(-1, self.heads, self.dim)


class GATAttention(nn.Module):
    """One GAT layer's attention over neighbourhoods given as segments (an ``Aggregate``
    function): ``out_v = sum_u softmax_u(LeakyReLU(a_dst . z_v + a_src . z_u)) z_u``, where
    ``z_v`` (the receiving node) is the first row of each segment (``MessagePassing`` with
    self loops).

    Shape: ``z`` ``[R, heads, dim]``, ``segment`` ``[R]`` int64; returns ``[n, heads, dim]``.
    """

    def __init__(self, heads: int, dim: int, slope: float = 0.2):
        super().__init__()
        self.slope = slope
        self.a_src = nn.Parameter(torch.randn(heads, dim) / dim ** 0.5)
        self.a_dst = nn.Parameter(torch.randn(heads, dim) / dim ** 0.5)

    def scores(self, z_dst, z_src):
        """``[..., heads]`` scores of receivers ``z_dst`` and senders ``z_src`` (broadcast)."""
        return F.leaky_relu((z_dst * self.a_dst).sum(-1) + (z_src * self.a_src).sum(-1), self.slope)

    def forward(self, z, segment, n):
        receiver = z.index_select(0, segment_first(segment, n)).index_select(0, segment)
        alpha = segment_softmax(self.scores(receiver, z), segment, n)        # [R, heads]
        return segment_sum(alpha.unsqueeze(-1) * z, segment, n)


def elu_heads(z):
    """ELU, heads concatenated: ``[B, H, D] -> [B, H * D]``."""
    return F.elu(z).flatten(1)


def mean_heads(z):
    """The mean over heads: ``[B, H, D] -> [B, D]``."""
    return z.mean(1)


class GATModules(nn.Module):
    """The GAT's modules: two attention layers and a linear read-out of the sum of the nodes."""

    def __init__(self, n_features: int = 8, hidden: int = 16, heads: int = 2, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.n_features = n_features
        self.lin1, self.att1 = HeadLinear(n_features, heads, hidden), GATAttention(heads, hidden)
        self.lin2, self.att2 = HeadLinear(heads * hidden, 1, hidden), GATAttention(1, hidden)
        self.readout = nn.Linear(hidden, 1)


def gat_block(m: GATModules) -> fb.Block:
    """The GAT as blocks: ``{"x": [N, F] array, "edges": [2, E] array} -> Tensor([1])``."""
    def layer(lin, att, post, name):
        # (nodes, edges) -> (new nodes, edges)
        nodes = fb.AllOf(fb.GetItem(0) >> fb.Map(fb.Function(lin, name=f"{name}_lin")), fb.GetItem(1)) \
            >> fb.MessagePassing(fb.Aggregate(att, name=f"{name}_attention")) >> fb.Map(fb.Function(post))
        return fb.AllOf(nodes, fb.GetItem(1))

    graph = fb.Record([("x", fb.Map(fb.Vector(m.n_features))), ("edges", fb.Identity())])
    return (graph >> layer(m.lin1, m.att1, elu_heads, "layer1") >> layer(m.lin2, m.att2, mean_heads, "layer2")
            >> fb.GetItem(0) >> fb.Sum() >> fb.Function(m.readout, name="readout"))


class _Scores(nn.Module):
    """``(z_dst, z_src) -> [B, heads]``: a GAT layer's attention scores, one edge a row."""

    def __init__(self, att: GATAttention):
        super().__init__()
        self.att = att

    def forward(self, z_dst, z_src):
        return self.att.scores(z_dst, z_src)


def _shifted_exp(e, top):
    return torch.exp(e - top)


def _weigh(w, z):
    return w.unsqueeze(-1) * z


def _normalise(num, den):
    return num / den.unsqueeze(-1)


def featurise_adjacency(g: RawGraph) -> dict:
    """A raw graph as the per-node model's input: ``x`` float32 ``[N, F]`` and ``adj``, per
    node the list of its neighbours, itself first (the docs' graph tutorial's input)."""
    adj = [[v] for v in range(len(g.features))]
    for u, v in g.edges:
        adj[v].append(u)
        adj[u].append(v)
    return {"x": np.asarray(g.features, np.float32), "adj": adj}


def gat_block_per_node(m: GATModules) -> fb.Block:
    """The same GAT written per node and per edge from the docs' graph tutorial (``Broadcast``,
    ``Zip`` and ``Nth`` pick each neighbour's row) and the attention example (``Max``,
    ``ZipWith`` and two ``Sum`` blocks per node): ``{"x", "adj"} -> Tensor([1])``, the engine's
    only way to write it before ``MessagePassing``.  Tracing records a few nodes per edge."""
    def attention(att, name):
        scores = fb.Function(_Scores(att), name=f"{name}_scores")
        node = fb.Composition()
        with node.scope():                      # the neighbours' rows, the node's own first
            zs = fb.Identity().reads(node.input)
            e = fb.ZipWith(scores).reads((fb.GetItem(0) >> fb.Broadcast()).reads(zs), zs)
            top = (fb.Max() >> fb.Broadcast()).reads(e)
            w = fb.ZipWith(fb.Function(_shifted_exp)).reads(e, top)
            num = fb.Sum().reads(fb.ZipWith(fb.Function(_weigh)).reads(w, zs))
            node.output.reads(fb.Function(_normalise).reads(num, fb.Sum().reads(w)))
        return node

    def layer(lin, att, post, name):
        step = fb.Composition()
        with step.scope():
            z = fb.Map(fb.Function(lin, name=f"{name}_lin")).reads(step.input[0])
            per_node = fb.Zip().reads(fb.Broadcast().reads(z), fb.Map(fb.Identity()).reads(step.input[1]))
            neighbours = (fb.AllOf(fb.GetItem(0) >> fb.Broadcast(), fb.GetItem(1) >> fb.Map(fb.Identity()))
                          >> fb.Zip() >> fb.Map(fb.Nth()))
            h = fb.Map(neighbours >> attention(att, name) >> fb.Function(post)).reads(per_node)
            step.output.reads(h, step.input[1])
        return step

    graph = fb.Record([("x", fb.Map(fb.Vector(m.n_features))), ("adj", fb.Identity())])
    return (graph >> layer(m.lin1, m.att1, elu_heads, "layer1") >> layer(m.lin2, m.att2, mean_heads, "layer2")
            >> fb.GetItem(0) >> fb.Sum() >> fb.Function(m.readout, name="readout"))


def reference_forward(m: GATModules, g: dict) -> torch.Tensor:
    """One graph's output ``[1, 1]``, dense per graph: the ``N x N`` attention masked by the
    adjacency (with self loops), a softmax over senders, one ``einsum`` per layer."""
    x = torch.from_numpy(g["x"]).to(m.readout.weight.dtype)
    edges = torch.from_numpy(g["edges"])
    n = x.shape[0]
    adj = torch.eye(n, dtype=torch.bool)
    adj[edges[1], edges[0]] = True                                  # adj[receiver, sender]
    h = x
    for lin, att, post in ((m.lin1, m.att1, elu_heads), (m.lin2, m.att2, mean_heads)):
        z = lin(h)                                                   # [N, H, D]
        e = att.scores(z[:, None], z[None, :])                       # [N receivers, N senders, H]
        alpha = torch.softmax(e.masked_fill(~adj[:, :, None], float("-inf")), dim=1)
        h = post(torch.einsum("vuh,uhd->vhd", alpha, z))
    return m.readout(h.sum(0, keepdim=True))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return (out * out).sum()


def check_equal(m: GATModules, compiler: fe.Compiler, inputs: Sequence[dict], reference_inputs: Sequence[dict],
                **tolerances) -> float:
    """Assert that foldengine's outputs and gradients on ``inputs`` equal the per-example
    loop's on ``reference_inputs`` (the same graphs, through :func:`featurise`); returns the
    largest absolute difference seen."""
    m.zero_grad()
    out = compiler(compiler.build_batch(inputs))
    _loss(out).backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ref = torch.cat([reference_forward(m, g) for g in reference_inputs])
    _loss(ref).backward()
    torch.testing.assert_close(out, ref, **tolerances)
    worst = float((out - ref).detach().abs().max())
    for (name, p), g in zip(m.named_parameters(), got):
        torch.testing.assert_close(g, p.grad, **tolerances, msg=lambda s, name=name: f"gradient of {name}: {s}")
        worst = max(worst, float((g - p.grad).abs().max()))
    m.zero_grad()
    return worst


#: variant -> (how a raw graph becomes its input, the model as blocks)
VARIANTS = {"message_passing": (featurise, gat_block), "per_node": (featurise_adjacency, gat_block_per_node)}


def run(graphs: int = 200, batch_size: int = 200, repeats: int = 7, threads: int = 1, scheduler: str = "depth",
        variants: Sequence[str] = tuple(VARIANTS), min_nodes: int = 1, max_nodes: int = 30, hidden: int = 16,
        heads: int = 2, seed: int = 0, mlflow: bool = False, log: Callable[[str], None] = echo) -> Dict[str, object]:
    """Measure (see the module docstring) each variant of the blocks (``message_passing``:
    :func:`gat_block`; ``per_node``: :func:`gat_block_per_node`) beside the per-example loop,
    print the table; returns ``{"rows": per variant and column, the median wall and CPU ms
    per round (all graphs), "e2e": per variant, (q1, median, q3) of the end-to-end ratio
    in wall and in CPU seconds, "max_abs_diff": the largest difference of the checks, ...}``."""
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variant(s) {sorted(unknown)}; known: {sorted(VARIANTS)}")
    torch.set_num_threads(threads)
    raw = random_graphs(graphs, min_nodes, max_nodes, seed=seed)
    m = GATModules(hidden=hidden, heads=heads, seed=seed)
    reference_inputs = [featurise(g) for g in raw]
    columns: Dict[str, Callable] = {}
    built: Dict[str, list] = {}
    diff = 0.0
    for v in variants:
        feat, make = VARIANTS[v]
        inputs = [feat(g) for g in raw]
        compiler = fe.Compiler(make(m), scheduler=scheduler)
        diff = max(diff, check_equal(m, compiler, inputs, reference_inputs, rtol=1e-4, atol=1e-5))
        batches = [inputs[i:i + batch_size] for i in range(0, len(inputs), batch_size)]
        built[v] = [compiler.build_batch(b) for b in batches]

        def fwd_bwd(c=compiler, bs=built[v]):
            m.zero_grad()
            for b in bs:
                _loss(c(b)).backward()
        columns[f"{v}/featurise"] = lambda feat=feat: [feat(g) for g in raw]
        columns[f"{v}/trace"] = lambda c=compiler, bs=batches: [c.trace(b) for b in bs]
        plain = fe.Compiler(make(m), scheduler=scheduler)
        plain.trace_templates.enabled = False
        columns[f"{v}/trace_templates_off"] = lambda c=plain, bs=batches: [c.trace(b) for b in bs]
        columns[f"{v}/build_batch"] = lambda c=compiler, bs=batches: [c.build_batch(b) for b in bs]
        columns[f"{v}/fwd_bwd"] = fwd_bwd
    ref_batches = [reference_inputs[i:i + batch_size] for i in range(0, len(raw), batch_size)]

    def ref_fwd_bwd():
        m.zero_grad()
        for b in ref_batches:
            _loss(torch.cat([reference_forward(m, g) for g in b])).backward()
    columns["per_example/fwd_bwd"] = ref_fwd_bwd
    cpu: Dict[str, List[float]] = {}
    wall = interleaved(columns, repeats=repeats, warmup=1, cpu_times=cpu)
    rows = [{"column": k, "wall_ms": 1e3 * statistics.median(wall[k]), "cpu_ms": 1e3 * statistics.median(cpu[k])}
            for k in wall]
    templates = {v: ratio_quartiles(cpu[f"{v}/trace"], cpu[f"{v}/trace_templates_off"]) for v in variants}
    e2e = {v: {kind: ratio_quartiles([a + b for a, b in zip(t[f"{v}/build_batch"], t[f"{v}/fwd_bwd"])],
                                     t["per_example/fwd_bwd"]) for kind, t in (("wall", wall), ("cpu", cpu))}
           for v in variants}
    result = {"rows": rows, "e2e": e2e, "templates_on_off_cpu": templates, "max_abs_diff": diff,
              "nodes": sum(len(g["x"]) for g in reference_inputs),
              "edges": sum(g["edges"].shape[1] for g in reference_inputs),
              "calls_per_batch": {v: statistics.mean(b.stats["calls"] for b in built[v]) for v in variants},
              "nodes_per_batch": {v: statistics.mean(b.stats["nodes"] for b in built[v]) for v in variants}}
    log(f"GAT, {graphs} graphs of {min_nodes}-{max_nodes} nodes ({result['nodes']} nodes, {result['edges']} "
        f"directed edges), batches of {batch_size}, scheduler {scheduler}, {threads} thread(s), {repeats} "
        f"interleaved rounds; outputs and gradients equal to the per-example loop's (largest difference "
        f"{diff:.2g}); per batch: " + ", ".join(f"{v} {result['calls_per_batch'][v]:.0f} calls, "
                                                f"{result['nodes_per_batch'][v]:.0f} trace nodes" for v in variants))
    log(format_table(rows))
    for v in variants:
        for kind in ("wall", "cpu"):
            q1, med, q3 = e2e[v][kind]
            log(f"{v}: end to end (build_batch + fwd_bwd) / per-example fwd_bwd, {kind}: {med:.2f} "
                f"(quartiles {q1:.2f}-{q3:.2f})")
        q1, med, q3 = templates[v]
        log(f"{v}: trace with templates / without, cpu: {med:.2f} (quartiles {q1:.2f}-{q3:.2f})")
    if mlflow:
        from .reporting import log_to_mlflow
        metrics = {f"{r['column']}_{k}": r[k] for r in rows for k in ("wall_ms", "cpu_ms")}
        metrics.update({f"{v}/e2e_{kind}": e2e[v][kind][1] for v in variants for kind in ("wall", "cpu")})
        metrics.update({f"{v}/templates_on_off_cpu": templates[v][1] for v in variants})
        params = {"graphs": graphs, "batch_size": batch_size, "repeats": repeats, "threads": threads,
                  "scheduler": scheduler, "variants": ",".join(variants), "min_nodes": min_nodes,
                  "max_nodes": max_nodes, "hidden": hidden, "heads": heads, "seed": seed}
        log(f"MLflow run {log_to_mlflow('bench_gat', params, {'gat': rows}, metrics)}")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gat", description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scheduler", default="depth")
    ap.add_argument("--variants", default=",".join(VARIANTS), type=lambda s: tuple(v for v in s.split(",") if v))
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mlflow", action="store_true", help="log the run to MLflow (experiment bench_gat)")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
