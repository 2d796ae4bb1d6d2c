"""DyNet at its best on the peers benchmark's workload: the SST Tai preset's binary Tree-LSTM in
DyNet 2.1 with autobatching (``dynet_config.set(autobatch=1)``), one computation graph per
batch, every node's loss summed, the graph built in Python per batch *inside* the timing (as
DyNet is used: its autobatching finds the batches while executing that graph).

DyNet runs **in its own process** (:class:`DyNetProcess`: ``python -m benchmarks.dynet_treelstm
--serve``, which imports neither torch nor foldengine) and is written **in the layout of DyNet's
own Tree-LSTM example** (``examples/treelstm/model.py`` of clab/dynet): one parameter matrix per
gate, ``dy.affine_transform([b, W, x])`` per gate, and leaves computing only the gates a leaf
uses.  Both matter; the reference this replaces ran DyNet in the benchmark's torch process and
restored the floating-point environment after importing it (DyNet's library is built with
``-ffast-math``, whose load-time constructor turns on flush-to-zero: in its own process DyNet
keeps it, as its users run it), and computed all five gates with ``W * x + b`` and
``pick_range``.  Both are kept as options to measure what each costs: ``layout="stacked"``
(:data:`LAYOUTS`) and ``DyNetProcess(flush_to_zero=False)``; ``docs/benchmarks.md`` has the
figures.

The function is the one of :class:`benchmarks.levelwise.LevelWiseTreeLSTM`, from a copy of the same
:class:`~pipelines.sst.model.SentimentModules` weights (:func:`weights_of`)::

    leaf:  i, o, u = W_g x + b_g (g = i, o, u)         c = s(i) * tanh(u)
    inner: g = U_g [h_l; h_r] + b_g (g = i, f_l, f_r, o, u)
           c = s(i) * tanh(u) + s(f_l) * c_l + s(f_r) * c_r
    both:  h = s(o) * tanh(c)          node loss = -log softmax(W_c dropout(h) + b_c)[label]

summed over every node and divided by the number of trees (a leaf's forget gates multiply the
zero state of its absent children, so leaving them out is the same function).
:func:`check_equal` compares the loss and gradients of one batch with the PyTorch loop (dropout
off).  The optimizer is DyNet's ``AdagradTrainer`` (lr and eps of the preset, sparse updates of
the embedding rows used); DyNet has one learning rate per trainer, so the embedding's
``lr x embedding_lr_scale`` and the weight decay of the preset's parameter groups are left out
(the same update work, other arithmetic).  DyNet runs on one CPU thread.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .peer_process import PeerProcess, reply_stream, serve_loop

__all__ = ["GATES", "weights_of", "parse_tree", "DyNetTreeLSTM", "DyNetTrainer", "DyNetProcess", "RemoteTrainer", "available",
           "check_equal", "serve", "main"]

#: the cell's gates, in the order of the rows of ``W`` and ``U`` (:class:`pipelines.sst.model.BinaryTreeLSTMCell`)
GATES = ("i", "f_l", "f_r", "o", "u")
#: the gates a leaf computes (its forget gates would multiply the zero state of absent children)
LEAF_GATES = ("i", "o", "u")
#: ``example``: DyNet's own example's layout (a matrix and ``affine_transform`` per gate);
#: ``stacked``: the old reference's (the five gates stacked, ``W * x + b`` and ``pick_range``)
LAYOUTS = ("example", "stacked")


def weights_of(modules) -> Dict[str, np.ndarray]:
    """The float32 arrays DyNet starts from, copied from ``modules`` (a
    :class:`~pipelines.sst.model.SentimentModules`; ``forget_bias`` 0, no input or recurrent
    dropout, as in the Tai preset): ``E`` (vocabulary x emb), per gate ``g`` of :data:`GATES`
    ``W_g`` (state x emb), ``U_g`` (state x 2 state) and ``b_g`` (state), ``Wc``, ``bc`` and
    ``output_dropout`` (a 0-d array).  Raises ``ValueError`` for what the DyNet model does not
    implement."""
    cell = modules.tree_lstm.cell
    if cell.forget_bias or cell.recurrent_dropout or modules.word[2].p:
        raise ValueError("DyNetTreeLSTM implements forget_bias 0 and no input or recurrent dropout")

    def arr(t):
        return t.detach().cpu().numpy().astype(np.float32)
    S = modules.state_size
    W, U, b = arr(cell.W.weight), arr(cell.U.weight), arr(cell.W.bias)
    out = {"E": arr(modules.embedding.weight), "Wc": arr(modules.classifier[1].weight),
           "bc": arr(modules.classifier[1].bias),
           "output_dropout": np.array(float(modules.classifier[0].p), dtype=np.float32)}
    for k, g in enumerate(GATES):
        rows = slice(k * S, (k + 1) * S)
        out[f"W_{g}"], out[f"U_{g}"], out[f"b_{g}"] = W[rows], U[rows], b[rows]
    return out


#: environment variable of the DyNet process: ``restore`` puts the floating-point environment back
#: as it was before DyNet's library loaded (flush-to-zero off), as the old in-process reference did
FENV_VARIABLE = "FOLD_DYNET_FENV"


class _same_fenv:
    """Restores the calling thread's floating-point environment (C ``fegetenv`` / ``fesetenv``) on
    exit: DyNet's library is linked with ``-ffast-math``, whose load-time constructor turns on
    flush-to-zero and denormals-are-zero."""

    def __enter__(self):
        import ctypes
        import ctypes.util

        self._libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        self._env = ctypes.create_string_buffer(256)   # fenv_t is 28-32 bytes on glibc x86-64 / aarch64
        if self._libm.fegetenv(self._env) != 0:
            raise OSError("fegetenv failed")
        return self

    def __exit__(self, *exc):
        self._libm.fesetenv(self._env)
        return False


def _dynet(seed: int = 0):
    """The ``dynet`` module, configured with autobatching on its first import in this process;
    with ``$FOLD_DYNET_FENV=restore`` the floating-point environment is put back after the import
    (:data:`FENV_VARIABLE`)."""
    import dynet_config
    if dynet_config.get() is None:
        dynet_config.set(autobatch=1, random_seed=seed + 1)   # DyNet reads seed 0 as "random"
    if os.environ.get(FENV_VARIABLE) == "restore":
        with _same_fenv():
            import dynet
    else:
        import dynet
    return dynet


class DyNetTreeLSTM:
    """The model in DyNet (module docstring) over ``weights`` (:func:`weights_of`); ``stoi``: word
    -> embedding row.  Runs in the process that imports DyNet (:func:`serve`)."""

    def __init__(self, weights: Mapping[str, np.ndarray], stoi: Mapping[str, int], unk_index: int = 0,
                 lr: float = 0.05, eps: float = 1e-10, seed: int = 0, layout: str = "example"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        dy = self.dy = _dynet(seed)
        self.stoi, self.unk = stoi, unk_index
        self.output_dropout = float(weights["output_dropout"])
        self.S = int(weights["b_i"].shape[0])
        self.training = True
        pc = self.pc = dy.ParameterCollection()
        self.E = pc.lookup_parameters_from_numpy(weights["E"])
        self.W = {g: pc.parameters_from_numpy(weights[f"W_{g}"]) for g in LEAF_GATES}
        self.U = {g: pc.parameters_from_numpy(weights[f"U_{g}"]) for g in GATES}
        self.b = {g: pc.parameters_from_numpy(weights[f"b_{g}"]) for g in GATES}
        self.Wc = pc.parameters_from_numpy(weights["Wc"])
        self.bc = pc.parameters_from_numpy(weights["bc"])
        if layout == "stacked":   # the old reference's parameters: all five gates stacked
            self.W_all = pc.parameters_from_numpy(np.concatenate([weights[f"W_{g}"] for g in GATES]))
            self.U_all = pc.parameters_from_numpy(np.concatenate([weights[f"U_{g}"] for g in GATES]))
            self.b_all = pc.parameters_from_numpy(np.concatenate([weights[f"b_{g}"] for g in GATES]))
        self.trainer = dy.AdagradTrainer(pc, learning_rate=lr, eps=eps)

    def _stacked_node(self, tree, losses: list, p: dict):
        """:meth:`_node` as the old reference wrote it: ``W * x + b`` over the five stacked gates,
        each gate a ``pick_range`` of it, operator overloads instead of ``affine_transform``."""
        dy, S = self.dy, self.S
        if len(tree) == 2:
            z = p["W_all"] * dy.lookup(self.E, self.stoi.get(tree[1], self.unk)) + p["b_all"]
            c = dy.cmult(dy.logistic(dy.pick_range(z, 0, S)), dy.tanh(dy.pick_range(z, 4 * S, 5 * S)))
        else:
            h_l, c_l = self._stacked_node(tree[1], losses, p)
            h_r, c_r = self._stacked_node(tree[2], losses, p)
            z = p["U_all"] * dy.concatenate([h_l, h_r]) + p["b_all"]
            c = (dy.cmult(dy.logistic(dy.pick_range(z, 0, S)), dy.tanh(dy.pick_range(z, 4 * S, 5 * S)))
                 + dy.cmult(dy.logistic(dy.pick_range(z, S, 2 * S)), c_l)
                 + dy.cmult(dy.logistic(dy.pick_range(z, 2 * S, 3 * S)), c_r))
        h = dy.cmult(dy.logistic(dy.pick_range(z, 3 * S, 4 * S)), dy.tanh(c))
        x = dy.dropout(h, self.output_dropout) if self.training and self.output_dropout else h
        losses.append(dy.pickneglogsoftmax(p["Wc"] * x + p["bc"], int(tree[0])))
        return h, c

    def _node(self, tree, losses: list, p: dict):
        """``(h, c)`` of ``tree`` (a raw SST tuple tree); appends every node's loss.  ``p``: this
        graph's parameter expressions."""
        dy = self.dy
        if len(tree) == 2:
            x = dy.lookup(self.E, self.stoi.get(tree[1], self.unk))
            i = dy.logistic(dy.affine_transform([p["b_i"], p["W_i"], x]))
            o = dy.logistic(dy.affine_transform([p["b_o"], p["W_o"], x]))
            u = dy.tanh(dy.affine_transform([p["b_u"], p["W_u"], x]))
            c = dy.cmult(i, u)
        else:
            h_l, c_l = self._node(tree[1], losses, p)
            h_r, c_r = self._node(tree[2], losses, p)
            e = dy.concatenate([h_l, h_r])
            i = dy.logistic(dy.affine_transform([p["b_i"], p["U_i"], e]))
            f_l = dy.logistic(dy.affine_transform([p["b_f_l"], p["U_f_l"], e]))
            f_r = dy.logistic(dy.affine_transform([p["b_f_r"], p["U_f_r"], e]))
            o = dy.logistic(dy.affine_transform([p["b_o"], p["U_o"], e]))
            u = dy.tanh(dy.affine_transform([p["b_u"], p["U_u"], e]))
            c = dy.cmult(i, u) + dy.cmult(f_l, c_l) + dy.cmult(f_r, c_r)
        h = dy.cmult(o, dy.tanh(c))
        if losses is not None:
            x = dy.dropout(h, self.output_dropout) if self.training and self.output_dropout else h
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([p["bc"], p["Wc"], x]), int(tree[0])))
        return h, c

    def _parameters(self) -> dict:
        """The parameters by name, used in expressions as they are (DyNet 2.1 adds a parameter to
        the graph where it is used; the explicit ``dy.parameter`` of older code is deprecated)."""
        p = {f"W_{g}": w for g, w in self.W.items()}
        p.update({f"U_{g}": u for g, u in self.U.items()})
        p.update({f"b_{g}": b for g, b in self.b.items()})
        p.update(Wc=self.Wc, bc=self.bc)
        if self.layout == "stacked":
            p.update(W_all=self.W_all, U_all=self.U_all, b_all=self.b_all)
        return p

    def root_probabilities(self, trees: Sequence) -> np.ndarray:
        """Inference: the softmax of each tree's root logits, ``[len(trees), classes]`` (float32),
        from one computation graph (autobatched; no per-node classifier, no dropout)."""
        dy = self.dy
        dy.renew_cg()
        p = self._parameters()
        outs = [dy.softmax(dy.affine_transform([p["bc"], p["Wc"], self._node(t, None, p)[0]])) for t in trees]
        return np.asarray(dy.concatenate_cols(outs).npvalue(), dtype=np.float32).reshape(-1, len(trees)).T

    def loss(self, trees: Sequence):
        """A new computation graph holding the batch's loss (a DyNet expression, not yet run)."""
        dy = self.dy
        dy.renew_cg()
        p = self._parameters()
        losses: List = []
        if self.layout == "stacked":
            for t in trees:
                self._stacked_node(t, losses, p)
        else:
            for t in trees:
                self._node(t, losses, p)
        return dy.esum(losses) * (1.0 / len(trees))

    def gradients(self) -> Dict[str, np.ndarray]:
        """The gradients of the last backward, named as :func:`weights_of` names the weights."""
        out = {"E": self.E.grad_as_array(), "Wc": self.Wc.grad_as_array(), "bc": self.bc.grad_as_array()}
        if self.layout == "stacked":
            S = self.S
            for group, p in (("W", self.W_all), ("U", self.U_all), ("b", self.b_all)):
                g_all = p.grad_as_array()
                out.update({f"{group}_{g}": g_all[k * S:(k + 1) * S] for k, g in enumerate(GATES)
                            if group != "W" or g in LEAF_GATES})
            return out
        for group, params in (("W", self.W), ("U", self.U), ("b", self.b)):
            out.update({f"{group}_{g}": p.grad_as_array() for g, p in params.items()})
        return out


