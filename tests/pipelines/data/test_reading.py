"""pipelines.data.sources: files read and parsed in Ray Data tasks give exactly what the in-process
loaders give (records in file order, errors naming file:line, skip counts, vocabulary, target
statistics), whatever the block and byte-range sizes."""
from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from pipelines.data import sources as R
from pipelines.molecules import data as MD
from pipelines.molecules import reading as MR
from pipelines.molecules.featurize import SmilesError, parse_smiles
from pipelines.sst import data as SD
from pipelines.sst import reading as SR
from pipelines.sst.vocab import build_vocab

from ..helpers import parsed_records, sst_lines

pytestmark = [pytest.mark.integration]



@pytest.fixture(scope="module")
def mixed(data_dir):
    """Real SST trees (the train file's line with U+00A0 inside a token among them) mixed with
    malformed lines: a ternary node, an empty line, a bad label, an unbalanced parenthesis."""
    good = sst_lines(data_dir, 3)
    with open(f"{data_dir}/sst/train.txt", encoding="utf-8") as f:
        nbsp = next(line.rstrip("\n") for line in f if "\u00a0" in line)
    return [good[0], "(3 (2 a) (2 b) (2 c))", good[1], "", "(9 x)", good[0],
            good[2] + ")", nbsp]


@pytest.fixture(scope="module", autouse=True)
def _ray(ray_data_ordered):
    yield


@pytest.mark.parametrize("chunk", [1, 7, 40, 1 << 20])
def test_lines_cover_the_file_once_in_order(tmp_path, chunk, mixed):
    text = "\n".join(mixed) + "\n"
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    rows = R.read_lines(str(path), chunk_bytes=chunk, rows_per_block=3).take_all()
    assert [r["text"].decode() for r in rows] == [l + "\n" for l in mixed]
    assert [r["line"] for r in rows] == list(range(1, len(mixed) + 1))
    assert [r["idx"] for r in rows] == list(range(len(mixed)))
    # no final newline: the last line is still read once
    path.write_text(text[:-1], encoding="utf-8")
    rows = R.read_lines(str(path), chunk_bytes=chunk, rows_per_block=2).take_all()
    assert [r["text"].decode() for r in rows] == [l + "\n" for l in mixed[:-1]] + [mixed[-1]]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("chunk", [5, 64, 1 << 20])
def test_a_line_over_the_limit_is_a_row_error_read_past(tmp_path, chunk, gz, mixed):
    """A line longer than max_line_bytes is one row with empty text and an error giving its length;
    every other line keeps its text and line number, whatever the byte ranges."""
    long = "(2 " + "x" * 300 + ")"
    lines = [mixed[0], long, mixed[2], long + long, mixed[5]]
    text = ("\n".join(lines) + "\n").encode()
    path = tmp_path / ("long.txt.gz" if gz else "long.txt")
    path.write_bytes(gzip.compress(text) if gz else text)
    rows = R.read_lines(str(path), chunk_bytes=chunk, rows_per_block=2, max_line_bytes=200).take_all()
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["error"] is None for r in rows] == [True, False, True, False, True]
    assert [r["text"] for r in rows] == [(l + "\n").encode() if len(l) < 200 else b"" for l in lines]
    assert f"a line of {len(long) + 1} bytes, over the 200-byte line limit" in rows[1]["error"]
    assert f"a line of {2 * len(long) + 1} bytes" in rows[3]["error"]


def test_sst_reader_names_an_overlong_line(tmp_path, mixed):
    path = tmp_path / "long.txt"
    path.write_text(mixed[0] + "\n" + "(2 " + "y" * 5000 + ")\n" + mixed[2] + "\n", encoding="utf-8")
    data = SR.read_sst_file(str(path), skip_bad=True, chunk_bytes=1000, max_line_bytes=4096)
    assert (data.summary.n_ok, data.summary.n_bad) == (2, 1)
    assert data.summary.bad[0][0] == 2 and "bytes" in data.summary.bad[0][1]


