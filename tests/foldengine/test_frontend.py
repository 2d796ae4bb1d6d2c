"""The define-by-run front end (fe.batched): per-example PyTorch code batched by the engine.
Parity with the naive per-example loop (child-sum Tree-LSTM, a GGNN-style message passing),
traces made by another copy of the model, threads, pickling, and every refused misuse naming
the user's line."""
from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch
from torch import nn

import foldengine as fe
from schedulers import SCHEDULERS

D = 8


class ChildSum(nn.Module):
    """Child-sum Tree-LSTM (Tai et al. 2015) over trees ``(word_id, [children])``."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, D)
        self.iou = nn.Linear(2 * D, 3 * D)
        self.f = nn.Linear(2 * D, D)

    def forward(self, tree):
        word, children = tree
        x = self.embed(fe.scalar(word))
        states = [self(c) for c in children]
        h_sum = fe.sum([h for h, _ in states], shape=D)
        i, o, u = torch.chunk(self.iou(torch.cat([x, h_sum])), 3)
        c = torch.sigmoid(i) * torch.tanh(u)
        for h_k, c_k in states:
            c = c + torch.sigmoid(self.f(torch.cat([x, h_k]))) * c_k
        h = torch.sigmoid(o) * torch.tanh(c)
        fe.metric("h", h)
        return h, c

    def naive(self, tree):
        word, children = tree
        x = self.embed(torch.tensor([word]))
        states = [self.naive(c) for c in children]
        h_sum = sum((h for h, _ in states), torch.zeros(1, D))
        i, o, u = self.iou(torch.cat([x, h_sum], 1)).chunk(3, 1)
        c = torch.sigmoid(i) * torch.tanh(u)
        for h_k, c_k in states:
            c = c + torch.sigmoid(self.f(torch.cat([x, h_k], 1))) * c_k
        return torch.sigmoid(o) * torch.tanh(c), c


def _trees(seed=0, n=12):
    g = torch.Generator().manual_seed(seed)

    def tree(depth):
        k = 0 if depth > 3 else int(torch.randint(0, 4, (1,), generator=g))
        return (int(torch.randint(0, 20, (1,), generator=g)), [tree(depth + 1) for _ in range(k)])
    return [tree(0) for _ in range(n)]


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("executor", ["tables", "chunks"])
def test_child_sum_tree_lstm_equals_naive_loop(scheduler, executor):
    torch.manual_seed(0)
    model = ChildSum()
    batched = fe.batched(model, scheduler=scheduler, executor=executor)
    trees = _trees()
    h, c = batched(batched.build_batch(trees))
    params = list(model.parameters())
    grads = torch.autograd.grad((h * 1.5).sum() + c.sum(), params, allow_unused=True)
    want = [model.naive(t) for t in trees]
    hw, cw = torch.cat([w[0] for w in want]), torch.cat([w[1] for w in want])
    want_grads = torch.autograd.grad((hw * 1.5).sum() + cw.sum(), params, allow_unused=True)
    torch.testing.assert_close(h, hw, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, cw, atol=1e-5, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    ref = batched.reference(trees)
    torch.testing.assert_close(ref.outputs[0], hw, atol=1e-6, rtol=1e-6)


def test_float64_after_to():
    torch.manual_seed(0)
    model = ChildSum()
    batched = fe.batched(model)
    trees = _trees(1)
    batched.double()
    h, _ = batched(batched.build_batch(trees))
    assert h.dtype == torch.float64
    hw = torch.cat([model.naive(t)[0] for t in trees])
    torch.testing.assert_close(h, hw, atol=1e-10, rtol=1e-10)


class GGNN(nn.Module):
    """Gated graph network: nodes ``(type, [neighbour ids])``, T rounds of summed messages into a GRUCell."""

    def __init__(self, steps=3):
        super().__init__()
        self.steps = steps
        self.embed = nn.Embedding(5, D)
        self.msg = nn.Linear(D, D)
        self.gru = nn.GRUCell(D, D)
        self.readout = nn.Linear(D, 1)

    def forward(self, graph):
        h = [self.embed(fe.scalar(t)) for t, _ in graph]
        for _ in range(self.steps):
            m = [fe.sum([self.msg(h[j]) for j in nbrs], shape=D) for _, nbrs in graph]
            h = [self.gru(m_i, h_i) for m_i, h_i in zip(m, h)]
        return self.readout(fe.sum(h))

    def naive(self, graph):
        h = [self.embed(torch.tensor([t])) for t, _ in graph]
        for _ in range(self.steps):
            m = [sum((self.msg(h[j]) for j in nbrs), torch.zeros(1, D)) for _, nbrs in graph]
            h = [self.gru(m_i, h_i) for m_i, h_i in zip(m, h)]
        return self.readout(torch.stack(h).sum(0))


def _graphs():
    return [[(0, [1]), (1, [0, 2]), (2, [1])], [(3, [])], [(1, [1, 2, 3]), (4, [0]), (2, [0]), (0, [0, 1])]]


def test_ggnn_equals_naive_loop_and_batches_one_call_per_round():
    torch.manual_seed(0)
    model = GGNN()
    batched = fe.batched(model)
    graphs = _graphs()
    batch = batched.build_batch(graphs)
    out = batched(batch)
    want = torch.cat([model.naive(g) for g in graphs])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out.sum(), list(model.parameters()))
    want_grads = torch.autograd.grad(want.sum(), list(model.parameters()))
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    gru_calls = sum(1 for c in batch.calls if batched.registry.ops[c.op_id].name.startswith("module gru"))
    n_nodes = sum(len(g) for g in graphs)
    # the 8 nodes' 24 GRU cells batch across nodes and graphs: at most two calls per round (the
    # depth scheduler puts isolated nodes, whose empty message sum is shallower, a level apart)
    assert model.steps <= gru_calls <= 2 * model.steps < n_nodes * model.steps


def test_parameters_keep_the_models_names_and_state_dict_loads():
    model = ChildSum()
    batched = fe.batched(model)
    assert list(batched.state_dict()) == list(model.state_dict())
    other = fe.batched(ChildSum())
    other.load_state_dict(batched.state_dict())
    trees = _trees(2, 4)
    torch.testing.assert_close(other(other.build_batch(trees))[0], batched(batched.build_batch(trees))[0])


def test_traces_of_another_copy_are_mapped_onto_this_ones_operations():
    torch.manual_seed(0)
    model = ChildSum()
    here = fe.batched(model)
    trees = _trees(3, 8)
    worker = pickle.loads(pickle.dumps(here))      # a Ray Data worker's copy
    worker.build_batch([(1, [])])                   # meets the leaf first: other op ids
    traces = pickle.loads(pickle.dumps(worker.trace(trees)))
    here.build_batch([(2, [(3, []), (4, [])])])     # meets ops in another order
    got = here(here.build_batch_from_traces(traces))[0]
    want = here(here.build_batch(trees))[0]
    torch.testing.assert_close(got, want)
    batch = pickle.loads(pickle.dumps(worker.build_batch(trees)))
    torch.testing.assert_close(here(batch)[0], want)
    assert copy.deepcopy(here)(batch)[0].shape == want.shape


def test_run_from_threads_returns_each_callers_own_metrics():
    torch.manual_seed(0)
    batched = fe.batched(ChildSum())
    batches = [batched.build_batch(_trees(s, 3 + s)) for s in range(4)]
    with torch.no_grad():
        want = [batched.run(b).metrics["h"] for b in batches]
    bad = []

    def work(k):
        with torch.no_grad():
            for _ in range(15):
                got = batched.run(batches[k]).metrics["h"]
                if not torch.equal(got, want[k]):
                    bad.append(k)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


class Misuse(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.lin = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        v = self.lin(fe.tensor([float(x)] * 4))
        how = self.how
        if how == "branch":
            if v.sum() > 0:           # the line the error names
                return v
        if how == "item":
            return v * v.item()
        if how == "numpy":
            return v.numpy()
        if how == "inplace":
            v.add_(1.0)
        if how == "setitem":
            v[0] = 1.0
        if how == "number":
            return self.lin(3.0)
        if how == "captured":
            return v + self.w
        if how == "unsupported":
            return torch.fft.fft(v)
        if how == "shape":
            return self.lin(torch.cat([v, v]))
        return v


@pytest.mark.parametrize("how, words", [
    ("branch", "comparing"), ("item", ".item()"), ("numpy", ".numpy()"), ("inplace", "in-place"),
    ("setitem", "in-place"), ("number", "Python number"), ("captured", "requires a gradient"),
    ("unsupported", "not supported"), ("shape", "[8]")])
def test_misuse_is_refused_naming_the_users_line(how, words):
    batched = fe.batched(Misuse(how))
    with pytest.raises(fe.TraceError) as err:
        batched.build_batch([1.0, 2.0])
    msg = str(err.value)
    assert "test_frontend.py:" in msg and words in msg and "input 0" in msg, msg


def test_shape_mismatch_names_the_module_and_both_shapes():
    with pytest.raises(fe.TraceError, match=r"module lin \(Linear\).*\[8\]"):
        fe.batched(Misuse("shape")).build_batch([1.0])


def test_function_with_modules_and_empty_lists():
    embed = nn.Embedding(10, 4)

    def bag(ids):
        return fe.sum([embed(fe.scalar(i)) for i in ids], shape=4)
    batched = fe.batched(bag, modules={"embed": embed})
    out = batched(batched.build_batch([[1, 2], [], [3]]))
    torch.testing.assert_close(out[0], embed.weight[1] + embed.weight[2])
    assert torch.equal(out[1], torch.zeros(4))
    assert list(batched.state_dict()) == ["embed.weight"]


class Mixed(nn.Module):
    """Calls whose signatures differ only in what the fast path keys on: the argument types,
    tuple nesting, fixed Python arguments (dim, a slice) and keyword arguments."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(8, 4)
        self.cell = nn.LSTMCell(4, 4)

    def forward(self, x):
        v = fe.tensor([float(x)] * 4)
        w = self.a(v)
        h, c = self.cell(w)
        h2, c2 = self.cell(input=h, hx=(h, c))                      # keyword and nested tuple
        wide = torch.cat([h2, c2], dim=0)                          # the same function, other fixed args
        pair = torch.stack([h2, c2], dim=1)[:, 1]                  # [4, 2] -> [4]
        out = self.b(wide) + pair[1:3].sum() * (x % 2 == 0)
        fe.metric("h", h2)
        return out

    def naive(self, x):
        v = torch.full((1, 4), float(x))
        h, c = self.cell(self.a(v))
        h2, c2 = self.cell(h, (h, c))
        pair = torch.stack([h2, c2], dim=2)[:, :, 1]
        return self.b(torch.cat([h2, c2], 1)) + pair[:, 1:3].sum(1, keepdim=True) * (x % 2 == 0)


