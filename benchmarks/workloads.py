"""Workloads shared by the benchmarks, built from the pipelines' own models.

Each ``*_workload`` returns ``(make_compiler, inputs, loss_of)``: ``make_compiler(scheduler)``
gives a :class:`foldengine.Compiler` (the same modules for every scheduler), ``inputs`` one
batch of examples, and ``loss_of(compiler, output)`` the scalar that a training step
differentiates.  :func:`training_step` / :func:`inference_step` wrap one prepared ``Batch``
into the callables that :func:`benchmarks.timing.interleaved` times.

* SST: the sentiment Tree-LSTM of :mod:`pipelines.sst.model` (``SentimentModules``,
  ``build_compiler``; no dropout) on real SST train trees, with the pipeline's training loss
  (cross-entropy summed over every node, as ``SSTExperiment.loss``); and, for the engine
  benchmark and the heads bound, the same modules with a classifier and loss on the root only
  (:func:`sst_root_loss_compiler`, :func:`sst_naive_root_loss`).
* Table 1 trees: :mod:`benchmarks.table1`'s model on random binary trees.
* Tox21: the weave model of :mod:`pipelines.molecules.model`.
"""
from __future__ import annotations

import random
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, TensorType, TupleType

__all__ = ["training_step", "inference_step", "sst_train", "sst_sample", "sst_modules", "sst_training_loss",
           "sst_root_loss_compiler", "sst_naive_root_loss", "sst_workload", "random_tree_workload",
           "table1_workload", "tox21_workload"]


def training_step(compiler, batch, loss_of) -> Callable[[], None]:
    """Forward + backward of ``loss_of(compiler, compiler(batch))`` (gradients reset first)."""
    def step():
        compiler.zero_grad(set_to_none=True)
        loss_of(compiler, compiler(batch)).backward()
    return step


def inference_step(compiler, batch) -> Callable[[], None]:
    """Forward of ``batch`` without autograd."""
    def step():
        with torch.no_grad():
            compiler(batch)
    return step


# --------------------------------------------------------------------------- SST (pipelines.sst)

def sst_train(data_dir=None):
    """``(trees, vocab)``: the SST train trees and their vocabulary."""
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab
    train, _ = load_split("train", data_dir=data_dir)
    return train, build_vocab(train)


def sst_sample(batch_size: int, seed: int = 0, data_dir=None):
    """``(vocab, trees)``: a random sample of ``batch_size`` train trees."""
    train, vocab = sst_train(data_dir)
    return vocab, random.Random(seed).sample(train, batch_size)


def sst_modules(vocab_size: int, state: int = 150, emb: int = 50, seed: int = 0):
    """The pipeline's :class:`~pipelines.sst.model.SentimentModules` (no dropout), seeded."""
    from pipelines.sst.model import SentimentModules
    torch.manual_seed(seed)
    return SentimentModules(vocab_size, emb, state)


def sst_training_loss(compiler, out) -> torch.Tensor:
    """The SST pipeline's training loss: cross-entropy summed over every node of every tree,
    from the metrics that ``pipelines.sst.model.build_compiler`` records."""
    from pipelines.sst.model import node_outputs
    logits, labels, _ = node_outputs(compiler)
    return F.cross_entropy(logits, labels, reduction="sum")


