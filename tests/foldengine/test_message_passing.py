"""MessagePassing and Aggregate: graphs given as a node sequence and an edge array [2, E].

Values and gradients equal a per-example reference (``compiler.reference``) and naive
per-graph torch code, under every scheduler, executor and row layout, in float32 and float64;
type and input errors name the block; and (issue 49, finding 3) tracing a graph makes the same
Python calls whatever its number of nodes and edges.
"""
from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import foldengine as fe
from foldengine import blocks as fb
from foldengine.segments import segment_first, segment_max, segment_softmax, segment_sum

from .helpers import assert_batched_matches_reference

FEATURES, HEADS, DIM = 3, 2, 4


def random_graph(rng: random.Random, n: int, p: float = 0.3) -> dict:
    edges = [(u, v) for u in range(n) for v in range(n) if u != v and rng.random() < p]
    e = np.asarray(edges, np.int64).reshape(-1, 2).T
    return {"x": np.asarray([[rng.random() for _ in range(FEATURES)] for _ in range(n)], np.float32),
            "edges": e}


GRAPHS = [random_graph(random.Random(s), n) for s, n in enumerate([1, 5, 3, 8, 2, 6, 4])]
GRAPHS.append({"x": np.ones((3, FEATURES), np.float32), "edges": np.zeros((2, 0), np.int64)})   # no edges


class Attention(nn.Module):
    """GAT attention over segments whose first row is the receiving node."""

    def __init__(self):
        super().__init__()
        self.a_src = nn.Parameter(torch.randn(HEADS, DIM))
        self.a_dst = nn.Parameter(torch.randn(HEADS, DIM))

    def scores(self, z_dst, z_src):
        return F.leaky_relu((z_dst * self.a_dst).sum(-1) + (z_src * self.a_src).sum(-1), 0.2)

    def forward(self, z, segment, n):
        receiver = z.index_select(0, segment_first(segment, n)).index_select(0, segment)
        alpha = segment_softmax(self.scores(receiver, z), segment, n)
        return segment_sum(alpha.unsqueeze(-1) * z, segment, n)


class Project(nn.Module):
    def __init__(self, n_in):
        super().__init__()
        self.linear = nn.Linear(n_in, HEADS * DIM)

    def forward(self, x):
        return self.linear(x).view(-1, HEADS, DIM)


def flatten_elu(z):
    return F.elu(z).flatten(1)


def gat(seed: int = 0):
    """A 2-layer GAT: ``(modules, block)``."""
    torch.manual_seed(seed)
    mods = nn.ModuleDict({"p1": Project(FEATURES), "a1": Attention(), "p2": Project(HEADS * DIM), "a2": Attention(),
                          "out": nn.Linear(HEADS * DIM, 1)})

    def layer(p, a, name):
        nodes = fb.AllOf(fb.GetItem(0) >> fb.Map(fb.Function(p, name=f"{name}_p")), fb.GetItem(1)) \
            >> fb.MessagePassing(fb.Aggregate(a, name=f"{name}_a")) >> fb.Map(fb.Function(flatten_elu))
        return fb.AllOf(nodes, fb.GetItem(1))

    graph = fb.Record([("x", fb.Map(fb.Vector(FEATURES))), ("edges", fb.Identity())])
    block = (graph >> layer(mods["p1"], mods["a1"], "l1") >> layer(mods["p2"], mods["a2"], "l2")
             >> fb.GetItem(0) >> fb.Sum() >> fb.Function(mods["out"], name="out"))
    return mods, block


