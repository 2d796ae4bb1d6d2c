"""SST fine-grained / binary sentiment with the Tree-LSTM, as a
:class:`pipelines.experiment.Experiment` for :func:`pipelines.training.run.run` (paper Table 2).

* Driver (:meth:`SSTExperiment.read_splits`): the splits (canonical SST or ``sst.<split>_file``)
  read in Ray Data tasks and kept as blocks, the vocabulary (``sst.vocab_splits``) counted there,
  the pretrained matrix (GloVe 6B 50d or ``sst.embeddings``) put in the object store.  Context: an
  :class:`SSTContext`.  Ray Data tasks (``batch_builder`` / ``make_batch``): trees -> ``Batch``.
* Ray Train workers (``build_model``, ``loss``): loss = cross-entropy summed over every node.
* Metrics (``summarize``): ``fine`` / ``binary`` root accuracy (binary on non-neutral roots),
  ``all_fine`` / ``all_binary`` over every node, ``root_loss``, ``node_loss``, ``loss`` (per tree),
  baselines ``majority_fine`` / ``majority_binary``.  Model selection: dev ``fine``.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipelines.config import Field
from pipelines.experiment import Experiment, FinishedRun, TableLayout
from pipelines.plots import Baseline, Panel, Series, epoch_figure
from schedulers import SCHEDULERS

from pipelines.sst.model import SentimentModules, build_compiler, count_stats, node_outputs, summarize_counts

if TYPE_CHECKING:
    from pipelines.sst.embeddings import EmbeddingStats
    from pipelines.sst.vocab import Vocab

log = logging.getLogger("pipelines.sst")

#: Looks et al. (ICLR 2017) Table 2, SST test accuracy (fine-grained, binary), in percent.
PAPER_TABLE2 = [
    # what tells the rows apart comes first: viewers cut long cells at the end
    ("paper, single model: TF Fold Tree-LSTM (Looks et al. 2017)", 52.3, 89.4),
    ("paper, ensemble: TF Fold Tree-LSTM (Looks et al. 2017)", 53.6, 90.2),
    ("anchor: Constituency Tree-LSTM (Tai et al. 2015)", 51.0, 88.0),
]

SCHEMA: dict[str, Field] = {
    "scheduler": Field(str, "depth", choices=tuple(sorted(SCHEDULERS)),
                       doc="foldengine scheduler (schedulers.SCHEDULERS: depth, agenda, coalesce)"),
    "sst.data_dir": Field(str, None, nullable=True, doc="default: $FOLD_DATA_DIR / cache"),
    "sst.train_file": Field(str, None, nullable=True,
                            doc="your own training trees: a PTB-format file, one tree per line, a label "
                                "0..4 on every node; null = the canonical SST train split"),
    "sst.dev_file": Field(str, None, nullable=True,
                          doc="your own dev trees (model selection); null = SST dev; '' = no dev split"),
    "sst.test_file": Field(str, None, nullable=True,
                           doc="your own test trees; null = SST test; '' = no test split"),
    "sst.vocab_splits": Field(list, ["train", "dev", "test"], doc="splits whose words form the vocabulary"),
    "sst.embeddings": Field(str, None, nullable=True,
                            doc="GloVe text file (e.g. glove.840B.300d.txt); null = GloVe 6B 50d package; 'random' = "
                                "random vectors with GloVe 6B 50d's per-dimension mean and sd (an ablation)"),
    "sst.oov_scale": Field(float, 0.05, min=0.0, doc="OOV rows ~ U(-s, s)"),
    "sst.frontend": Field(str, "blocks", choices=("blocks", "per_example"),
                          doc="how the model is written: TF Fold blocks (pipelines.sst.model) or one tree in plain "
                              "PyTorch batched by foldengine.batched (pipelines.sst.per_example); the same "
                              "parameters, plan and results"),
    "sst.state_size": Field(int, 300, min=1),
    "sst.input_dropout": Field(float, 0.0, min=0.0, max=0.99, doc="drop prob on word embeddings"),
    "sst.output_dropout": Field(float, 0.0, min=0.0, max=0.99, doc="drop prob on h before the classifier"),
    "sst.recurrent_dropout": Field(float, 0.0, min=0.0, max=0.99, doc="drop prob on the cell update u"),
    "sst.embedding_lr_scale": Field(float, 1.0, min=0.0, doc="embedding LR = optimizer.lr * this (0 freezes)"),
    "sst.embedding_grad_scale": Field(float, 1.0, min=0.0,
                                      doc="embedding gradients x this (TF Fold's EMBEDDING_LEARNING_RATE_FACTOR "
                                          "scales the gradient; under Adagrad that is not an LR scale)"),
    "sst.forget_bias": Field(float, 0.0, doc="added to the forget gates (TF Fold's cell: 1.0)"),
    "sst.sparse_embedding": Field(bool, False,
                                  doc="sparse embedding gradients (only the rows a batch used; Adagrad / SGD "
                                      "update only those rows: the same result, less work per step); needs an "
                                      "optimizer taking sparse gradients and grad_clip 0"),
    "sst.init": Field(str, "torch", choices=("torch", "glorot"),
                      doc="cell and classifier init: nn.Linear default or Glorot uniform, zero bias (TF)"),
    "sst.max_nodes": Field(int, 1023, min=1, doc="prediction refuses a tree of more nodes (a row error; the largest "
                                                 "SST tree has 111)"),
    "sst.limit_train": Field(int, None, min=1, nullable=True,
                             doc="a seeded random sample of N trees, not the file's head (data.sample_seed picks "
                                 "them; tests, smoke runs)"),
    "sst.limit_dev": Field(int, None, min=1, nullable=True,
                           doc="a seeded random sample of N dev trees, not the file's head (data.sample_seed)"),
    "sst.limit_test": Field(int, None, min=1, nullable=True,
                            doc="a seeded random sample of N test trees, not the file's head (data.sample_seed)"),
}


@dataclasses.dataclass(frozen=True)
class SSTContext:
    """What :meth:`SSTExperiment.read_splits` loads besides the trees (``StreamSplits.context``)."""

    vocab: Vocab                #: words of ``sst.vocab_splits`` (word -> row of the matrix)
    emb_dim: int                #: embedding size (the matrix's columns)
    #: the pretrained embedding matrix ``[len(vocab), emb_dim]``, or its ``ray.ObjectRef`` when
    #: Ray was up while loading (shipped once to the train workers; Ray Data tasks never fetch it)
    embeddings: Any
    #: coverage of the vocabulary by the pretrained vectors (logged by ``pipelines.sst.train``)
    embedding_stats: Optional[EmbeddingStats] = None

    def matrix(self) -> np.ndarray:
        """The embedding matrix (fetched from the object store if it is there)."""
        emb = self.embeddings
        if not isinstance(emb, np.ndarray):
            import ray

            emb = ray.get(emb)
        return emb


class SSTExperiment(Experiment):
    """Tree-LSTM sentiment on the Stanford Sentiment Treebank (5 classes, per-node labels)."""

    name = "sst-treelstm"
    selection_metric = "fine"
    key_metrics = ("fine", "binary")
    selection_mode = "max"
    config_schema = SCHEMA

    # ------------------------------------------------------------------ driver
    def data_files(self, config: dict) -> list:
        """The files ``read_splits(config)`` reads: :func:`pipelines.sst.data.data_files`."""
        from pipelines.sst.data import data_files

        return data_files(config["sst"])

    def read_splits(self, config: dict):
        """The SST splits (``sst.<split>_file``; null: the canonical release, "": none) read and
        parsed in Ray Data tasks (:func:`pipelines.sst.reading.read_sst_file`; trees as Ray Data
        blocks, never on the driver); with ``sst.limit_<split>`` a seeded random sample of that many
        of the split's good trees (:func:`pipelines.data.splits.sample_positions` ``(n, limit,
        seed, split)``, ``seed`` the config's ``data.sample_seed``), kept in file order; the vocabulary
        (``sst.vocab_splits``, of the whole files) counted in the parse tasks
        (:func:`pipelines.sst.reading.vocab_from_counts`), the embeddings, the skip report
        (``<split>/malformed``, each line named ``file:line`` with its reason) and params
        (``data.<split>.file`` / ``.sha256`` / ``.canonical``).
        The same trees, in file order, as :func:`pipelines.sst.data.load_split_source` (sampled the
        same way when limited); the malformed lines are counted over the whole file."""
        import os

        import ray

        from pipelines.sst.reading import read_sst_file, vocab_from_counts
        from pipelines.data.skips import DEFAULT_MAX_NAMED, SkipReport
        from pipelines.data.splits import StreamSplits, with_positions

        from pipelines.sst.data import SPLITS, SST_SHA256, resolve_split_path

        sc = config["sst"]
        skip_bad = bool(config["data"]["skip_bad"])
        for split in sc["vocab_splits"]:
            if split not in SPLITS:
                raise ValueError(f"sst.vocab_splits: unknown split {split!r}")
        parsed, params = {}, {}
        skipped = SkipReport(config["data"].get("skip_report_max", DEFAULT_MAX_NAMED))
        for split in SPLITS:
            path = sc[f"{split}_file"]
            if path == "":
                if split == "train":
                    raise ValueError("sst.train_file: empty path (null = the canonical SST train split)")
                params[f"data.{split}.file"] = "none"
                continue
            if path is None:
                path, expected = str(resolve_split_path(split, sc["data_dir"])), SST_SHA256[split]
            else:
                path, expected = os.path.abspath(os.path.expanduser(str(path))), None
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"sst.{split}_file: no such file {path}")
            data = read_sst_file(path, skip_bad=skip_bad, expected_sha256=expected,
                                 max_named=skipped.max_named)
            s = data.summary
            canonical = s.sha256 == SST_SHA256[split]
            key = f"{split}/malformed"
            skipped.count(key, int(s.n_bad), s.skipped(key))
            if s.n_bad:
                log.warning("%s: skipped %s", path, skipped.summary(key))
            if not canonical:
                log.info("%s: %s split from a non-canonical file (%d trees, sha256 %s)", path, split, s.n_ok, s.sha256)
            params.update({f"data.{split}.file": path, f"data.{split}.sha256": s.sha256,
                           f"data.{split}.canonical": "true" if canonical else "false"})
            parsed[split] = data
        vocab = vocab_from_counts([parsed[s].summary.word_counts for s in sc["vocab_splits"] if s in parsed])
        matrix, stats = _load_embeddings(config, vocab)
        context = SSTContext(vocab=vocab, emb_dim=int(matrix.shape[1]), embeddings=ray.put(matrix),
                             embedding_stats=stats)
        # the same records for every model seed (configs of runs before data.sample_seed sampled by seed)
        seed = int(config["data"].get("sample_seed", config["seed"]))
        sources = {split: with_positions(data, sc[f"limit_{split}"], seed=seed, stream=split)
                   for split, data in parsed.items()}
        return StreamSplits(sources, skipped, context, params)

    # ------------------------------------------------------------------ model / batches
    def _modules(self, config: dict, context: SSTContext, embeddings: Optional[np.ndarray]) -> SentimentModules:
        sc = config["sst"]
        return SentimentModules(
            len(context.vocab), context.emb_dim, sc["state_size"], input_dropout=sc["input_dropout"],
            output_dropout=sc["output_dropout"], recurrent_dropout=sc["recurrent_dropout"],
            embeddings=embeddings, embedding_grad_scale=sc["embedding_grad_scale"],
            forget_bias=sc["forget_bias"], init=sc["init"], sparse_embedding=sc.get("sparse_embedding", False))

    def _compiler(self, config: dict, context: SSTContext, embeddings: Optional[np.ndarray],
                  modules: Optional[SentimentModules] = None):
        """The batched model of ``sst.frontend``: a ``foldengine.Compiler`` of the blocks or a
        ``foldengine.BatchedModule`` of the per-example model (the same ``run(batch)`` contract)."""
        modules = modules if modules is not None else self._modules(config, context, embeddings)
        build = _builder(config)
        compiler = build(modules, context.vocab.stoi, scheduler=config["scheduler"])
        compiler.executor = config.get("executor", "auto")
        return compiler

    def build_model(self, config: dict, context: SSTContext) -> torch.nn.Module:
        return self._compiler(config, context, context.matrix())

    def batch_builder(self, config: dict, context: SSTContext):
        # Only the plan matters in Ray Data tasks: no need to fetch the embedding matrix.
        return self._compiler(config, context, None)

    def make_batch(self, builder, records: Sequence, traces: Optional[Sequence] = None) -> Any:
        if traces is not None:
            return builder.build_batch_from_traces(traces)
        return builder.build_batch(records)

    def trace_records(self, builder, records: Sequence) -> Optional[list]:
        return None if builder.random_blocks else builder.trace(records)

    # ------------------------------------------------------------------ trained models
    inference_requirements = ("nltk",)

    def after_run(self, run: FinishedRun, tracker) -> dict[str, float]:
        """The embedding coverage of the run's vocabulary (``embeddings/*``, and the param
        ``sst.embedding_source``) and the training throughput in trees per second
        (``time/trees_per_s``, the glue's records per second)."""
        extra: dict[str, float] = {}
        st = run.context.embedding_stats if run.context is not None else None
        if st is not None:
            extra.update({"embeddings/dim": float(st.dim), "embeddings/n_words": float(st.n_words),
                          "embeddings/n_found": float(st.n_found), "embeddings/n_oov": float(st.n_oov),
                          "embeddings/coverage": float(st.coverage)})
            if st.token_coverage is not None:
                extra["embeddings/token_coverage"] = float(st.token_coverage)
            tracker.params({"sst.embedding_source": st.source})
        extra.update(_trees_per_s(run.history))
        return extra

    def model_context(self, config: dict, context: SSTContext) -> dict:
        """The vocabulary (``words``: ids 1.. in order; id 0 is the unknown word) and ``emb_dim``;
        the embedding rows are the model's own weights."""
        return {"words": list(context.vocab.itos[1:]), "emb_dim": int(context.emb_dim)}

    def predictor(self, config: dict, model_context: Mapping[str, Any], state_dict):
        """A :class:`pipelines.sst.inference.TreePredictor` (input column ``tree``)."""
        from pipelines.sst.inference import TreePredictor
        from pipelines.sst.vocab import Vocab

        ctx = SSTContext(vocab=Vocab(model_context["words"]), emb_dim=int(model_context["emb_dim"]), embeddings=None)
        modules = self._modules(config, ctx, None)
        self._compiler(config, ctx, None, modules).load_state_dict(state_dict)   # the parameters' names
        return TreePredictor(modules, ctx.vocab.stoi, scheduler=config["scheduler"], build=_builder(config),
                             executor=config.get("executor", "auto"),
                             max_nodes=config["sst"].get("max_nodes", SCHEMA["sst.max_nodes"].default))

    def example_inputs(self) -> Sequence[str]:
        return ["(4 (2 a) (4 (4 wonderful) (2 film)))", "(1 (2 (2 not) (3 good)) (2 .))"]

    # ------------------------------------------------------------------ loss / metrics
    def loss(self, model, batch):
        logits, labels, is_root = node_outputs(model.run(batch))
        node_loss = F.cross_entropy(logits, labels, reduction="none")
        return node_loss.sum(), count_stats(logits, labels, is_root, node_loss)

    def eval_stats(self, model, batch) -> dict[str, float]:
        return self.loss(model, batch)[1]

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        return summarize_counts(sums)

    def param_groups(self, model: nn.Module, config: dict):
        """Embeddings: LR x ``sst.embedding_lr_scale``, no weight decay; the rest: the
        optimizer's LR and weight decay."""
        o = config["optimizer"]
        emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        seen, emb_params, rest = set(), [], []
        for p in model.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            (emb_params if id(p) in emb else rest).append(p)
        scale = config["sst"]["embedding_lr_scale"]
        groups = [{"params": rest, "lr": o["lr"], "weight_decay": o["weight_decay"]}]
        if scale > 0:
            groups.append({"params": emb_params, "lr": o["lr"] * scale, "weight_decay": 0.0})
        else:
            for p in emb_params:
                p.requires_grad_(False)
        return groups

    # ------------------------------------------------------------------ reporting
    def results_table(self, best: Mapping[str, float]):
        import pandas as pd

        def pct(k):
            v = best.get(k)
            return None if v is None else round(100.0 * v, 2)

        ours = {"model": "ours: Tree-LSTM, foldengine", "test fine-grained": pct("test/fine"),
                "test binary": pct("test/binary"), "dev fine-grained": pct("dev/fine"),
                "dev binary": pct("dev/binary"), "best epoch": best.get("epoch")}
        rows = [{"model": m, "test fine-grained": f, "test binary": b, "dev fine-grained": None,
                 "dev binary": None, "best epoch": None} for m, f, b in PAPER_TABLE2]
        # the trivial baseline of the evaluated trees: always the most frequent root label
        base = {"model": "trivial baseline: the majority class of the evaluated trees",
                "test fine-grained": pct("test/majority_fine"), "test binary": pct("test/majority_binary"),
                "dev fine-grained": pct("dev/majority_fine"), "dev binary": pct("dev/majority_binary"),
                "best epoch": None}
        if any(ours[k] is not None and base[k] is not None and ours[k] <= base[k]
               for k in ("test fine-grained", "test binary")):
            ours["model"] += " (NOT ABOVE the trivial baseline)"
        return pd.DataFrame([ours] + rows + ([base] if base["test fine-grained"] is not None else []))

    def sweep_layout(self) -> TableLayout:
        """Paper Table 2: test fine-grained and binary accuracy in percent, beside the paper's single
        model (mean (sd) over 30 runs), its ensemble of 30 and the Tai et al. anchor."""
        (fold, _, _), (ens, ef, eb), (tai, tf, tb) = PAPER_TABLE2   # single model, ensemble, anchor
        return TableLayout({"best/test/fine": "test fine", "best/test/binary": "test binary"}, scale=100.0,
                           reference=((fold + ", mean (sd) over 30 runs", "52.3 (0.7)", "89.4 (0.4)"),
                                      (ens + " of 30", ef, eb), (tai, tf, tb)),
                           baselines={"best/test/fine": "best/test/majority_fine",
                                      "best/test/binary": "best/test/majority_binary"},
                           baseline_name="majority class of the evaluated test trees")

    supports_ensemble = True

    def ensemble(self, configs, states, split, batch_size):
        """The members' averaged class probabilities per node (paper Table 2's ensemble), on Ray
        Data: :func:`pipelines.sst.ensemble_eval.evaluate_ensemble_streaming`."""
        from pipelines.sst.ensemble_eval import evaluate_ensemble_streaming

        metrics, _ = evaluate_ensemble_streaming(self, configs, states, split, batch_size)
        return dict(metrics)

    def baselines(self, history, split="test"):
        """The majority class of ``split``'s evaluated trees for ``fine`` and ``binary`` (the
        last epoch's ``<split>/majority_*``; the other split's where ``split`` has none)."""
        out = {}
        last = history[-1] if history else {}
        for m in ("fine", "binary"):
            for s in (split, "dev" if split == "test" else "test"):
                v = last.get(f"{s}/majority_{m}")
                if v is not None:
                    out[m] = Baseline(float(v), f"majority class, {s}")
                    break
        return out

    def plots(self, history):
        """The loss curves (:meth:`Experiment.plots`) and the root accuracy per epoch: one panel
        for fine-grained, one for binary, dev and test in each, the majority class dashed."""
        figs = [f for f in super().plots(history) if f[0] == "loss"]
        base = self.baselines(history)
        panels = [Panel(f"{m} root accuracy", "accuracy",
                        [Series(f"dev/{m}", "dev", "-"), Series(f"test/{m}", "test", "--")],
                        [base[m]] if m in base else ()) for m in ("fine", "binary")]
        fig = epoch_figure(history, panels, title="SST Tree-LSTM: root accuracy per epoch")
        if fig is not None:
            figs.append(("root_accuracy", fig))
        return figs


def _trees_per_s(history) -> dict:
    rates = [h["time/records_per_s"] for h in history if "time/records_per_s" in h]
    return {"time/trees_per_s": float(sum(rates) / len(rates))} if rates else {}


def _builder(config: dict):
    """``build_compiler`` (:mod:`pipelines.sst.model`) or ``build_batched``
    (:mod:`pipelines.sst.per_example`), as ``sst.frontend`` says."""
    if config["sst"].get("frontend", "blocks") == "per_example":
        from pipelines.sst.per_example import build_batched

        return build_batched
    return build_compiler


def _load_embeddings(config: dict, vocab: Vocab):
    """``(matrix, EmbeddingStats)`` for ``vocab``: ``sst.embeddings`` or GloVe 6B 50d."""
    from pipelines.sst.embeddings import RANDOM_EMBEDDINGS, load_glove_6b_50d, load_glove_text, random_like

    sc = config["sst"]
    seed = int(config["seed"])
    if sc["embeddings"] == RANDOM_EMBEDDINGS:
        return random_like(load_glove_6b_50d(vocab, seed=seed, oov_scale=sc["oov_scale"]), seed)
    if sc["embeddings"]:
        return load_glove_text(sc["embeddings"], vocab, seed=seed, oov_scale=sc["oov_scale"])
    return load_glove_6b_50d(vocab, seed=seed, oov_scale=sc["oov_scale"])