def test_each_range_counts_only_its_own_bytes(tmp_path, monkeypatch):
    """Line numbers come from one newline count of the file (driver side), not from each range
    task counting from byte 0 (which made reading quadratic in the file's size): the bytes read
    by the counting pass equal the file's size, whatever the number of ranges."""
    path = tmp_path / "many.txt"
    path.write_bytes(b"".join(b"(2 w%d)\n" % i for i in range(3000)))
    size = path.stat().st_size
    read = []
    real = R.newline_counts

    def counting(p, ranges):
        read.append(sum(e - s for s, e in ranges))
        return real(p, ranges)
    monkeypatch.setattr(R, "newline_counts", counting)
    rows = R.read_lines(str(path), chunk_bytes=997, rows_per_block=100).take_all()
    assert [r["line"] for r in rows] == list(range(1, 3001))
    assert read and all(n == size for n in read), (read, size)   # each planning pass reads the file once


@pytest.mark.parametrize("gz", [False, True])
def test_sst_malformed_lines_reported_as_load_file(tmp_path, gz, mixed):
    text = "\n".join(mixed) + "\n"
    plain = tmp_path / "mixed.txt"
    plain.write_text(text, encoding="utf-8")
    path = plain
    if gz:
        path = tmp_path / "mixed.txt.gz"
        path.write_bytes(gzip.compress(text.encode()))
    trees, report = SD.load_file(plain, skip_bad=True)
    data = SR.read_sst_file(str(path), skip_bad=True, chunk_bytes=13, rows_per_block=2)
    assert parsed_records(data) == trees
    s = data.summary
    assert (s.n_rows, s.n_ok, s.n_bad) == (len(mixed), report.n_read, report.n_skipped)
    assert s.bad == report.skipped_lines  # every malformed line, up to the report's cap
    assert list(data.good_idx) == [0, 2, 5, 7]
    assert s.sha256 == report.sha256
    with pytest.raises(SD.SSTFormatError) as want:
        SD.load_file(plain)
    with pytest.raises(SD.SSTFormatError) as got:
        SR.read_sst_file(str(plain), chunk_bytes=13)
    assert str(got.value) == str(want.value)
    with pytest.raises(SD.SSTChecksumError):
        SR.read_sst_file(str(plain), expected_sha256="0" * 64)


def test_sst_files_and_streaming_vocabulary_equal_the_loaders(data_dir, cache_env):
    trees, counts = [], []
    for split in SD.SPLITS:
        want, _ = SD.load_split(split)
        data = SR.read_sst_file(str(data_dir / "sst" / f"{split}.txt"), expected_sha256=SD.SST_SHA256[split],
                               chunk_bytes=200_000, rows_per_block=500)
        assert data.summary.n_ok == len(want) and data.summary.n_bad == 0
        assert np.array_equal(data.good_idx, np.arange(len(want)))
        if split == "dev":
            assert parsed_records(data) == want
            assert parsed_records(data, [0, 5, 1100]) == [want[0], want[5], want[1100]]
        trees.append(want)
        counts.append(data.summary.word_counts)
    # the word counts made in the parse tasks give the loaders' vocabulary (read_splits uses them)
    vocab = build_vocab(*trees)
    from_counts = SR.vocab_from_counts(counts)
    assert from_counts == vocab and from_counts.counts == vocab.counts
    assert SR.vocab_from_counts(counts[:1]) == build_vocab(trees[0])


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "cache"))


