"""What a forward computes comes back from that forward: ``Compiler.run`` /
``return_metrics=True`` give a ForwardResult (outputs, metrics, metric_lengths), exact under
threads forwarding different batches on one Compiler; ``compiler.metrics`` stays the last
forward's (TF Fold's idiom); an unknown metric name is a KeyError naming those that exist."""
from __future__ import annotations

import pickle
import threading

import pytest
import torch

import foldengine as fe
import foldengine.blocks as fb


def _mirror(v):
    return torch.stack([v, -v], -1)


def _is_pair(x):
    return isinstance(x, tuple)


def _tree_model(scheduler="depth", executor="auto"):
    """A Tree-RNN recording every node's state (Metric 'h') and each leaf's value (Metric 'leaf')."""
    torch.manual_seed(0)
    cell = torch.nn.Linear(4, 2)
    expr = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([2]))
    leaf = fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Metric("leaf")) >> fb.GetItem(0) >> fb.Function(_mirror)
    pair = fb.AllOf(fb.GetItem(0) >> expr(), fb.GetItem(1) >> expr()) >> fb.Concat() >> fb.Function(cell, name="cell") >> fb.Function(torch.tanh)
    node = fb.OneOf(_is_pair, {False: leaf, True: pair})
    expr.resolve_to(node >> fb.AllOf(fb.Identity(), fb.Metric("h")) >> fb.GetItem(0))
    c = fe.Compiler(expr(), scheduler=scheduler)
    c.executor = executor
    return c


def _tree(k: int, depth: int):
    if depth == 0:
        return float(k % 7) - 3.0
    return (_tree(k * 3 + 1, max(depth - 1 - k % 2, 0)), _tree(k * 5 + 2, depth - 1))


def _batches():
    return [[_tree(k + 11 * b, 1 + (k + b) % 4) for k in range(3 + b % 4)] for b in range(8)]


def test_run_returns_outputs_metrics_and_lengths_of_its_forward():
    c = _tree_model()
    batch = c.build_batch(_batches()[0])
    r = c.run(batch)
    assert isinstance(r, fe.ForwardResult)
    outputs, metrics, lengths = r
    torch.testing.assert_close(outputs, c(batch))
    assert set(metrics) == {"h", "leaf"} and set(lengths) == {"h", "leaf"}
    assert int(lengths["h"].sum()) == len(metrics["h"]) and lengths["h"].dtype == torch.int64
    seqs = r.metric_sequences
    assert torch.equal(seqs["leaf"].values, metrics["leaf"]) and torch.equal(seqs["leaf"].lengths, lengths["leaf"])
    # the same record from the forward flag and from reference
    same = c(batch, return_metrics=True)
    torch.testing.assert_close(same.metrics["h"], metrics["h"])
    ref = c.reference(_batches()[0], return_metrics=True)
    torch.testing.assert_close(ref.outputs, outputs)
    torch.testing.assert_close(ref.metrics["h"], metrics["h"])
    assert torch.equal(ref.metric_lengths["leaf"], lengths["leaf"])
    # compiler.metrics: the last forward's, TF Fold's idiom
    torch.testing.assert_close(c.metrics["h"], metrics["h"])
    assert torch.equal(c.metric_lengths["h"], lengths["h"])


@pytest.mark.parametrize("executor", ["tables", "chunks"])
@pytest.mark.parametrize("scheduler", ["depth", "auto"])
def test_threads_forwarding_on_one_compiler_each_get_their_own_results(executor, scheduler):
    c = _tree_model(scheduler, executor)
    inputs = _batches()
    with torch.no_grad():
        expected = [c.run(c.build_batch(b)) for b in inputs]     # single-threaded answers
    c2 = _tree_model(scheduler, executor)                        # a fresh one: lazy set-up under threads too
    n_threads, rounds = 6, 25
    errors, checked = [], [0]
    start = threading.Barrier(n_threads)

    def worker(t):
        try:
            start.wait()
            with torch.no_grad():
                for r in range(rounds):
                    k = (t + r) % len(inputs)
                    got = c2.run(c2.build_batch(inputs[k]))
                    want = expected[k]
                    assert torch.equal(got.outputs, want.outputs), (t, r, k)
                    for name in ("h", "leaf"):
                        assert torch.equal(got.metrics[name], want.metrics[name]), (t, r, k, name)
                        assert torch.equal(got.metric_lengths[name], want.metric_lengths[name]), (t, r, k, name)
                    checked[0] += 1
        except BaseException as err:   # reported below, with the thread
            errors.append((t, err))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors[:3]
    assert checked[0] == n_threads * rounds


