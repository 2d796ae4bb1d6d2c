"""SST parsing/loading and vocabulary, on the real files in $FOLD_DATA_DIR (no mocks)."""
import pickle
import re

import pytest

from pipelines.datadir import DataNotFoundError
from pipelines.sst import data as D
import tests.pipelines.sst.trees as T
from pipelines.sst.vocab import UNK, UNK_INDEX, Vocab, build_vocab

# data/README.md section 1
EXPECTED = {
    "train": dict(n=8544, tokens=163_563, nodes=318_582, max_len=52, depth=30,
                  roots=(1092, 2218, 1624, 2322, 1288), binary=6920),
    "dev": dict(n=1101, tokens=21_274, nodes=41_447, max_len=49, depth=28,
                roots=(139, 289, 229, 279, 165), binary=872),
    "test": dict(n=2210, tokens=42_405, nodes=82_600, max_len=56, depth=29,
                 roots=(279, 633, 389, 510, 399), binary=1821),
}


@pytest.fixture(scope="module")
def splits(cache_env):
    return {s: D.load_split(s) for s in D.SPLITS}


@pytest.mark.parametrize("split", D.SPLITS)
def test_split_counts_match_readme(splits, split):
    trees, report = splits[split]
    exp = EXPECTED[split]
    assert report.n_read == len(trees) == exp["n"]
    assert report.n_skipped == 0 and report.skipped_lines == []
    assert report.sha256 == D.SST_SHA256[split]
    st = T.tree_stats(trees)
    assert (st.n_sentences, st.n_tokens, st.n_nodes) == (exp["n"], exp["tokens"], exp["nodes"])
    assert (st.max_length, st.max_depth) == (exp["max_len"], exp["depth"])
    assert st.root_label_counts == exp["roots"]
    assert len(T.binary_trees(trees)) == exp["binary"]


def test_tuple_encoding_and_roundtrip(splits):
    trees, report = splits["train"]
    with open(report.path, encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]
    assert [T.to_string(t) for t in trees] == lines  # nothing lost or altered
    for node in T.iter_nodes(trees[0]):
        assert type(node[0]) is int and 0 <= node[0] <= 4
        if T.is_leaf(node):
            assert len(node) == 2 and isinstance(node[1], str)
        else:
            assert len(node) == 3
    assert D.leaves(trees[0])[:3] == ["The", "Rock", "is"]
    assert pickle.loads(pickle.dumps(trees)) == trees


def test_nbsp_tokens_are_single_tokens(splits):
    trees, report = splits["train"]
    with open(report.path, encoding="utf-8") as f:
        line = f.read().split("\n")[4341]  # line 4342: "... Contempt and 8\u00a01\/2 ..."
    assert "8\u00a01\\/2" in line
    tree = D.parse_line(line)
    assert "8\u00a01\\/2" in D.leaves(tree) and "8" not in D.leaves(tree)
    assert tree == trees[4341]
    nbsp = sorted({w for t in trees for w in D.leaves(t) if "\u00a0" in w})
    assert nbsp == ["2\u00a01\\/2", "8\u00a01\\/2"]
    assert not any(" " in w for t in trees for w in D.leaves(t))


def test_escapes_kept_and_normalized(splits):
    words = {w for t in splits["train"][0] for w in D.leaves(t)}
    assert {"-LRB-", "-RRB-", "co-writer\\/director"} <= words
    assert D.normalize_token("-LRB-") == "(" and D.normalize_token("-RRB-") == ")"
    assert D.normalize_token("co-writer\\/director") == "co-writer/director"
    assert D.normalize_token("\\*") == "*"
    assert D.normalize_token("8\u00a01\\/2") == "8 1/2"
    assert D.normalize_token("film") == "film"


def test_second_load_uses_cache(splits):
    trees, report = D.load_split("dev")
    assert report.from_cache and trees == splits["dev"][0]


class _RunsCommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        import os
        return (os.system, (self.command,))


