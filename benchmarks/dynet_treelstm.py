"""DyNet's autobatching on the peers benchmark's workload (issue 16): the SST Tai preset's binary
Tree-LSTM written for DyNet 2.1 (C++; ``dynet_config.set(autobatch=1)``), one computation graph
per batch, every node's loss summed, the graph built in Python per batch *inside* the timing (as
DyNet is used: its autobatching finds the batches while executing that graph).

Optional: needs the ``dynet`` package (``bash scripts/install_dynet.sh``; not on PyPI as a wheel
for Python 3.11).  :func:`available` says whether it imports, and why not.

The function is the one of :class:`benchmarks.levelwise.LevelWiseTreeLSTM`, from a copy of the same
:class:`~pipelines.sst.model.SentimentModules` weights::

    leaf:  i, f_l, f_r, o, u = W x + b            c = s(i) * tanh(u)
    inner: i, f_l, f_r, o, u = U [h_l; h_r] + b   c = s(i) * tanh(u) + s(f_l) * c_l + s(f_r) * c_r
    both:  h = s(o) * tanh(c)          node loss = -log softmax(W_c dropout(h) + b_c)[label]

summed over every node and divided by the number of trees.  :func:`check_equal` compares its loss
and gradients with the PyTorch loop on one batch (dropout off).  The optimizer is DyNet's
``AdagradTrainer`` (lr and eps of the preset, sparse updates of the embedding rows used); DyNet has
one learning rate per trainer, so the embedding's ``lr x embedding_lr_scale`` and the weight decay
of the preset's parameter groups are left out (the same update work, other arithmetic).
DyNet runs on one CPU thread whatever ``torch.set_num_threads`` says.
"""
from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["available", "DyNetTreeLSTM", "DyNetTrainer", "check_equal"]

_IMPORT_ERROR: Optional[str] = None


def _dynet(seed: int = 0):
    """The ``dynet`` module, configured with autobatching on its first import in this process.
    The import leaves the thread's floating-point environment as it was (:func:`_same_fenv`)."""
    import dynet_config
    cfg = dynet_config.get()
    if cfg is None:
        dynet_config.set(autobatch=1, random_seed=seed + 1)   # DyNet reads seed 0 as "random"
    with _same_fenv():
        import dynet
    return dynet


class _same_fenv:
    """Restores the calling thread's floating-point environment (C ``fegetenv`` / ``fesetenv``)
    on exit: DyNet's library is linked with ``-ffast-math``, whose load-time constructor turns on
    flush-to-zero and denormals-are-zero, which would change every later float operation of the
    process (subnormals read and computed as 0).  A no-op where libm cannot be loaded."""

    def __enter__(self):
        import ctypes
        import ctypes.util

        try:
            self._libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
            self._env = ctypes.create_string_buffer(256)   # fenv_t is 28-32 bytes on glibc x86-64 / aarch64
            if self._libm.fegetenv(self._env) != 0:
                self._libm = None
        except OSError:
            self._libm = None
        return self

    def __exit__(self, *exc):
        if self._libm is not None:
            self._libm.fesetenv(self._env)
        return False


def available() -> Tuple[bool, str]:
    """``(True, "")`` when DyNet imports with autobatching on; else ``(False, why)``."""
    try:
        _dynet()
        import dynet_config
        if not int(dynet_config.get().get("autobatch", 0)):
            return False, "dynet was imported before this benchmark configured it without autobatching"
    except Exception as err:   # ImportError, or a native library that fails to load
        return False, f"import dynet failed: {err}"
    return True, ""