def test_esol_rows_and_label_statistics(data_dir):
    path = str(data_dir / "molecules" / "esol.csv")
    want, report = MD.read_esol_csv(path)
    data = MR.read_molecule_csv_ds(path, id_column=MD.ESOL_ID_COLUMN, smiles_column=MD.ESOL_SMILES_COLUMN,
                                  label_columns=MD.ESOL_TASKS, parse_label=MD.parse_real_label, rows_per_block=100)
    got = parsed_records(data)
    assert len(got) == len(want) == 1128 and data.summary.n_bad == 0
    assert [(r.mol_id, r.smiles, r.line, r.source) for r in got] == \
        [(r.mol_id, r.smiles, r.line, r.source) for r in want]
    assert all(np.array_equal(a.labels, b.labels) for a, b in zip(got, want))
    assert data.summary.sha256 == MD.ESOL_SHA256
    n, mean, std = MR.label_stats(data.dataset, 1)
    y = np.array([r.labels[0] for r in want], np.float64)
    assert n[0] == 1128 and mean[0] == pytest.approx(y.mean(), abs=1e-9) and std[0] == pytest.approx(y.std(), abs=1e-9)


def test_tox21_gz_unparsable_smiles_counted_with_file_line(data_dir):
    path = str(data_dir / "molecules" / "tox21.csv.gz")
    want, _ = MD.read_tox21_csv(path)
    data = MR.read_molecule_csv_ds(path, id_column=MD.TOX21_ID_COLUMN, smiles_column=MD.TOX21_SMILES_COLUMN,
                                  label_columns=MD.TOX21_TASKS, parse_label=MD.parse_binary_label, rows_per_block=1000)
    bad = []
    for r in want:
        try:
            parse_smiles(r.smiles, mol_id=r.mol_id, where=r.where)
        except SmilesError as e:
            bad.append((r.line, "SMILES: " + str(e)))
    s = data.summary
    assert s.n_rows == 7831 and s.n_bad == len(bad) == 8 and s.n_ok == 7823
    assert s.bad == bad and "tox21.csv.gz:" in s.bad[0][1]
    assert s.sha256 == MD.TOX21_CSV_SHA256
    n, mean, _ = MR.label_stats(data.dataset, 12)
    assert n.sum() == 72_084 + 5_862 - sum(int(np.sum(~np.isnan(r.labels))) for r in want
                                           if any(line == r.line for line, _ in bad))


def test_csv_bad_rows_and_header(tmp_path):
    header = ",".join(MD.TOX21_TASKS) + ",mol_id,smiles"
    rows = [header, ",".join(["1"] * 12) + ",A,CCO", "", ",".join(["2"] + ["0"] * 11) + ",B,CCN",
            ",".join(["0"] * 12) + ",C,", "1,2,3", ",".join([""] * 12) + ",D,c1ccccc1"]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    want, report = MD.read_tox21_csv(path, on_bad_row="skip")
    data = MR.read_molecule_csv_ds(str(path), id_column="mol_id", smiles_column="smiles",
                                  label_columns=MD.TOX21_TASKS, parse_label=MD.parse_binary_label, rows_per_block=2)
    assert [r.mol_id for r in parsed_records(data)] == [r.mol_id for r in want] == ["A", "D"]
    assert data.summary.bad == [(x.line, x.reason) for x in report.skipped]
    assert data.summary.n_bad == len(report.skipped) == 4
    n, mean, std = MR.label_stats(data.dataset, 12)
    assert list(n) == [1] * 12 and math.isclose(std[0], 1.0)
    with pytest.raises(MD.DataFormatError, match="missing column"):
        MR.read_molecule_csv_ds(str(path), id_column=None, smiles_column="SMILES", label_columns=["x"],
                               parse_label=MD.parse_real_label)