def dense_gat(mods, g, dtype):
    """The same GAT on one graph, with a dense masked softmax (no segments)."""
    h = torch.from_numpy(g["x"]).to(dtype)
    n = h.shape[0]
    adj = torch.eye(n, dtype=torch.bool)
    e = torch.from_numpy(g["edges"])
    adj[e[1], e[0]] = True
    for p, a in (("p1", "a1"), ("p2", "a2")):
        z = mods[p](h)
        s = mods[a].scores(z[:, None], z[None, :]).masked_fill(~adj[:, :, None], float("-inf"))
        h = flatten_elu(torch.einsum("vuh,uhd->vhd", torch.softmax(s, 1), z))
    return mods["out"](h.sum(0, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scheduler", ["depth", "agenda", "coalesce", "auto"])
@pytest.mark.parametrize("executor", ["tables", "chunks"])
def test_gat_matches_reference_and_dense_torch(dtype, scheduler, executor):
    mods, block = gat()
    compiler = fe.Compiler(block, scheduler=scheduler, executor=executor)
    compiler.to(dtype)
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    batch, out = assert_batched_matches_reference(compiler, GRAPHS, atol=atol)
    assert out.dtype == dtype
    # ... and naive per-graph torch code, values and gradients
    compiler.zero_grad()
    (compiler(batch) ** 2).sum().backward()
    got = {k: p.grad.clone() for k, p in mods.named_parameters()}
    mods.zero_grad()
    ref = torch.cat([dense_gat(mods, g, dtype) for g in GRAPHS])
    (ref ** 2).sum().backward()
    torch.testing.assert_close(out, ref.detach(), atol=atol, rtol=1e-5)
    for k, p in mods.named_parameters():
        torch.testing.assert_close(got[k], p.grad, atol=atol, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:row_layout='concat' schedules each input")
@pytest.mark.parametrize("scheduler", ["depth", "coalesce"])
def test_gat_concat_layout_from_traces(scheduler):
    mods, block = gat()
    compiler = fe.Compiler(block, scheduler=scheduler, row_layout="concat")
    assert_batched_matches_reference(compiler, GRAPHS, from_traces=True)
    readers = fe.Compiler(block, scheduler=scheduler)
    torch.testing.assert_close(compiler(compiler.build_batch_from_traces(compiler.trace(GRAPHS))),
                               readers(readers.build_batch(GRAPHS)))


def naive_aggregate(mode, x, edges, self_loops):
    """Per node, the reduction of its own row (``self_loops``) and its senders' rows, in a loop."""
    out = []
    for v in range(len(x)):
        rows = ([x[v]] if self_loops else []) + [x[u] for u, w in zip(*edges) if w == v]
        if not rows:
            out.append(torch.zeros_like(x[v]))
            continue
        s = torch.stack(rows)
        out.append({"sum": s.sum(0), "mean": s.mean(0), "max": s.max(0).values, "min": s.min(0).values}[mode])
    return torch.stack(out) if out else x


@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("mode", ["sum", "mean", "max", "min"])
def test_builtin_reductions_match_a_loop(mode, self_loops):
    reduction = {"sum": fb.Sum, "mean": fb.Mean, "max": fb.Max, "min": fb.Min}[mode]()
    graph = fb.Record([("x", fb.Map(fb.Vector(FEATURES))), ("edges", fb.Identity())])
    compiler = fe.Compiler(graph >> fb.MessagePassing(reduction, self_loops=self_loops))
    out = compiler(compiler.build_batch(GRAPHS))
    assert out.lengths.tolist() == [len(g["x"]) for g in GRAPHS]
    want = torch.cat([naive_aggregate(mode, torch.from_numpy(g["x"]), g["edges"].tolist(), self_loops)
                      for g in GRAPHS])
    torch.testing.assert_close(out.values, want)


def test_neighbourhood_order_and_duplicate_edges():
    """Members come as [self, senders in edge order]; a repeated edge counts twice."""
    seen = []

    def record(rows, segment, n):
        seen.append((rows.detach().clone(), segment.clone(), n))
        return segment_sum(rows, segment, n)

    graph = fb.Record([("x", fb.Map(fb.Scalar())), ("edges", fb.Identity())])
    compiler = fe.Compiler(graph >> fb.MessagePassing(fb.Aggregate(record)))
    seen.clear()
    out = compiler(compiler.build_batch([{"x": [1, 10, 100], "edges": [[2, 0, 2], [1, 1, 1]]}]))
    assert out.values.tolist() == [1.0, 10 + 100 + 1 + 100, 100.0]
    rows, segment, n = seen[-1]
    assert n == 3
    assert [rows[segment == 1].tolist()] == [[10.0, 100.0, 1.0, 100.0]]


def test_segment_functions():
    seg = torch.tensor([0, 0, 2, 2, 2])
    x = torch.tensor([1.0, 3.0, -1.0, 5.0, 2.0], dtype=torch.float64, requires_grad=True)
    assert segment_sum(x, seg, 3).tolist() == [4.0, 0.0, 6.0]
    assert segment_max(x, seg, 3).tolist() == [3.0, 0.0, 5.0]
    assert segment_first(seg, 3).tolist() == [0, 0, 2]
    soft = segment_softmax(x, seg, 3)
    torch.testing.assert_close(soft[:2], torch.softmax(x[:2], 0))
    torch.testing.assert_close(soft[2:], torch.softmax(x[2:], 0))
    assert torch.isfinite(segment_softmax(1000 * x, seg, 3)).all()
    torch.autograd.gradcheck(lambda t: segment_softmax(t, seg, 3), (x,))


def test_type_errors_name_the_block():
    graph = fb.Record([("x", fb.Map(fb.Vector(FEATURES))), ("edges", fb.Identity())])
    with pytest.raises(fb.BlockTypeError, match=r"MessagePassing\(Sum\(\)\) at root/1 expects input a pair"):
        fe.Compiler(fb.Map(fb.Vector(FEATURES)) >> fb.MessagePassing(fb.Sum()))
    with pytest.raises(fb.BlockTypeError, match="is not a reduction block"):
        fe.Compiler(graph >> fb.MessagePassing(fb.Function(torch.neg)))
    with pytest.raises(fb.BlockTypeError, match="PyObjectType"):
        fe.Compiler(fb.AllOf(fb.Map(fb.Scalar()), fb.Map(fb.Scalar())) >> fb.MessagePassing(fb.Sum()))

    def wrong_rows(rows, segment, n):
        return rows[:1]                       # one row, not one per segment

    with pytest.raises(fb.BlockTypeError, match=r"Aggregate\('wrong_rows'\) at root/1/aggregate .*\[1, 3\]"):
        fe.Compiler(graph >> fb.MessagePassing(fb.Aggregate(wrong_rows)))

    def fails(rows, segment, n):
        raise ValueError("nope")

    with pytest.raises(fb.BlockTypeError, match="failed on zeros"):
        fe.Compiler(fb.Map(fb.Scalar()) >> fb.Aggregate(fails))


def test_input_errors_name_the_input():
    graph = fb.Record([("x", fb.Map(fb.Scalar())), ("edges", fb.Identity())])
    compiler = fe.Compiler(graph >> fb.MessagePassing(fb.Sum()))
    good = {"x": [1, 2], "edges": [[0], [1]]}
    with pytest.raises(fe.InputError, match=r"input 1: MessagePassing\(Sum\(\)\) at root/1: edge to or from node 2"):
        compiler.build_batch([good, {"x": [1, 2], "edges": [[0], [2]]}])
    with pytest.raises(fe.InputError, match=r"input 0: .*shape \[2, E\].*\[3, 1\]"):
        compiler.build_batch([{"x": [1, 2], "edges": [[0], [1], [1]]}])
    with pytest.raises(fe.InputError, match="integer array"):
        compiler.build_batch([{"x": [1, 2], "edges": [[0.5], [1.0]]}])
    for empty in ([], np.zeros(0, np.int64), np.zeros((2, 0), np.int64)):
        out = compiler(compiler.build_batch([{"x": [1, 2], "edges": empty}]))
        assert out.values.tolist() == [1.0, 2.0]
    assert compiler(compiler.build_batch([{"x": [], "edges": []}])).lengths.tolist() == [0]


def test_operation_errors_name_the_aggregate():
    calls = []

    def breaks_on_batches(rows, segment, n):
        calls.append(n)
        if n > 2:
            return rows[:1].expand(n - 1, *rows.shape[1:])
        return segment_sum(rows, segment, n)

    compiler = fe.Compiler(fb.Map(fb.Scalar()) >> fb.Aggregate(breaks_on_batches))
    with pytest.raises(fe.OperationError, match=r"breaks_on_batches .*Aggregate\('breaks_on_batches'\) at root/1"):
        compiler(compiler.build_batch([[1], [2], [3]]))


def test_parameters_registered_and_pickled():
    import pickle
    mods, block = gat()
    compiler = fe.Compiler(block)
    names = [n for n, _ in compiler.named_parameters()]
    assert any("l1_a" in n and n.endswith("a_src") for n in names), names
    clone = pickle.loads(pickle.dumps(compiler))
    torch.testing.assert_close(clone(clone.build_batch(GRAPHS)), compiler(compiler.build_batch(GRAPHS)))


def python_calls(fn) -> int:
    """The Python function calls ``fn()`` makes (``sys.setprofile`` "call" events)."""
    count = [0]

    def profile(frame, event, arg):
        if event == "call":
            count[0] += 1
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


def test_tracing_a_graph_makes_the_same_python_calls_whatever_its_size():
    """Issue 49, finding 3: a graph model written with MessagePassing traces each graph with
    a fixed number of Python calls: its nodes and edges are recorded as arrays, so tracing
    costs no Python work per node or edge (and building a batch of one graph none either)."""
    sizes = [8, 30, 120, 300]
    rng = random.Random(3)
    graphs = [random_graph(rng, n, p=0.2) for n in sizes]
    for g, n in zip(graphs, sizes):            # every graph has edges (a ring besides its random ones)
        ring = np.stack([np.arange(n), (np.arange(n) + 1) % n])
        g["edges"] = np.concatenate([g["edges"], ring], axis=1)
    assert graphs[-1]["edges"].shape[1] > 100 * graphs[0]["edges"].shape[1] + 1000
    _, block = gat()
    compiler = fe.Compiler(block)
    compiler.trace_templates.enabled = False
    compiler.trace(graphs)                     # warm: closures, imports, caches
    compiler.build_batch(graphs)
    traced = [python_calls(lambda g=g: compiler.trace([g])) for g in graphs]
    assert len(set(traced)) == 1, dict(zip(sizes, traced))
    built = [python_calls(lambda g=g: compiler.build_batch([g])) for g in graphs]
    assert len(set(built)) == 1, dict(zip(sizes, built))
    # the measure sees Python work per node: the same graphs as adjacency lists, traced per node
    per_node = fe.Compiler(fb.Record([("x", fb.Map(fb.Vector(FEATURES))), ("adj", fb.Identity())])
                           >> fb.GetItem(1) >> fb.Map(fb.Map(fb.Scalar("int64"))))
    adj = [{"x": g["x"], "adj": [[int(u) for u in g["edges"][0][g["edges"][1] == v]] for v in range(len(g["x"]))]}
           for g in graphs]
    counts = [python_calls(lambda g=g: per_node.trace([g])) for g in adj]
    assert counts[-1] > counts[0] + sizes[-1]


def test_whole_input_probe_ends_when_the_prefix_records_nodes():
    """A root whose template prefix records nodes (here the MessagePassing layers) can never
    reuse a kept whole-input trace: each lookup counts as a miss, so after ``probe`` inputs the
    prefix is no longer traced twice per input (once for a key that cannot exist)."""
    _, block = gat()
    compiler = fe.Compiler(block)
    tt = compiler.trace_templates
    tt.probe = 4
    traces = compiler.trace(GRAPHS)
    assert tt.input_hits == 0 and tt.input_misses == tt.probe and not tt.pays(inputs=True)
    again = fe.Compiler(block)
    again.trace_templates.enabled = False
    for a, b in zip(traces, again.trace(GRAPHS)):
        assert np.array_equal(a.node_op, b.node_op) and np.array_equal(a.edge_src, b.edge_src)


def test_templates_of_a_few_nodes_are_not_kept():
    """The GAT's part that traces by structure is its read-out (Sum, Function: 2 nodes): a
    lookup and replay cost more than tracing it, so its templates are not kept
    (``trace_templates.min_nodes``) and every graph is traced block by block, with the same
    traces; with ``min_nodes = 0`` they would be replayed."""
    _, block = gat()
    compiler, keeps, plain = fe.Compiler(block), fe.Compiler(block), fe.Compiler(block)
    keeps.trace_templates.min_nodes = 0
    plain.trace_templates.enabled = False
    graphs = GRAPHS * 3
    got, kept, want = compiler.trace(graphs), keeps.trace(graphs), plain.trace(graphs)
    assert compiler.trace_templates.hits == 0 and compiler.trace_templates.misses == len(graphs)
    assert keeps.trace_templates.hits > 0
    for a, b, c in zip(got, kept, want):
        assert np.array_equal(a.node_op, c.node_op) and np.array_equal(a.edge_src, c.edge_src)
        assert np.array_equal(b.node_op, c.node_op) and np.array_equal(b.edge_src, c.edge_src)


def test_aggregate_under_autocast_keeps_the_rows_dtype():
    lin = nn.Linear(FEATURES, FEATURES)

    def projected_sum(rows, segment, n):
        return segment_sum(lin(rows), segment, n)       # bfloat16 under autocast

    graph = fb.Record([("x", fb.Map(fb.Vector(FEATURES))), ("edges", fb.Identity())])
    compiler = fe.Compiler(graph >> fb.MessagePassing(fb.Aggregate(projected_sum)) >> fb.Sum())
    batch = compiler.build_batch(GRAPHS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiler(batch)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, compiler(batch), rtol=0.05, atol=0.1)


def test_layers_sharing_an_edge_array():
    """Two layers read one graph's edge array (its neighbourhoods are computed once per input),
    one with self loops and one without: each gets its own neighbourhoods."""
    graph = fb.Record([("x", fb.Map(fb.Vector(FEATURES))), ("edges", fb.Identity())])
    both = graph >> fb.AllOf(fb.MessagePassing(fb.Sum()) >> fb.Map(fb.Function(torch.tanh)), fb.GetItem(1)) \
        >> fb.MessagePassing(fb.Max(), self_loops=False)
    compiler = fe.Compiler(both)
    out = compiler(compiler.build_batch(GRAPHS))
    want = []
    for g in GRAPHS:
        x, e = torch.from_numpy(g["x"]), g["edges"].tolist()
        want.append(naive_aggregate("max", torch.tanh(naive_aggregate("sum", x, e, True)), e, False))
    torch.testing.assert_close(out.values, torch.cat(want))
    torch.testing.assert_close(out.values, compiler.reference(GRAPHS).values)