def test_threads_on_reference_each_get_their_own_metrics():
    c = _tree_model()
    inputs = _batches()[:4]
    expected = [c.reference(b, return_metrics=True) for b in inputs]
    errors = []

    def worker(t):
        try:
            for r in range(10):
                k = (t + r) % len(inputs)
                got = c.reference(inputs[k], return_metrics=True)
                assert torch.equal(got.metrics["h"], expected[k].metrics["h"])
                assert torch.equal(got.metric_lengths["leaf"], expected[k].metric_lengths["leaf"])
        except BaseException as err:
            errors.append(err)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors[:3]


def test_unknown_metric_names_the_metrics_that_exist():
    c = _tree_model()
    with pytest.raises(KeyError) as before:
        c.metrics["h"]
    assert isinstance(before.value, fe.MetricNameError)
    assert "no metrics exist before a forward" in str(before.value) and "['h', 'leaf']" in str(before.value) \
        or "['leaf', 'h']" in str(before.value)
    r = c.run(c.build_batch(_batches()[0]))
    for m in (r.metrics, r.metric_lengths, c.metrics, c.metric_lengths):
        with pytest.raises(fe.MetricNameError) as err:
            m["loss"]
        assert "no metric 'loss'" in str(err.value) and "'h'" in str(err.value) and "'leaf'" in str(err.value)
        assert "before a forward" not in str(err.value)
    plain = fe.Compiler(fb.Scalar())
    with pytest.raises(fe.MetricNameError, match="before a forward"):
        plain.metrics["x"]
    with pytest.raises(fe.MetricNameError, match="no Metric blocks"):
        plain.run(plain.build_batch([1.0])).metrics["x"]


def test_metrics_survive_pickling_as_last_forward_state():
    c = _tree_model()
    r = c.run(c.build_batch(_batches()[1]))
    c2 = pickle.loads(pickle.dumps(c))
    torch.testing.assert_close(c2.metrics["h"], r.metrics["h"].detach())
    with pytest.raises(fe.MetricNameError):
        c2.metrics["nope"]


def test_default_declaration_name_is_not_forward_and_parameter_names_stay():
    expr = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]))
    lin = torch.nn.Linear(2, 1)
    pair = fb.AllOf(fb.GetItem(0) >> expr(), fb.GetItem(1) >> expr()) >> fb.Function(lambda a, b: torch.stack([a, b], -1)) >> fb.Function(lin, name="lin") >> fb.Function(
        lambda v: v.squeeze(-1))
    expr.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: fb.Scalar(), True: pair}))
    c = fe.Compiler(expr())
    assert expr.name == "recursion" and repr(expr) == "ForwardDeclaration('recursion')"
    assert list(c.state_dict()) == ["lin.weight", "lin.bias"]       # the default does not prefix
    with pytest.raises(fe.InputError) as err:
        c.build_batch([("a", 1.0)])
    assert " at recursion/case[" in str(err.value) and "forward" not in str(err.value)
    # "forward", the default of earlier versions, still does not prefix (their state_dicts load)
    old = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]), name="forward")
    pair2 = fb.AllOf(fb.GetItem(0) >> old(), fb.GetItem(1) >> old()) >> fb.Function(lambda a, b: torch.stack([a, b], -1)) >> fb.Function(torch.nn.Linear(2, 1), name="lin") >> fb.Function(
        lambda v: v.squeeze(-1))
    old.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: fb.Scalar(), True: pair2}))
    c_old = fe.Compiler(old())
    c_old.load_state_dict(c.state_dict())
    named = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]), name="tree")
    pair3 = fb.AllOf(fb.GetItem(0) >> named(), fb.GetItem(1) >> named()) >> fb.Function(lambda a, b: torch.stack([a, b], -1)) >> fb.Function(torch.nn.Linear(2, 1), name="lin") >> \
        fb.Function(lambda v: v.squeeze(-1))
    named.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: fb.Scalar(), True: pair3}))
    assert list(fe.Compiler(named()).state_dict()) == ["tree.lin.weight", "tree.lin.bias"]