def test_a_truncated_gz_is_named_with_its_path(tmp_path, mixed):
    """A .csv.gz cut short: a bad record at the line where it ends (named path:line, counted
    with the other bad rows: data.skip_bad decides); a .txt.gz cut short: an error naming it."""
    header = ",".join(MD.TOX21_TASKS) + ",mol_id,smiles"
    rows = [header] + [",".join(["1"] * 12) + f",M{i},CCO" for i in range(400)]
    blob = gzip.compress(("\n".join(rows) + "\n").encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(blob[: len(blob) // 2])
    data = MR.read_molecule_csv_ds(str(path), id_column="mol_id", smiles_column="smiles",
                                   label_columns=MD.TOX21_TASKS, parse_label=MD.parse_binary_label, rows_per_block=50)
    s = data.summary
    assert s.n_bad == 1 and 0 < s.n_ok < 400
    assert s.bad[0][0] == s.n_ok + 2  # the header is line 1
    assert s.error().startswith(f"{path}:{s.n_ok + 2}: truncated or corrupt compressed file (EOFError")
    text = ("\n".join(mixed * 200) + "\n").encode()
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(text)[: len(gzip.compress(text)) // 2])
    with pytest.raises(Exception, match=f"{cut}:[0-9]+: truncated or corrupt compressed file"):
        R.read_lines(str(cut)).take_all()


@pytest.mark.parametrize("gz", [False, True])
def test_csv_columns_rows_lines_and_bad_rows(tmp_path, gz):
    """The generic CSV reader: the named columns' fields per data row (quoted commas and newlines
    kept), ``line`` as ``csv.reader`` counts it (the header is line 1), a blank line as a row of
    no fields, a wrong field count as a bad row; a missing column or an empty file named."""
    text = ('id,tree,note\n1,"(2 (2 a) (2 ,))",x\n\n2,(3 b),"two\nlines"\n3,(2 c)\n'
            '4,"(1 (2 d)\n(1 e))",y\n')
    path = tmp_path / ("t.csv.gz" if gz else "t.csv")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    rows = R.read_csv_columns(str(path), ["tree", "id"], rows_per_block=2).take_all()
    assert [r["idx"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["line"] for r in rows] == [2, 3, 5, 6, 8]
    assert [r["fields"] for r in rows] == [["(2 (2 a) (2 ,))", "1"], [], ["(3 b)", "2"], None, ["(1 (2 d)\n(1 e))", "4"]]
    assert [r["error"] for r in rows] == [None, None, None, "2 fields, expected 3 (the header's)", None]
    with pytest.raises(ValueError, match=f"{path}: no column 'smiles'"):
        R.read_csv_columns(str(path), ["smiles"])
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=f"{empty}: file is empty"):
        R.csv_header(str(empty))


def test_a_truncated_csv_gz_ends_in_one_bad_row(tmp_path):
    rows = ["tree"] + [f"(2 w{i})" for i in range(400)]
    blob = gzip.compress(("\n".join(rows) + "\n").encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(blob[: len(blob) // 2])
    got = R.read_csv_columns(str(path), ["tree"], rows_per_block=50).take_all()
    good = [r for r in got if r["error"] is None]
    assert 0 < len(good) < 400 and len(got) == len(good) + 1
    assert got[-1]["line"] == len(good) + 2 and got[-1]["error"].startswith("truncated or corrupt compressed file")


# ----------------------------------------------------------------------------- streaming datasets
def _plan_bytes(batch) -> bytes:
    import pickle

    return pickle.dumps((batch.size, batch.consts, batch.calls, batch.step_bounds, batch.index_data,
                         batch.outputs, batch.metrics, batch.signature))


@pytest.mark.parametrize("block_bytes,head_rows,assembly,head_actors",
                         [(None, 13, "sort", 0), (8_000, 0, "sort", 0), (None, 13, "gather", 1), (8_000, 0, "auto", 0)])
def test_streaming_datasets_give_the_reference_steps_and_batches(data_dir, cache_env, block_bytes, head_rows,
                                                                    assembly, head_actors):
    """``pipelines.data.feed.declare_feed`` (records as Ray Data blocks, traced once,
    grouped per step) yields, for every (epoch, rank) and eval split, exactly the steps of the
    numpy reference (``step_reference``: which record lands in which step on which rank, from the
    seed) and the batches ``make_batch`` makes of those records with the step's seed.  With
    ``block_bytes``, Ray Data splits the sorted blocks so that steps span blocks (as Tox21's
    large traces do): ``assemble_steps`` (the trainer's side) joins and builds them.  With
    ``head_rows``, epoch 1's first step per rank comes from the head builders (gathered by
    position) and the rest from the epoch's dataset: together the same rows, also when one actor
    builds the head of both ranks (``head_actors``).  ``assembly``
    (``data.step_assembly``): the step sort, or each step gathering its records by position
    (``auto`` picks gather for a split this small); both give the same rows."""
    import os
    import ray

    from pipelines.data.assembly import assemble_steps
    from pipelines.data.step import Step

    from pipelines.config import load_config, merged_schema
    from pipelines.data.feed import eval_dataset_name, train_dataset_name
    from pipelines.data.positions import train_steps_per_epoch
    from pipelines.sst.experiment import SCHEMA, SSTExperiment
    from pipelines.data.feed import declare_feed
    from pipelines.data.splits import StreamSplits, with_positions

    from ..helpers import REPO as repo
    cfg = load_config(os.path.join(repo, "conf", "sst_tai2015.yaml"),
                      ["epochs=2", "batch_size=25", "eval_batch_size=20", "sst.state_size=8", "seed=3",
                       "sst.train_file=" + str(data_dir / "sst" / "dev.txt"), "sst.limit_train=113",
                       "sst.limit_dev=47", "sst.test_file=",
                       f"data.head_rows={head_rows}", f"data.step_assembly={assembly}",
                       f"data.head_actors={head_actors}"], merged_schema(SCHEMA))
    from .. import step_reference as ref
    from ..reference_splits import sst_splits

    exp = SSTExperiment()
    legacy = sst_splits(cfg)
    world = 2
    seed, bs, ebs = int(cfg["seed"]), cfg["batch_size"], cfg["eval_batch_size"]
    sample_seed = int(cfg["data"]["sample_seed"])   # the limits' sample: not the model seed's
    n_train, n_dev = len(legacy.records["train"]), len(legacy.records["dev"])
    steps = train_steps_per_epoch(n_train, bs, world, cfg["max_steps_per_epoch"])
    expected = {}   # dataset name -> (epoch, records, [(step, positions, denom)])
    for epoch in range(1, cfg["epochs"] + 1):
        for r in range(world):
            expected[train_dataset_name(epoch, r)] = (epoch, legacy.records["train"],
                                                  ref.train_rows(seed, epoch, r, world, bs, n_train, steps))
    for r in range(world):
        rows = ref.eval_rows(r, world, ebs, n_dev)
        if rows:
            expected[eval_dataset_name("dev", r)] = (0, legacy.records["dev"], rows)
    ctx = ray.data.DataContext.get_current()
    saved = ctx.target_max_block_size
    if block_bytes:
        ctx.target_max_block_size = block_bytes
    try:
        sources = {"train": with_positions(SR.read_sst_file(str(data_dir / "sst" / "dev.txt"), chunk_bytes=30_000,
                                                           rows_per_block=40), 113, sample_seed, "train"),
                   "dev": with_positions(SR.read_sst_file(str(data_dir / "sst" / "dev.txt"), chunk_bytes=50_000,
                                                         rows_per_block=30), 47, sample_seed, "dev")}
        new = declare_feed(exp, cfg, StreamSplits(sources, {}, legacy.context), world)
        plan = new.feed.plan
        parts = {name: [Step.from_row(row) for row in new.datasets[name].take_all()] for name in plan.datasets}
    finally:
        ctx.target_max_block_size = saved
    assert plan.datasets == tuple(sorted(expected)) and plan.steps == steps == 5
    assert plan.eval_splits == ("dev",) and plan.world == world and plan.n_train == n_train == 113
    used = "gather" if assembly == "auto" else assembly
    assert new.params["data/step_assembly"] == used
    from pipelines.data.background import EpochHead, read_head
    heads = [b for b in new.background if isinstance(b, EpochHead)]
    assert len(heads) == (1 if head_rows else 0)
    for h in heads:
        assert h.epoch == 1 and h.steps == 1 < plan.steps and new.feed.heads == {1: h.refs}
        assert len(h.workers) == (head_actors or min(world, len(os.sched_getaffinity(0))))
        for r in range(world):
            name = f"train_e1_r{r}"
            assert parts[name] and all(step.index >= h.steps for step in parts[name])
            parts[name] = list(read_head(h.refs[r])) + parts[name]
    # epoch 2 read the background pass's traces: one traced block per source block, every
    # record traced once; the eval batches came from background builders; all of them made by
    # low-priority processes
    from pipelines.data.background import BACKGROUND_NICENESS, CachedEval, TracedBlocks
    traced = [b for b in new.background if isinstance(b, TracedBlocks)]
    cached = [b for b in new.background if isinstance(b, CachedEval)]
    assert len(traced) == 1 and len(cached) == len(plan.eval_splits) == 1
    tables = ray.get(traced[0].refs)
    assert sum(t.num_rows for t in tables) == 113
    assert all(b is not None for t in tables for b in t.column("trace").to_pylist())
    # (Ray starts its workers at niceness 15; the head builders stay there: the trainer waits for them)
    plain = ray.get(ray.remote(lambda: os.nice(0)).remote())
    for b in new.background:
        for worker in getattr(b, "workers", None) or (b.worker,):
            want = plain if isinstance(b, EpochHead) else BACKGROUND_NICENESS
            assert ray.get(worker.__ray_call__.remote(lambda self: os.nice(0))) == want
    # what the trainer reads (read_cached_eval, no Ray Data execution) is the eval dataset's rows
    from pipelines.data.background import read_cached_eval
    assert cached[0].split == "dev" and new.feed.eval_blocks == {"dev": cached[0].blocks}
    for r in range(world):
        direct = list(read_cached_eval(cached[0].blocks, r))
        assert direct == parts[f"dev_r{r}"] and direct, r
    n_parts = 0
    builder = ref.builder(exp, cfg, legacy.context)
    assembled = {}
    for name in plan.datasets:
        epoch_w, records, a = expected[name]
        n_parts += sum(bool(step.part) for step in parts[name])
        is_train = name.startswith("train_e")
        epoch = int(name.split("_e")[1].split("_")[0]) if is_train else 0
        rank = int(name.rsplit("_r", 1)[1])
        b = list(assemble_steps(iter(parts[name]), exp, cfg, legacy.context, epoch, rank, is_train))
        assert epoch == epoch_w
        assert [(i, len(idx), d) for i, idx, d in a] == [(step.index, step.n, step.denom) for step in b], name
        assert all(not step.part for step in b), name
        for (i, idx, _), y in zip(a, b):
            x = ref.batch(exp, builder, records, idx, seed, epoch, i, rank)
            assert _plan_bytes(x) == _plan_bytes(y.batch()), (name, i)
        assembled[name] = b
    # the feed (what the worker iterates) yields exactly these steps: rank 0 through both
    # epochs (epoch 1: head, then its dataset; epoch 2 read ahead from half way through epoch 1),
    # and its eval steps from the cache
    def same(steps):
        return [(step.index, step.n, step.denom, _plan_bytes(step.batch())) for step in steps]

    datasets = dict(new.datasets)
    assert same(new.feed.train(1, 0, datasets)) == same(assembled["train_e1_r0"])
    assert 2 in new.feed.prefetched
    assert same(new.feed.train(2, 0, datasets)) == same(assembled["train_e2_r0"])
    assert same(new.feed.eval("dev", 0, datasets)) == same(assembled["dev_r0"])
    # sorted blocks split by size leave steps in parts; a gathered step is always whole
    assert (n_parts > 0) == (bool(block_bytes) and used == "sort")