def test_repeated_calls_of_every_signature_equal_the_naive_loop():
    model = Mixed()
    batched = fe.batched(model)
    xs = [1, 2, 3, 4, 5, 6]
    out = batched(batched.build_batch(xs))
    ref = torch.cat([model.naive(x) for x in xs])
    torch.testing.assert_close(out, ref)
    for x, row in zip(xs, batched.reference(xs).outputs):
        torch.testing.assert_close(row, model.naive(x)[0])


def test_the_users_line_is_found_once_per_kind_of_call_not_per_node(monkeypatch):
    """Python work per recorded call: a call like one recorded before (same module or function,
    same types and fixed arguments) skips the checks; the user's line is looked up only for
    calls of a new kind, so tracing 10 or 100 trees looks it up equally often."""
    from foldengine.frontend import recording

    counted = []
    real = recording.user_line
    monkeypatch.setattr(recording, "user_line", lambda *a: counted.append(1) or real(*a))
    batched = fe.batched(ChildSum())
    batched.trace(_trees(0, 3))                   # registers every operation
    looked_up = []
    for n in (10, 100):
        counted.clear()
        batched.trace(_trees(1, n))
        looked_up.append(len(counted))
    assert looked_up[0] == looked_up[1] and looked_up[0] <= 20, looked_up


