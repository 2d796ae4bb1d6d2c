"""The SST sentiment Tree-LSTM (Tai et al. 2015; Looks et al. 2017 sec. 3.5) in foldengine blocks.

One :class:`TreeLSTM` module (one :class:`~foldengine.layers.BinaryTreeLSTMCell`, one set of
parameters) computes leaves (``leaf(x)``, no children) and inner nodes (``pair(left, right)``,
zero input): the paper's function.  Every node has a softmax classifier (dropout before it) whose
logits and gold label are ``fb.Metric`` s of ``compiler.run(batch).metrics``:
``root_logits [B, 5]`` and ``root_label [B] int64`` (a row per tree, in input order), ``logits
[N, 5]`` and ``label [N] int64`` (every non-root node of the batch).  Inputs are the raw tuple
trees of :mod:`pipelines.sst.data` (leaf ``(label, word)``, inner node ``(label, left, right)``);
words map to vocabulary ids inside an ``fb.InputTransform``, so batches are built from raw trees
(in Ray Data tasks).
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.layers import BinaryTreeLSTMCell, Dropout
from foldengine.types import PyObjectType, TensorType, TupleType

__all__ = ["NUM_CLASSES", "TreeLSTM", "SentimentModules", "build_compiler", "node_outputs",
           "count_stats", "summarize_counts"]

NUM_CLASSES = 5


class TreeLSTM(nn.Module):
    """One Tree-LSTM cell called two ways (both wrapped in ``fb.Function``):

    ``forward(x) -> (h, c)``: a leaf, ``TreeLSTM(x, 0, 0)``;
    ``forward((h_l, c_l), (h_r, c_r)) -> (h, c)``: an inner node, ``TreeLSTM(0, left, right)``.
    """

    def __init__(self, input_size: int, state_size: int, recurrent_dropout: float = 0.0,
                 forget_bias: float = 0.0, init: str = "torch"):
        super().__init__()
        self.cell = BinaryTreeLSTMCell(input_size, state_size, recurrent_dropout, forget_bias, init)

    def forward(self, *args):
        if len(args) == 1:
            return self.cell.leaf(args[0])
        left, right = args
        return self.cell.pair(left, right)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class GradScale(nn.Module):
    """Identity forward; multiplies the gradient flowing back through it by ``scale``.

    Put after the embedding it scales the embedding's gradient, which is how TF Fold's sentiment
    example applies its ``EMBEDDING_LEARNING_RATE_FACTOR`` (``tf.scalar_mul`` on the gradient).
    """

    def __init__(self, scale: float):
        super().__init__()
        self.scale = float(scale)

    def forward(self, x):
        return x if self.scale == 1.0 else _ScaleGrad.apply(x, self.scale)

    def extra_repr(self):
        return f"scale={self.scale}"


class SentimentModules(nn.Module):
    """The model's modules: word embedding (+ input dropout), Tree-LSTM, dropout + classifier.

    ``input_dropout`` drops embedding entries (TF Fold's ``DropoutWrapper(input_keep_prob)``);
    ``output_dropout`` drops ``h`` before the classifier (Tai et al.; TF Fold's
    ``output_keep_prob``); ``recurrent_dropout`` drops the cell's update ``u``.  All are
    probabilities of *dropping* (the paper's keep prob 0.75 is 0.25 here).
    ``embedding_grad_scale`` multiplies the embedding's gradient (:class:`GradScale`);
    ``forget_bias`` and ``init`` go to the cell (:class:`~foldengine.layers.BinaryTreeLSTMCell`);
    ``init="glorot"`` also draws the classifier Glorot-uniform with zero bias (TF's ``FC``).
    ``sparse_embedding``: the embedding's gradient is a sparse COO tensor holding only the rows
    a batch used (``nn.Embedding(sparse=True)``); the optimizer must take sparse gradients
    (Adagrad, SGD without weight decay on the embedding).  Adagrad's update is the same either way:
    a row without gradient gets no update and no accumulator change.
    """

    def __init__(self, vocab_size: int, emb_size: int, state_size: int, *, input_dropout: float = 0.0,
                 output_dropout: float = 0.0, recurrent_dropout: float = 0.0,
                 embeddings: Optional[np.ndarray] = None, embedding_grad_scale: float = 1.0,
                 forget_bias: float = 0.0, init: str = "torch", sparse_embedding: bool = False):
        super().__init__()
        self.emb_size, self.state_size = emb_size, state_size
        self.embedding = nn.Embedding(vocab_size, emb_size, sparse=bool(sparse_embedding))
        if embeddings is not None:
            if embeddings.shape != (vocab_size, emb_size):
                raise ValueError(f"embedding matrix {embeddings.shape} != ({vocab_size}, {emb_size})")
            with torch.no_grad():
                self.embedding.weight.copy_(torch.tensor(np.asarray(embeddings, np.float32)))
        self.word = nn.Sequential(self.embedding, GradScale(embedding_grad_scale), Dropout(input_dropout))
        self.tree_lstm = TreeLSTM(emb_size, state_size, recurrent_dropout, forget_bias, init)
        self.classifier = nn.Sequential(Dropout(output_dropout), nn.Linear(state_size, NUM_CLASSES))
        if init == "glorot":
            nn.init.xavier_uniform_(self.classifier[1].weight)
            nn.init.zeros_(self.classifier[1].bias)


def build_compiler(modules: SentimentModules, stoi: Mapping[str, int], scheduler="depth", labels: bool = True,
                   node_logits: bool = True) -> fe.Compiler:
    """The compiled model: raw SST trees in (a word not in ``stoi`` gets id 0, the unknown word);
    metrics as in the module docstring; output the root state ``(h, c)`` (``[B, S]`` each).

    ``labels=False`` leaves out the gold-label metrics (``root_label``, ``label``) and
    ``node_logits=False`` the non-root nodes' classifier (``logits``): prediction builds such
    compilers over the same ``modules``, and traces and runs less per node.  The parameters are
    named by the default compiler (``labels=True, node_logits=True``): load a state dict there.
    """
    S = modules.state_size
    state = TupleType(TensorType(S), TensorType(S))
    get = stoi.get

    def word_id(word):
        return get(word, 0)

    expr = fb.ForwardDeclaration(PyObjectType(), state, name="tree")

    def node_block(logits_metric: Optional[str], label_metric: str) -> fb.Block:
        # TreeLSTM(Embedding(word), 0, 0) for a leaf (label, word)
        word = (fb.GetItem(1) >> fb.InputTransform(word_id) >> fb.Scalar("int64")
                >> fb.Function(modules.word, name="embedding") >> fb.Function(modules.tree_lstm, name="leaf"))
        # TreeLSTM(0, h_left, h_right) for an inner node (label, left, right)
        pair = fb.Record([(1, expr()), (2, expr())]) >> fb.Function(modules.tree_lstm, name="pair")
        cases = fb.OneOf(key_fn=len, case_blocks=[(2, word), (3, pair)])
        if logits_metric is None:
            return cases
        if not labels:   # state -> record the logits, pass the state on
            return (cases >> fb.AllOf(fb.Identity(), fb.GetItem(0) >> fb.Function(modules.classifier, name="classifier")
                                      >> fb.Metric(logits_metric)) >> fb.GetItem(0))
        head = fb.AllOf(
            fb.GetItem(0) >> fb.GetItem(0) >> fb.Function(modules.classifier, name="classifier")
            >> fb.Metric(logits_metric),
            fb.GetItem(1) >> fb.GetItem(0) >> fb.Scalar("int64") >> fb.Metric(label_metric))
        # (state, node) -> record the head's metrics, pass the state on
        return fb.AllOf(cases, fb.Identity()) >> fb.AllOf(fb.GetItem(0), head) >> fb.GetItem(0)

    expr.resolve_to(node_block("logits" if node_logits else None, "label"))
    root = node_block("root_logits", "root_label")
    return fe.Compiler(root, scheduler=scheduler)


def node_outputs(forward):
    """``(logits [B+N, 5], labels [B+N], is_root [B+N] bool)``, roots first, of ``forward``: a
    forward's :class:`foldengine.ForwardResult` (``compiler.run(batch)``), or a Compiler (its
    last forward's ``metrics``: one thread only)."""
    m = forward.metrics
    logits = torch.cat([m["root_logits"], m["logits"]])
    labels = torch.cat([m["root_label"], m["label"]])
    is_root = torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
    is_root[:len(m["root_label"])] = True
    return logits, labels, is_root


def count_stats(logits: torch.Tensor, labels: torch.Tensor, is_root: torch.Tensor,
                node_loss: Optional[torch.Tensor] = None) -> dict:
    """Sums for :func:`summarize_counts` (floats).

    Fine-grained: argmax over the 5 classes.  Binary (TF Fold's sentiment example): only nodes
    whose gold label is not neutral (2); predicted positive iff p(3) + p(4) > p(0) + p(1).
    The roots' gold labels are counted too (``root_label<c>`` for each class ``c`` 0..4,
    ``root_bin_pos``: non-neutral roots labelled positive), for the majority-class baselines.
    """
    with torch.no_grad():
        logits = logits.detach()
        if node_loss is None:
            node_loss = F.cross_entropy(logits, labels, reduction="none")
        node_loss = node_loss.detach()
        p = torch.softmax(logits.float(), -1)
        fine_hit = logits.argmax(-1) == labels
        bin_mask = labels != 2
        bin_hit = ((p[:, 3] + p[:, 4]) > (p[:, 0] + p[:, 1])) == (labels > 2)
        out = {}
        for prefix, sel in (("root", is_root), ("all", torch.ones_like(is_root))):
            b = sel & bin_mask
            out[f"{prefix}_count"] = float(sel.sum())
            out[f"{prefix}_correct"] = float((fine_hit & sel).sum())
            out[f"{prefix}_bin_count"] = float(b.sum())
            out[f"{prefix}_bin_correct"] = float((bin_hit & b).sum())
            out[f"{prefix}_loss_sum"] = float(node_loss[sel].sum())
        root_labels = labels[is_root]
        for c in range(NUM_CLASSES):
            out[f"root_label{c}"] = float((root_labels == c).sum())
        out["root_bin_pos"] = float((root_labels > 2).sum())
    return out


def summarize_counts(sums: Mapping[str, float]) -> dict:
    """Totals of :func:`count_stats` -> ``fine``, ``binary`` (root accuracies, the paper's
    Table 2 metrics), ``all_fine``, ``all_binary`` (every node), ``root_loss`` (per root),
    ``loss`` (all-node loss per tree, the training objective), and the trivial baselines of the
    evaluated trees: ``majority_fine`` (the share of the roots' most frequent label: the
    fine-grained accuracy of always predicting it) and ``majority_binary`` (the same among the
    non-neutral roots, positive or negative)."""
    def share(x, b):
        d = sums.get(b, 0.0)
        return x / d if d else float("nan")

    def ratio(a, b):
        return share(sums.get(a, 0.0), b)

    pos = sums.get("root_bin_pos", 0.0)
    return {"fine": ratio("root_correct", "root_count"),
            "binary": ratio("root_bin_correct", "root_bin_count"),
            "all_fine": ratio("all_correct", "all_count"),
            "all_binary": ratio("all_bin_correct", "all_bin_count"),
            "root_loss": ratio("root_loss_sum", "root_count"),
            "node_loss": ratio("all_loss_sum", "all_count"),
            "loss": ratio("all_loss_sum", "root_count"),
            "majority_fine": share(max(sums.get(f"root_label{c}", 0.0) for c in range(NUM_CLASSES)), "root_count"),
            "majority_binary": share(max(pos, sums.get("root_bin_count", 0.0) - pos), "root_bin_count")}