_TOKENS = None


def parse_tree(line: str):
    """One PTB line -> the raw tuple tree (``(label, word)`` / ``(label, left, right)``), parsed
    as DyNet's Tree-LSTM example reads its trees (a regular expression's tokens, recursively);
    raises ``ValueError`` for a line that is not a binary tree."""
    global _TOKENS
    import re
    if _TOKENS is None:
        _TOKENS = re.compile(r"[()]|[^\s()]+")
    toks = _TOKENS.findall(line)
    pos = 0

    def node():
        nonlocal pos
        if toks[pos] != "(":
            raise ValueError(f"expected '(' at token {pos}")
        label = int(toks[pos + 1])
        pos += 2
        if toks[pos] != "(":
            word = toks[pos]
            if toks[pos + 1] != ")":
                raise ValueError("a leaf of more than one word")
            pos += 2
            return (label, word)
        left = node()
        right = node()
        if toks[pos] != ")":
            raise ValueError("not a binary tree")
        pos += 1
        return (label, left, right)
    try:
        tree = node()
    except IndexError:
        raise ValueError("unbalanced parentheses") from None
    if pos != len(toks):
        raise ValueError("trailing text")
    return tree


class DyNetTrainer:
    """One training epoch over ``batches`` (lists of raw trees), in the DyNet process:
    :meth:`epoch` returns ``(wall_s, cpu_s, (forward_s, backward_s, optimizer_s))``; forward counts
    the graph building and its autobatched execution."""

    def __init__(self, model: DyNetTreeLSTM, batches: Sequence[Sequence]):
        self.model, self.batches = model, batches

    def epoch(self) -> Tuple[float, float, Tuple[float, float, float]]:
        fwd = bwd = opt = 0.0
        clock = time.perf_counter
        c0, t0 = time.process_time(), clock()
        for trees in self.batches:
            t1 = clock()
            loss = self.model.loss(trees)
            loss.forward()
            t2 = clock()
            loss.backward()
            t3 = clock()
            self.model.trainer.update()
            t4 = clock()
            fwd, bwd, opt = fwd + (t2 - t1), bwd + (t3 - t2), opt + (t4 - t3)
        return clock() - t0, time.process_time() - c0, (fwd, bwd, opt)