def test_a_refused_call_is_refused_again_after_good_calls_of_the_same_module():
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            v = self.lin(fe.tensor([float(x)] * 4))
            return self.lin(v) if x < 3 else self.lin(3.0)

    with pytest.raises(fe.TraceError, match=r"input 3: .*Python number") as err:
        fe.batched(Late()).build_batch([0, 1, 2, 3])
    assert "test_frontend.py:" in str(err.value)


def test_rows_makes_one_value_per_row_batched_and_in_the_reference():
    lin = nn.Linear(3, 2)

    def bag(array):
        return fe.sum([lin(r) for r in fe.rows(array)], shape=2)
    batched = fe.batched(bag, modules={"lin": lin})
    inputs = [torch.arange(6.0).reshape(2, 3).numpy(), torch.ones(1, 3).numpy(), torch.zeros(0, 3).numpy()]
    out = batched(batched.build_batch(inputs))
    want = torch.stack([lin(torch.from_numpy(a)).sum(0) for a in inputs])
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(batched.reference(inputs).outputs, want)
    with pytest.raises(fe.TraceError, match=r"input 0: .*rows of a 0-d"):
        fe.batched(bag, modules={"lin": lin}).build_batch([3.0])


def test_run_returns_the_compilers_result_record_with_named_metric_errors():
    batched = fe.batched(ChildSum())
    with pytest.raises(fe.MetricNameError, match="before a forward"):
        batched.metrics["h"]
    trees = _trees(2, 4)
    result = batched.run(batched.build_batch(trees))
    assert isinstance(result, fe.ForwardResult)
    outputs, metrics, lengths = result                      # unpacks as Compiler.run's
    with pytest.raises(fe.MetricNameError, match=r"no metric 'x'; the metrics are \['h'\]"):
        metrics["x"]
    per_tree = result.metric_sequences["h"].values.split(lengths["h"].tolist())
    assert [len(p) for p in per_tree] == lengths["h"].tolist() and sum(lengths["h"].tolist()) == len(metrics["h"])
