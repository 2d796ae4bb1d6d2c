"""fb.Shared: a part of an input reached twice (a DAG) is computed once; values and parameter
gradients match a per-example PyTorch loop over the DAG under every scheduler, and tracing
grows with the distinct parts (a ladder of n nodes: O(n) nodes, not O(fib(n)))."""
from __future__ import annotations

import random

import pytest
import torch

import foldengine as fe
import foldengine.blocks as fb


def _model(shared: bool, state: int = 4):
    """node = (x, [children]) -> h = tanh(W [x; sum_children h]) (a DAG Tree-RNN)."""
    torch.manual_seed(0)
    cell = torch.nn.Linear(1 + state, state)
    node = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([state]))
    body = (fb.AllOf(fb.GetItem(0) >> fb.InputTransform(lambda v: [v]) >> fb.Vector(1), fb.GetItem(1) >> fb.Map(node()) >> fb.Sum())
            >> fb.Function(lambda x, c: torch.tanh(cell(torch.cat([x, c], -1)))))
    node.resolve_to(fb.Shared(body) if shared else body)
    return node(), cell


def _loop(cell, x, memo):
    """The per-example PyTorch reference, each distinct node computed once."""
    if id(x) not in memo:
        kids = [_loop(cell, k, memo) for k in x[1]]
        c = torch.stack(kids).sum(0) if kids else torch.zeros(cell.out_features)
        memo[id(x)] = torch.tanh(cell(torch.cat([torch.tensor([x[0]]), c])))
    return memo[id(x)]


def _random_dag(rng: random.Random, n: int):
    """``n`` nodes; node i's children are drawn from the nodes before it (so parts are shared)."""
    nodes = []
    for i in range(n):
        k = rng.randint(0, min(3, i))
        nodes.append((rng.uniform(-1, 1), rng.sample(nodes, k)))
    return nodes[-1]


def _ladder(n: int):
    a, b = (1.0, []), (0.5, [])
    for i in range(n):
        a, b = (float(i % 3) / 3, [a, b]), a
    return a


@pytest.mark.parametrize("scheduler", ["depth", "agenda", "coalesce"])
def test_shared_dag_matches_a_per_example_loop(scheduler):
    rng = random.Random(0)
    inputs = [_random_dag(rng, n) for n in (1, 5, 12, 20)] + [_ladder(8)]
    block, cell = _model(shared=True)
    compiler = fe.Compiler(block, scheduler=scheduler)
    out = compiler(compiler.build_batch(inputs))
    out.square().sum().backward()
    got = [p.grad.clone() for p in cell.parameters()]
    for p in cell.parameters():
        p.grad = None
    want = torch.stack([_loop(cell, x, {}) for x in inputs])
    want.square().sum().backward()
    torch.testing.assert_close(out, want.detach())
    for g, p in zip(got, cell.parameters()):
        torch.testing.assert_close(g, p.grad)
    torch.testing.assert_close(compiler.reference(inputs), want.detach())    # the eager path shares too


def test_sharing_changes_the_work_not_the_values():
    """Without Shared every path to a node is traced again (same values, more nodes); with it a
    ladder's trace grows linearly in its length."""
    x = _ladder(10)
    plain, _ = _model(shared=False)
    shared, _ = _model(shared=True)
    c_plain, c_shared = fe.Compiler(plain), fe.Compiler(shared)
    torch.testing.assert_close(c_plain(c_plain.build_batch([x])), c_shared(c_shared.build_batch([x])))
    nodes = {n: c_shared.trace([_ladder(n)])[0].n_nodes for n in (10, 20, 40)}
    assert nodes[40] - nodes[20] == 2 * (nodes[20] - nodes[10])   # linear: the same per extra node
    assert nodes[20] - nodes[10] <= 10 * 4                         # a few calls per distinct node
    assert c_plain.trace([x])[0].n_nodes > 10 * nodes[10]      # exponential without sharing


def test_nothing_is_shared_across_inputs_or_between_equal_objects():
    block, _ = _model(shared=True)
    compiler = fe.Compiler(block)
    leaf = (0.25, [])
    one = compiler.trace([(1.0, [leaf, leaf])])[0].n_nodes
    two = compiler.trace([(1.0, [leaf, (0.25, [])])])[0].n_nodes       # equal, not the same object
    assert two > one
    batch = compiler.trace([(1.0, [leaf]), (2.0, [leaf])])               # one per input
    assert batch[0].n_nodes == batch[1].n_nodes


# -- plain values (CPython caches or folds them) are computed at each occurrence ---------------------

def _counting_leaf():
    """Shared(len(x) -> Scalar, recorded by Metric('m')) over a list: the sum and one metric row
    per leaf computed."""
    leaf = fb.Shared(fb.InputTransform(lambda v: len(str(v))) >> fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Metric("m"))
                     >> fb.GetItem(0))
    return fe.Compiler(fb.Map(leaf) >> fb.Sum())


def test_interned_strings_are_computed_at_each_occurrence():
    words = "a , b , c , d".split()
    assert len(words) == 7 and len({id(w) for w in words}) < 7     # CPython's 1-character strings
    c = _counting_leaf()
    batched = c.run(c.build_batch([words]))
    assert batched.metrics["m"].shape == (7,) and batched.metric_lengths["m"].tolist() == [7]
    assert batched.outputs.tolist() == [7.0]   # len(str(w)) == 1 for each
    from_traces = c.run(c.build_batch_from_traces(c.trace([words])))
    reference = c.reference([words], return_metrics=True)
    for r in (from_traces, reference):
        assert r.metrics["m"].shape == (7,)
        torch.testing.assert_close(r.outputs, batched.outputs)


def test_plain_values_never_share_but_containers_do():
    from foldengine.blocks.sharing import shares_by_identity
    small, const = 5, ("x", 1, (2.0, None))
    for v in (small, "a", b"a", 1.5, True, None, (), const, frozenset({1})):
        assert not shares_by_identity(v), v
    part = ["x"]
    for v in (part, {"k": 1}, ("x", part), object()):
        assert shares_by_identity(v), v
    c = _counting_leaf()
    # the same tuple constant and the same small int, 3 times each: 6 computed; the same list 3x: 1
    assert c.run(c.build_batch([[const, const, const, small, small, small]])).metrics["m"].shape == (6,)
    assert c.run(c.build_batch([[part, part, part]])).metrics["m"].shape == (1,)


def test_str_subclass_objects_share_by_identity():
    class Word(str):
        pass
    w = Word("ab")
    c = _counting_leaf()
    assert c.run(c.build_batch([[w, w, Word("ab")]])).metrics["m"].shape == (2,)