# --------------------------------------------------------------------------- the DyNet process

def serve(stdin=None, stdout=None) -> None:
    """The DyNet process's loop (``python -m benchmarks.dynet_treelstm --serve``;
    :func:`benchmarks.peer_process.serve_loop`'s wire format):

    * ``("model", weights, stoi, lr, eps, seed, layout)`` -> ``None``: a new :class:`DyNetTreeLSTM`;
    * ``("batches", batches)`` -> ``None``: the epoch's batches (lists of raw trees);
    * ``("epoch",)`` -> ``(wall_s, cpu_s, splits)`` of :meth:`DyNetTrainer.epoch` (training mode);
    * ``("check", trees)`` -> ``(loss, gradients)`` of one batch in eval mode (no update);
    * ``("infer", lines, batch)`` -> ``(wall_s, cpu_s, probabilities)``: every PTB line parsed
      (:func:`parse_tree`) and predicted, ``batch`` trees per graph
      (:meth:`DyNetTreeLSTM.root_probabilities`);
    * ``("quit",)``.

    A failing request is answered ``("error", text)``."""
    state: dict = {}

    def model(weights, stoi, lr, eps, seed, layout):
        state["model"] = DyNetTreeLSTM(weights, stoi, lr=lr, eps=eps, seed=seed, layout=layout)
        state.pop("trainer", None)

    def batches(b):
        state["trainer"] = DyNetTrainer(state["model"], b)

    def epoch():
        state["model"].training = True
        return state["trainer"].epoch()

    def infer(lines, batch):
        m = state["model"]
        m.training = False
        c0, t0 = time.process_time(), time.perf_counter()
        batch = int(batch)
        probs = [m.root_probabilities([parse_tree(x) for x in lines[a:a + batch]])
                 for a in range(0, len(lines), batch)]
        return time.perf_counter() - t0, time.process_time() - c0, np.concatenate(probs)

    def check(trees):
        m = state["model"]
        m.training = False
        loss = m.loss(trees)
        value = loss.value()
        loss.backward()
        return value, m.gradients()

    serve_loop({"model": model, "batches": batches, "epoch": epoch, "infer": infer, "check": check},
               stdin, stdout)