def test_crafted_parse_cache_runs_nothing_and_is_reparsed(splits, tmp_path):
    """The parse cache has a predictable name (the file's SHA-256) in a cache dir that may be
    shared: a planted pickle whose unpickling runs a command is refused, the file re-parsed."""
    from pipelines.datadir import cache_dir

    sha = splits["dev"][1].sha256
    (cached,) = (cache_dir() / "sst" / "parsed").glob(f"{sha}.v*.pkl")
    assert cached.stat().st_mode & 0o077 == 0  # written private to the user
    good = cached.read_bytes()
    marker = tmp_path / "ran"
    try:
        cached.write_bytes(pickle.dumps([_RunsCommand(f"touch {marker}")]))
        trees, report = D.load_split("dev")
        assert not marker.exists()
        assert not report.from_cache and trees == splits["dev"][0]
        # a cache file others can write is not trusted either, whatever it holds
        cached.write_bytes(good)
        cached.chmod(0o666)
        assert not D.load_split("dev")[1].from_cache
    finally:
        cached.write_bytes(good)
        cached.chmod(0o600)
    assert D.load_split("dev")[1].from_cache


GOOD = "(3 (2 It) (4 (2 is) (4 great)))"
BAD_LINES = {
    "(3 (2 It) (4 (2 is) (4 great))": "unbalanced",
    "(3 (2 It) (4 great)))": "unbalanced",
    "(5 (2 It) (4 great))": "label '5'",
    "(3 (2 It) (2 is) (4 great))": "3 children",
    "(3 (2 It is) (4 great))": "2 words",
    "(3 (2 (2 It)) (4 great))": "unary",
    "": "empty line",
    "   ": "empty line",
}


@pytest.mark.parametrize("bad,why", list(BAD_LINES.items()))
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    path = tmp_path / "bad.txt"
    path.write_text(f"{GOOD}\n{bad}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(D.SSTFormatError) as err:
        D.load_file(path)
    assert f"{path}:2:" in str(err.value) and why in str(err.value)


@pytest.mark.parametrize("split", D.SPLITS)
def test_strict_parser_gives_nltk_trees_on_every_line(cache_env, split):
    """The fast strict parser takes every SST line and gives exactly the nltk path's tuples
    (interned words included)."""
    path = D.resolve_split_path(split)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    lines = [ln for ln in lines if ln]
    for no, line in enumerate(lines, 1):
        fast = D._parse_strict(line)
        assert fast is not None, f"{split}:{no}"
        assert fast == D._parse_nltk(line), f"{split}:{no}"
    assert D.parse_line(lines[0]) == D._parse_nltk(lines[0])


@pytest.mark.parametrize("line", list(BAD_LINES) + [
    "(3 (2 It) (4 great)) (2 more)", "(3 (2 It) (4 great)) x", "x (3 (2 It) (4 great))", "(2 a))",
    "((2 a) (2 b))", "(3)", "(3 (2 a) (2 b) )x", "(\u00a03 (2 a) (2 b))", "(3 (2 a)\u00a0(2 b))"])
def test_strict_parser_leaves_anything_else_to_nltk(line):
    """Malformed or unusual lines: the strict parser declines (None) and parse_line gives the
    nltk path's result or error."""
    assert D._parse_strict(line) is None or D._parse_strict(line) == D._parse_nltk(line)
    if line.strip(" \t\r\f\v") and D._parse_strict(line) is None:
        try:
            expected = D._parse_nltk(line)
        except ValueError as err:
            with pytest.raises(ValueError, match=re.escape(str(err))):
                D.parse_line(line)
        else:
            assert D.parse_line(line) == expected


def test_deep_trees_go_through_nltk():
    line = "(2 a)"
    for _ in range(D._STRICT_MAX_DEPTH + 5):
        line = f"(2 {line} (2 b))"
    assert D._parse_strict(line) is None


def test_skip_bad_counts(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join([GOOD, "(3 (2 a) (2 b) (2 c))", GOOD, "", "(9 x)", GOOD]) + "\n",
                    encoding="utf-8")
    trees, report = D.load_file(path, skip_bad=True)
    assert len(trees) == report.n_read == 3
    assert report.n_skipped == 3 and report.path == str(path)
    assert [no for no, _ in report.skipped_lines] == [2, 4, 5]
    assert "3 children" in report.skipped_lines[0][1]


def test_empty_file_and_all_bad(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(D.SSTFormatError, match="empty"):
        D.load_file(empty, skip_bad=True)
    allbad = tmp_path / "allbad.txt"
    allbad.write_text("(2 a\n(7 b)\n", encoding="utf-8")
    with pytest.raises(D.SSTFormatError, match="no valid tree"):
        D.load_file(allbad, skip_bad=True)


def test_checksum_mismatch(tmp_path, cache_env):
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "dev.txt").write_text(GOOD + "\n", encoding="utf-8")
    with pytest.raises(D.SSTChecksumError, match="sha256"):
        D.load_split("dev", data_dir=tmp_path)
    trees, report = D.load_split("dev", data_dir=tmp_path, verify=False, use_cache=False)
    assert trees == [D.parse_line(GOOD)] and report.path == str(tmp_path / "sst" / "dev.txt")


def test_missing_data_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_DATA_DIR", str(tmp_path / "nodata"))
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "nocache"))
    url = "http://127.0.0.1:9/trainDevTestTrees_PTB.zip"  # refused at once, even with network
    with pytest.raises(DataNotFoundError) as err:
        D.resolve_split_path("test", url=url)
    assert url in str(err.value) and "sst/test.txt" in str(err.value)
    with pytest.raises(ValueError, match="unknown SST split"):
        D.load_split("validation")


