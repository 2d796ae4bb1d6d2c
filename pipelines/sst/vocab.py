"""Word vocabulary for SST trees.

Contract: a :class:`Vocab` maps ``str`` tokens (raw, as in the tree files) to ``int`` ids in
``[0, len(vocab))``.  Id 0 (:data:`UNK_INDEX`, token :data:`UNK`) is reserved for unknown
words; known words get ids ``1..len(vocab)-1`` ordered by decreasing frequency, ties broken
by the word's code points, so the same trees always give the same vocabulary.  A vocab is
picklable and has a stable content hash (:attr:`Vocab.sha256`) used to key embedding caches.
:func:`build_vocab` takes any number of tree lists (Tai et al. 2015 counted all splits).
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Iterable, Mapping, Optional, Sequence

from pipelines.sst.data import leaves

__all__ = ["UNK", "UNK_INDEX", "Vocab", "build_vocab", "vocab_of_counts"]

UNK = "<unk>"
UNK_INDEX = 0


class Vocab:
    """Token <-> id mapping with id 0 = unknown.

    ``itos``: list of tokens, ``itos[0] == UNK``; ``stoi``: dict token -> id;
    ``counts``: dict token -> frequency in the trees it was built from (may be empty).
    """

    __slots__ = ("itos", "stoi", "counts", "_sha256")

    def __init__(self, words: Sequence[str], counts: Optional[dict] = None):
        """``words``: the known tokens in id order starting at id 1 (``UNK`` must not be among them)."""
        self.itos = [UNK, *words]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("duplicate word (or the reserved token <unk>) in vocabulary")
        self.counts = dict(counts or {})
        self._sha256 = None

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word) -> bool:
        return word in self.stoi and word != UNK

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab({len(self)} entries incl. {UNK}, sha256={self.sha256[:12]})"

    def __getstate__(self):
        return (self.itos, self.counts)

    def __setstate__(self, state):
        itos, counts = state
        self.itos, self.counts, self._sha256 = itos, counts, None
        self.stoi = {w: i for i, w in enumerate(itos)}

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the id -> token list (the content hash used for cache keys)."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256("\n".join(self.itos).encode("utf-8")).hexdigest()
        return self._sha256

    def index(self, word: str) -> int:
        """Id of ``word``, or :data:`UNK_INDEX` when unknown."""
        return self.stoi.get(word, UNK_INDEX)

    def encode(self, words: Iterable[str]) -> list:
        """Ids of ``words`` (unknown -> 0)."""
        get = self.stoi.get
        return [get(w, UNK_INDEX) for w in words]

    def index_tree(self, tree):
        """Same tuple tree with each leaf ``(label, word)`` replaced by ``(label, word_id)``."""
        get = self.stoi.get

        def conv(node):
            if len(node) == 2:
                return (node[0], get(node[1], UNK_INDEX))
            return (node[0], conv(node[1]), conv(node[2]))
        return conv(tree)

    def save(self, path) -> None:
        """Write one token per line (id order, line 1 is ``<unk>``), UTF-8."""
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for w in self.itos:
                f.write(w + "\n")

    @classmethod
    def load(cls, path) -> "Vocab":
        """Inverse of :meth:`save` (counts are not stored)."""
        with open(path, encoding="utf-8", newline="\n") as f:
            itos = f.read().split("\n")
        if itos and itos[-1] == "":
            itos.pop()
        if not itos or itos[0] != UNK:
            raise ValueError(f"{path}: not a vocabulary file (first line must be {UNK})")
        return cls(itos[1:])


def build_vocab(*tree_lists: Iterable, min_freq: int = 1) -> Vocab:
    """Vocabulary of all leaf words in the given tree lists with frequency >= ``min_freq``."""
    counts = Counter()
    for trees in tree_lists:
        for t in trees:
            counts.update(leaves(t))
    return vocab_of_counts(counts, min_freq)


def vocab_of_counts(counts: Mapping[str, int], min_freq: int = 1) -> Vocab:
    """The vocabulary of word counts: ``UNK`` dropped, words with at least ``min_freq``
    occurrences, most frequent first, ties broken by the word.  Every vocabulary builder
    (:func:`build_vocab`, and the Ray Data ones in :mod:`pipelines.sst.reading`) ends here."""
    kept = {w: int(c) for w, c in counts.items() if w != UNK and c >= min_freq}
    words = sorted(kept, key=lambda w: (-kept[w], w))
    return Vocab(words, {w: kept[w] for w in words})