class DyNetProcess(PeerProcess):
    """DyNet in its own process (``python``, default this interpreter, running :func:`serve`);
    ``flush_to_zero=False`` puts the floating-point environment back after DyNet loads (as the old
    in-process reference did; :data:`FENV_VARIABLE`).

        with DyNetProcess() as dy:
            dy.model(weights_of(modules), vocab.stoi, lr=0.05)
            dy.batches(chunks)
            wall_s, cpu_s, splits = dy.epoch()
    """

    def __init__(self, python: Optional[str] = None, flush_to_zero: bool = True):
        super().__init__("benchmarks.dynet_treelstm", python, name="DyNet",
                         env={FENV_VARIABLE: None if flush_to_zero else "restore"})

    def model(self, weights: Mapping[str, np.ndarray], stoi: Mapping[str, int], lr: float = 0.05,
              eps: float = 1e-10, seed: int = 0, layout: str = "example") -> None:
        self.call("model", dict(weights), dict(stoi), float(lr), float(eps), int(seed), layout)

    def batches(self, batches: Sequence[Sequence]) -> None:
        self.call("batches", [list(b) for b in batches])

    def epoch(self) -> Tuple[float, float, Tuple[float, float, float]]:
        return self.call("epoch")

    def check(self, trees: Sequence) -> Tuple[float, Dict[str, np.ndarray]]:
        return self.call("check", list(trees))

    def infer(self, lines: Sequence[str], batch: int) -> Tuple[float, float, np.ndarray]:
        """``(wall_s, cpu_s, probabilities)`` of the DyNet process predicting ``lines``."""
        return self.call("infer", list(lines), int(batch))