def test_binary_label():
    assert [T.binary_label(i) for i in range(5)] == [0, 0, None, 1, 1]
    with pytest.raises(ValueError):
        T.binary_label(5)


def test_tree_helpers():
    t = D.parse_line("(1 (2 a) (0 (2 b) (3 c)))")
    assert t == (1, (2, "a"), (0, (2, "b"), (3, "c")))
    assert D.leaves(t) == ["a", "b", "c"] and T.tree_depth(t) == 3
    assert [n[0] for n in T.iter_nodes(t)] == [1, 2, 0, 2, 3]
    st = T.tree_stats([t])
    assert (st.n_tokens, st.n_nodes, st.max_depth) == (3, 5, 3)
    assert st.node_label_counts == (1, 1, 2, 1, 0)


def test_vocab(splits):
    train = splits["train"][0]
    vocab = build_vocab(train)
    words = {w for t in train for w in D.leaves(t)}
    assert len(vocab) == len(words) + 1 == 18_281
    assert vocab.itos[UNK_INDEX] == UNK and vocab.index("no-such-word") == UNK_INDEX
    freqs = [vocab.counts[w] for w in vocab.itos[1:]]
    assert freqs == sorted(freqs, reverse=True) and sum(freqs) == 163_563
    assert all(vocab.itos[vocab.index(w)] == w for w in words)
    assert build_vocab(train) == vocab and build_vocab(train).sha256 == vocab.sha256
    full = build_vocab(train, splits["dev"][0], splits["test"][0])
    assert len(full) == 21_702 and full.sha256 != vocab.sha256
    ids = vocab.index_tree(train[0])
    assert D.leaves(ids) == vocab.encode(D.leaves(train[0])) and UNK_INDEX not in D.leaves(ids)
    again = pickle.loads(pickle.dumps(vocab))
    assert again == vocab and again.stoi == vocab.stoi and again.sha256 == vocab.sha256


def test_vocab_save_load(tmp_path):
    vocab = Vocab(["a", "8\u00a01\\/2", "-LRB-"])
    vocab.save(tmp_path / "v.txt")
    assert Vocab.load(tmp_path / "v.txt") == vocab
    with pytest.raises(ValueError):
        Vocab(["a", "a"])