def _cross_entropy(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def sst_root_loss_compiler(modules, stoi: Mapping[str, int], scheduler="depth", unk_index: int = 0) -> fe.Compiler:
    """The pipeline's modules with a classifier and loss on the root only (no per-node heads):
    raw SST trees ``(label, word)`` / ``(label, left, right)`` -> per-tree loss ``[B]``.
    The Tree-LSTM recursion is ``build_compiler``'s: ``modules.word`` then
    ``modules.tree_lstm`` at a leaf, ``modules.tree_lstm(left, right)`` at an inner node."""
    S = modules.state_size
    get = stoi.get

    def word_id(word):
        return get(word, unk_index)

    expr = fb.ForwardDeclaration(PyObjectType(), TupleType(TensorType(S), TensorType(S)), name="tree")
    word = (fb.GetItem(1) >> fb.InputTransform(word_id) >> fb.Scalar("int64")
            >> fb.Function(modules.word, name="embedding") >> fb.Function(modules.tree_lstm, name="leaf"))
    pair = fb.Record([(1, expr()), (2, expr())]) >> fb.Function(modules.tree_lstm, name="pair")
    expr.resolve_to(fb.OneOf(key_fn=len, case_blocks=[(2, word), (3, pair)]))
    root = fb.AllOf(expr() >> fb.GetItem(0) >> fb.Function(modules.classifier, name="classifier"),
                    fb.GetItem(0) >> fb.Scalar("int64"))
    loss = root >> fb.Function(_cross_entropy, output_type=TensorType(()), name="cross_entropy")
    return fe.Compiler(loss, scheduler=scheduler)


def sst_naive_root_loss(modules, tree, stoi: Mapping[str, int], unk_index: int = 0) -> torch.Tensor:
    """:func:`sst_root_loss_compiler`'s loss of one tree by plain recursion (a batch of one at
    every node, the same module calls): what a user writes without dynamic batching."""
    def state(node):
        if len(node) == 2:
            return modules.tree_lstm(modules.word(torch.tensor([stoi.get(node[1], unk_index)])))
        return modules.tree_lstm(state(node[1]), state(node[2]))
    h, _ = state(tree)
    return F.cross_entropy(modules.classifier(h), torch.tensor([tree[0]]))


def sst_workload(batch_size: int, seed: int = 0, state: int = 150, data_dir=None):
    """SST training batch: the pipeline's Tree-LSTM with a classifier and loss on every node."""
    from pipelines.sst.model import build_compiler
    vocab, trees = sst_sample(batch_size, seed, data_dir)
    modules = sst_modules(len(vocab.itos), state, seed=seed)
    return (lambda s: build_compiler(modules, vocab.stoi, s), trees, sst_training_loss)


# --------------------------------------------------------------------------- Table 1 trees

def random_tree_workload(batch_size: int, leaves: int = 128, size: int = 256, seed: int = 0):
    """Table-1 workload: random binary trees, embedding leaves, the benchmark's cell."""
    from .table1 import Table1Model, fold_compiler, l2_loss, random_tree
    torch.manual_seed(seed)
    model = Table1Model(size, vocab=1000)
    rng = random.Random(seed)
    trees = [random_tree(leaves, 1000, rng) for _ in range(batch_size)]
    return (lambda s: fold_compiler(model, s), trees, lambda c, out: l2_loss(out))


def table1_workload(batch: int, vector: int, leaves: int, same_shape: bool, seed: int = 0):
    """Table 1 trees as :func:`benchmarks.table1.run_table1` builds them (``b`` copies of one
    shape, or ``b`` different trees; as many leaf rows as leaves), 1024-row blocks as on CPU."""
    from .table1 import Table1Model, fill_leaves, fold_compiler, l2_loss, leaf_matrix, make_tree_shape, random_tree
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = Table1Model(vector, vocab=leaves)
    if same_shape:
        shape = make_tree_shape(leaves, rng)
        idx = leaf_matrix(leaves, batch, leaves, torch.Generator().manual_seed(seed))
        trees = [fill_leaves(shape, idx[:, j].tolist()) for j in range(batch)]
    else:
        trees = [random_tree(leaves, leaves, rng) for _ in range(batch)]
    return (lambda s: fold_compiler(model, s, max_call_rows=max(1024, vector)), trees,
            lambda c, out: l2_loss(out))


# --------------------------------------------------------------------------- Tox21 (pipelines.molecules)

def tox21_workload(batch_size: int, seed: int = 0, data_dir=None):
    """Tox21 batch through the pipeline's weave model (2 weave layers, masked BCE)."""
    from pipelines.molecules.data import labels_matrix, load_tox21
    from pipelines.molecules.featurize import N_ATOM_FEATURES, N_PAIR_FEATURES, featurize_dataset
    from pipelines.molecules.model import masked_bce_sum, weave_model

    records, _ = load_tox21(data_dir)
    picked = random.Random(seed).sample(records, batch_size + 8)
    feats = featurize_dataset(picked)
    mols = [g.model_input() for g in feats.graphs][:batch_size]
    labels = torch.from_numpy(labels_matrix(picked, feats.kept)[:batch_size])
    torch.manual_seed(seed)
    block = weave_model(N_ATOM_FEATURES, N_PAIR_FEATURES, labels.shape[1])
    return (lambda s: fe.Compiler(block, scheduler=s), mols,
            lambda c, out: masked_bce_sum(out, labels)[0])