class RemoteTrainer:
    """:class:`benchmarks.peers.Trainer`'s contract for the DyNet process: each :meth:`epoch` trains
    once over the process's batches and records the process's own wall and CPU seconds
    (:attr:`walls`, :attr:`cpus`) and ``(forward_s, backward_s, optimizer_s)`` (:attr:`splits`),
    so the figures are DyNet's, not the pipe's."""

    def __init__(self, process: DyNetProcess):
        self.process = process
        self.walls: List[float] = []
        self.cpus: List[float] = []
        self.splits: List[tuple] = []

    def epoch(self) -> None:
        wall, cpu, splits = self.process.epoch()
        self.walls.append(wall)
        self.cpus.append(cpu)
        self.splits.append(tuple(splits))


def available(python: Optional[str] = None) -> Tuple[bool, str]:
    """``(True, "")`` when DyNet imports with autobatching in ``python`` (default this
    interpreter); else ``(False, why)``."""
    code = ("import dynet_config; dynet_config.set(autobatch=1); import dynet; "
            "assert int(dynet_config.get().get('autobatch', 0))")
    try:
        res = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"import dynet failed: {err}"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"import dynet failed: {last}"
    return True, ""


def reference_loss_and_grads(modules, trees: Sequence, stoi) -> Tuple[float, Dict[str, np.ndarray]]:
    """The loss of one batch and its gradients, named as :func:`weights_of` names the weights,
    from :class:`benchmarks.levelwise.LevelWiseTreeLSTM` on a copy of ``modules`` with dropout
    off (the function DyNet and :mod:`benchmarks.dynet_port` compute).  A leaf's forget gates
    get no gradient (they multiply the zero state of absent children): asserted, and left out."""
    import copy

    from .levelwise import LevelWiseTreeLSTM, level_batch
    hand_m = copy.deepcopy(modules).eval()
    loss_h = LevelWiseTreeLSTM(hand_m).loss(level_batch(trees, stoi))
    loss_h.backward()
    cell, S = hand_m.tree_lstm.cell, hand_m.state_size

    def dense(t):
        return (t.grad.to_dense() if t.grad.is_sparse else t.grad).numpy()
    want = {"E": dense(hand_m.embedding.weight), "Wc": dense(hand_m.classifier[1].weight),
            "bc": dense(hand_m.classifier[1].bias)}
    W, U, b = dense(cell.W.weight), dense(cell.U.weight), dense(cell.W.bias)
    for k, g in enumerate(GATES):
        rows = slice(k * S, (k + 1) * S)
        want[f"U_{g}"], want[f"b_{g}"] = U[rows], b[rows]
        if g in LEAF_GATES:
            want[f"W_{g}"] = W[rows]
        else:
            assert not np.abs(W[rows]).any(), g
    return float(loss_h.detach()), want