class DyNetTreeLSTM:
    """The model in DyNet over copies of ``modules``' weights (a
    :class:`~pipelines.sst.model.SentimentModules`; ``forget_bias`` 0 and no input or recurrent
    dropout, as in the Tai preset).  ``output_dropout``: the classifier's dropout probability in
    training mode."""

    def __init__(self, modules, stoi, unk_index: int = 0, lr: float = 0.05, eps: float = 1e-10,
                 seed: int = 0):
        cell = modules.tree_lstm.cell
        if cell.forget_bias or cell.recurrent_dropout or modules.word[2].p:
            raise ValueError("DyNetTreeLSTM implements forget_bias 0 and no input or recurrent dropout")
        dy = self.dy = _dynet(seed)
        self.stoi, self.unk = stoi, unk_index
        self.S = modules.state_size
        self.output_dropout = float(modules.classifier[0].p)
        self.training = True

        def arr(t):
            return t.detach().cpu().numpy().astype(np.float32)
        pc = self.pc = dy.ParameterCollection()
        self.E = pc.lookup_parameters_from_numpy(arr(modules.embedding.weight))
        self.W = pc.parameters_from_numpy(arr(cell.W.weight))
        self.b = pc.parameters_from_numpy(arr(cell.W.bias))
        self.U = pc.parameters_from_numpy(arr(cell.U.weight))
        self.Wc = pc.parameters_from_numpy(arr(modules.classifier[1].weight))
        self.bc = pc.parameters_from_numpy(arr(modules.classifier[1].bias))
        self.trainer = dy.AdagradTrainer(pc, learning_rate=lr, eps=eps)

    def _node(self, tree, losses: list):
        """``(h, c)`` of ``tree`` (a raw SST tuple tree); appends every node's loss."""
        dy, S = self.dy, self.S
        if len(tree) == 2:
            z = self.W * dy.lookup(self.E, self.stoi.get(tree[1], self.unk)) + self.b
            c = dy.cmult(dy.logistic(dy.pick_range(z, 0, S)), dy.tanh(dy.pick_range(z, 4 * S, 5 * S)))
        else:
            h_l, c_l = self._node(tree[1], losses)
            h_r, c_r = self._node(tree[2], losses)
            z = self.U * dy.concatenate([h_l, h_r]) + self.b
            c = (dy.cmult(dy.logistic(dy.pick_range(z, 0, S)), dy.tanh(dy.pick_range(z, 4 * S, 5 * S)))
                 + dy.cmult(dy.logistic(dy.pick_range(z, S, 2 * S)), c_l)
                 + dy.cmult(dy.logistic(dy.pick_range(z, 2 * S, 3 * S)), c_r))
        h = dy.cmult(dy.logistic(dy.pick_range(z, 3 * S, 4 * S)), dy.tanh(c))
        x = dy.dropout(h, self.output_dropout) if self.training and self.output_dropout else h
        losses.append(dy.pickneglogsoftmax(self.Wc * x + self.bc, int(tree[0])))
        return h, c

    def loss(self, trees: Sequence):
        """A new computation graph holding the batch's loss (a DyNet expression, not yet run)."""
        self.dy.renew_cg()
        losses: List = []
        for t in trees:
            self._node(t, losses)
        return self.dy.esum(losses) * (1.0 / len(trees))


class DyNetTrainer:
    """:class:`benchmarks.peers.Trainer`'s contract for DyNet: :meth:`epoch` trains once over
    ``batches`` (lists of raw trees) and appends ``(forward_s, backward_s, optimizer_s)`` to
    :attr:`splits`; forward counts the graph building and its autobatched execution."""

    def __init__(self, model: DyNetTreeLSTM, batches: Sequence[Sequence]):
        self.model, self.batches = model, batches
        self.splits: List[tuple] = []

    def epoch(self) -> None:
        fwd = bwd = opt = 0.0
        clock = time.perf_counter
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
        self.splits.append((fwd, bwd, opt))


def check_equal(modules, trees: Sequence, stoi, atol: float = 1e-4) -> dict:
    """Loss and gradients of one batch, DyNet vs :class:`benchmarks.levelwise.LevelWiseTreeLSTM`, on
    copies of ``modules`` with dropout off.  Raises AssertionError when they differ; returns
    ``{"loss": ..., "max_grad_diff": ...}``."""
    import copy

    from .levelwise import LevelWiseTreeLSTM, level_batch
    hand_m = copy.deepcopy(modules).eval()
    loss_h = LevelWiseTreeLSTM(hand_m).loss(level_batch(trees, stoi))
    loss_h.backward()
    loss_h = loss_h.detach()
    model = DyNetTreeLSTM(modules, stoi)
    model.training = False
    loss_d = model.loss(trees)
    value = loss_d.value()
    loss_d.backward()
    assert abs(value - float(loss_h)) <= atol * max(1.0, abs(float(loss_h))), (value, float(loss_h))
    cell = hand_m.tree_lstm.cell
    pairs = [("W", model.W, cell.W.weight), ("b", model.b, cell.W.bias), ("U", model.U, cell.U.weight),
             ("Wc", model.Wc, hand_m.classifier[1].weight), ("bc", model.bc, hand_m.classifier[1].bias),
             ("E", model.E, hand_m.embedding.weight)]
    diff = 0.0
    for name, p, t in pairs:
        g = t.grad.to_dense() if t.grad.is_sparse else t.grad
        d = float(np.abs(p.grad_as_array() - g.numpy()).max())
        assert d <= atol * max(1.0, float(g.abs().max())), (name, d)
        diff = max(diff, d)
    return {"loss": float(loss_h), "max_grad_diff": diff}