def assert_same(value: float, grads: Mapping[str, np.ndarray], want_value: float,
                want: Mapping[str, np.ndarray], atol: float = 1e-4) -> float:
    """Raise AssertionError unless the loss and every gradient of ``want`` match (relative to
    their size, ``atol``); returns the largest gradient difference."""
    assert abs(value - want_value) <= atol * max(1.0, abs(want_value)), (value, want_value)
    diff = 0.0
    for name, g in want.items():
        d = float(np.abs(grads[name] - g).max())
        assert d <= atol * max(1.0, float(np.abs(g).max())), (name, d)
        diff = max(diff, d)
    return diff


def check_equal(dynet: DyNetProcess, modules, trees: Sequence, stoi, atol: float = 1e-4) -> dict:
    """Loss and gradients of one batch, DyNet (in ``dynet``, whose model must hold
    :func:`weights_of` ``modules``) vs :func:`reference_loss_and_grads`.  Raises AssertionError
    when they differ; returns ``{"loss": ..., "max_grad_diff": ...}``."""
    loss_h, want = reference_loss_and_grads(modules, trees, stoi)
    value, grads = dynet.check(trees)
    return {"loss": loss_h, "max_grad_diff": assert_same(value, grads, loss_h, want, atol)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks.dynet_treelstm --serve``: the DyNet process (:func:`serve`), started
    by :class:`DyNetProcess` for ``benchmarks.peers`` and ``benchmarks.peers_inference``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.dynet_treelstm",
                                 description="The DyNet process of benchmarks.peers and benchmarks.peers_inference: "
                                             "requests on stdin, replies on stdout (see serve()).")
    ap.add_argument("--serve", action="store_true", required=True, help="answer requests until stdin closes")
    ap.parse_args(argv)
    serve(sys.stdin.buffer, reply_stream())   # DyNet prints its notes on stdout: they go to stderr
    return 0


if __name__ == "__main__":
    sys.exit(main())
