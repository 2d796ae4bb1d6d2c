"""Stanford Sentiment Treebank (SST): parsing PTB-format trees into compact tuples.

A tree is nested plain tuples: a leaf ``(label, word)`` (``len == 2``), an inner node
``(label, left, right)`` (``len == 3``); ``label`` an ``int`` in ``0..4`` (very negative .. very
positive), ``word`` the token exactly as in the file (``str``, interned, nothing unescaped; split
on ASCII whitespace and parentheses only), an ``int`` id after
:func:`pipelines.sst.vocab.Vocab.index_tree`.  :func:`normalize_token` gives a token's plain form
for embedding look-up.  :func:`parse_line_checked` is every reader's per-line rule;
:func:`load_split` finds ``sst/<split>.txt`` (:func:`pipelines.datadir.resolve_data_file`),
verifies its SHA-256 and parses it (cached by that hash): a malformed line raises
:class:`SSTFormatError` naming ``path:line``, or is skipped and counted with ``skip_bad=True``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import pickle
import re
import stat
import sys
from typing import Optional, Union

from nltk import Tree

from pipelines import datadir

__all__ = [
    "SPLITS", "SST_URL", "SST_SHA256", "LABELS", "RANDOM_EMBEDDINGS",
    "SSTFormatError", "SSTChecksumError", "check_sha256", "LoadReport",
    "parse_line", "parse_line_checked", "load_file", "load_split", "load_split_source", "resolve_split_path",
    "split_file", "data_files",
    "leaves", "normalize_token",
]

#: ``sst.embeddings`` naming no file: random vectors with GloVe 6B 50d's per-dimension mean and sd
#: (the ablation; :mod:`pipelines.sst.embeddings` makes them)
RANDOM_EMBEDDINGS = "random"

SPLITS = ("train", "dev", "test")
SST_URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
#: SHA-256 of the *extracted* files ``trees/<split>.txt`` (same as data/SHA256SUMS).
SST_SHA256 = {
    "train": "e2f3f41b0b1e6d4dddc0effe3bfc2d27ed8928079aa9a03d652311614fc5feb7",
    "dev": "0e9336aed6e4730e19f58d00a77b3f0297efdb755f7b5e598c98a05e3f97ea40",
    "test": "6e54806dee95cf80cd918e7dfb3f6770f6df24bf826f289a4d1f709e1c8f6761",
}
LABELS = range(5)
_LABEL_OF = {str(i): i for i in LABELS}
# Tokens are runs of anything but ASCII whitespace and parentheses (U+00A0 is kept).
_TOKEN = r"[^ \t\n\r\f\v()]+"
_PARSER_VERSION = 1  # bump when the tuple encoding or parsing rules change (invalidates cache)

Node = tuple  # (label, word) | (label, left, right)


class SSTFormatError(ValueError):
    """A line of an SST file is not a valid binarized sentiment tree (message: ``path:line: why``)."""


class SSTChecksumError(ValueError):
    """An SST split file does not match its published SHA-256."""


def check_sha256(path: str, sha: str, expected: Optional[str]) -> None:
    """Raise :class:`SSTChecksumError` naming ``path`` when ``expected`` is given and differs from ``sha``."""
    if expected is not None and sha != expected:
        raise SSTChecksumError(f"{path}: sha256 {sha} != expected {expected}; the file is "
                               "not the canonical SST split (pass verify=False to load it anyway)")


@dataclasses.dataclass
class LoadReport:
    """What :func:`load_file` / :func:`load_split` read.

    ``n_read`` counts trees returned, ``n_skipped`` malformed lines skipped (only with
    ``skip_bad=True``), ``skipped_lines`` holds ``(line_no, reason)`` with 1-based line numbers.
    """
    path: str
    n_read: int = 0
    n_skipped: int = 0
    skipped_lines: list = dataclasses.field(default_factory=list)
    sha256: Optional[str] = None
    from_cache: bool = False


# --------------------------------------------------------------------------- parsing

def _convert(t, intern=sys.intern) -> Node:
    """nltk.Tree -> tuple encoding, validating shape and labels (raises ValueError)."""
    label = _LABEL_OF.get(t._label)
    if label is None:
        raise ValueError(f"label {t._label!r} is not one of 0..4")
    n = len(t)
    if n == 1:
        child = t[0]
        if isinstance(child, str):
            return (label, intern(child))
        raise ValueError(f"node labelled {label} has a single subtree child (unary node)")
    if n == 2:
        left, right = t[0], t[1]
        if isinstance(left, str) or isinstance(right, str):
            words = [c for c in (left, right) if isinstance(c, str)]
            if isinstance(left, str) and isinstance(right, str):
                raise ValueError(f"leaf labelled {label} has 2 words {words!r} (expected 1)")
            raise ValueError(f"node labelled {label} mixes a word {words[0]!r} with a subtree")
        return (label, _convert(left, intern), _convert(right, intern))
    if n == 0:
        raise ValueError(f"node labelled {label} has no children")
    kind = "words" if all(isinstance(c, str) for c in t) else "children"
    raise ValueError(f"node labelled {label} has {n} {kind} (expected a word or 2 subtrees)")


_STRICT_TOKEN = re.compile(r"[()]|[^ \t\n\r\f\v()]+")
#: deeper trees go through nltk (whose recursive conversion gives "tree too deep")
_STRICT_MAX_DEPTH = 200


def _parse_strict(s: str, intern=sys.intern) -> Optional[Node]:
    """The tree of ``s`` when it is exactly a well-formed binarized sentiment tree, else None.

    A one-pass, stack-based parser of the strict grammar ``node := "(" label word ")" |
    "(" label node node ")"`` (``label`` in 0..4, tokens as in nltk's parse with ``_TOKEN``).
    It accepts only what :func:`parse_line`'s nltk path turns into the same tuples; everything
    else (malformed lines, odd spacing inside a label) returns None, and the nltk path decides
    and words the error (``tests/pipelines/sst/test_data.py`` checks identical trees on every
    SST line).
    """
    toks = _STRICT_TOKEN.findall(s)
    n = len(toks)
    stack: list = []          # open inner nodes: [label, children]
    root = None
    i = 0
    while i < n:
        t = toks[i]
        if t == "(":
            if root is not None or i + 2 >= n:
                return None
            label = _LABEL_OF.get(toks[i + 1])
            if label is None:
                return None
            w = toks[i + 2]
            if w != "(" and w != ")":
                if i + 3 >= n or toks[i + 3] != ")":
                    return None
                node, i = (label, intern(w)), i + 4
            else:
                if len(stack) >= _STRICT_MAX_DEPTH:
                    return None
                stack.append((label, []))
                i += 2
                continue
        elif t == ")":
            if not stack:
                return None
            label, kids = stack.pop()
            if len(kids) != 2:
                return None
            node, i = (label, kids[0], kids[1]), i + 1
        else:
            return None
        if stack:
            kids = stack[-1][1]
            if len(kids) == 2:
                return None
            kids.append(node)
        else:
            root = node
    return root if not stack else None


def parse_line(line: str) -> Node:
    """Parse one SST line (no trailing newline needed) into the tuple encoding.

    Raises ``ValueError`` with a short reason (no file position) for malformed input:
    empty line, unbalanced parentheses, trailing text, label outside 0..4, unary or
    n-ary nodes, leaves with several words.
    """
    s = line.rstrip("\r\n")
    if not s.strip(" \t\r\f\v"):
        raise ValueError("empty line")
    fast = _parse_strict(s)
    return fast if fast is not None else _parse_nltk(s)


def parse_line_checked(line: str) -> tuple[Optional[Node], Optional[str]]:
    """``(tree, None)`` for a well-formed SST line, ``(None, reason)`` for a malformed one
    (:func:`parse_line`'s ``ValueError`` text; ``"tree too deep"`` when the nesting exhausts the
    recursion limit): the per-line rule of both readers, :func:`load_file` and the Ray Data parse
    tasks of :func:`pipelines.sst.reading.read_sst_file`."""
    try:
        return parse_line(line), None
    except ValueError as err:
        return None, str(err)
    except RecursionError:
        return None, "tree too deep"


def _parse_nltk(s: str) -> Node:
    """:func:`parse_line` by ``nltk.Tree.fromstring`` and :func:`_convert` (the reference, and
    the path that words the errors)."""
    try:
        t = Tree.fromstring(s, node_pattern=_TOKEN, leaf_pattern=_TOKEN)
    except ValueError as err:
        # nltk's message is multi-line with a caret; keep its first line and the context.
        msg = " ".join(part.strip() for part in str(err).splitlines() if part.strip() and part.strip() != "^")
        raise ValueError(f"unbalanced or malformed s-expression: {msg}") from None
    if isinstance(t, str):  # pragma: no cover - nltk returns a Tree for any '(' input
        raise ValueError("line is a bare word, not a tree")
    return _convert(t)


def _parse_lines(path: str, text: str, skip_bad: bool) -> tuple[list, LoadReport]:
    report = LoadReport(path=path)
    if not text:
        raise SSTFormatError(f"{path}: file is empty (expected one tree per line)")
    lines = text.split("\n")
    if lines[-1] == "":  # final newline
        lines.pop()
    trees = []
    for no, line in enumerate(lines, start=1):
        tree, reason = parse_line_checked(line)
        if reason is None:
            trees.append(tree)
            continue
        if not skip_bad:
            raise SSTFormatError(f"{path}:{no}: {reason}")
        report.skipped_lines.append((no, reason))
    report.n_read = len(trees)
    report.n_skipped = len(report.skipped_lines)
    if not trees:
        raise SSTFormatError(f"{path}: no valid tree in {len(lines)} line(s) "
                             f"({report.n_skipped} malformed, first: {report.skipped_lines[:1]})")
    return trees, report


def _tree_cache_path(sha256: str) -> pathlib.Path:
    return datadir.cache_dir() / "sst" / "parsed" / f"{sha256}.v{_PARSER_VERSION}.pkl"


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (tuples, lists, dicts, str, int, float, bool, None): every class
    or function reference is refused, so a crafted cache file cannot run code; it fails with
    ``pickle.UnpicklingError`` and the file is re-parsed instead."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a parse cache")


def _read_tree_cache(cache: pathlib.Path) -> Optional[list]:
    """The trees in ``cache``, or None when it is missing, not a regular file of this user that
    only this user can write (the cache dir may be shared: ``FOLD_CACHE_DIR``), or not a list
    of plain data."""
    try:
        fd = os.open(cache, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid()
                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return None
        try:
            trees = _PlainUnpickler(f).load()
        except Exception:  # corrupt, partial or crafted: re-parse
            return None
    return trees if isinstance(trees, list) else None


def load_file(path: Union[str, os.PathLike], skip_bad: bool = False,
              expected_sha256: Optional[str] = None, use_cache: bool = False) -> tuple[list, LoadReport]:
    """Parse an SST-format file: one tree per line, UTF-8.

    Returns ``(trees, report)``: ``trees`` a list of tuple-encoded trees in file order.
    Raises :class:`SSTFormatError` for an empty file, a file with no valid tree, or (unless
    ``skip_bad``) the first malformed line; :class:`SSTChecksumError` when ``expected_sha256``
    is given and does not match.  ``use_cache`` reads/writes a pickle of the parsed trees in
    the user cache, keyed by the file's SHA-256 (only files with no malformed line are cached);
    a cache file is used only when it is this user's (mode 0600 as written) and holds plain data
    (tuples, strings, numbers: no class or function is ever unpickled from it).
    """
    path = str(path)
    data = pathlib.Path(path).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    check_sha256(path, sha, expected_sha256)
    cache = _tree_cache_path(sha) if use_cache else None
    trees = _read_tree_cache(cache) if cache is not None else None
    if trees is not None:
        return trees, LoadReport(path=path, n_read=len(trees), sha256=sha, from_cache=True)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = data[:err.start].count(b"\n") + 1
        raise SSTFormatError(f"{path}:{line_no}: not valid UTF-8 ({err.reason})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    trees, report = _parse_lines(path, text, skip_bad)
    report.sha256 = sha
    if cache is not None and not report.n_skipped:
        try:
            datadir.write_atomic(cache, lambda f: pickle.dump(trees, f, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass  # read-only cache: caching is only an optimisation
    return trees, report


def split_file(split: str, data_dir=None, url: str = SST_URL) -> datadir.DatasetFile:
    """The canonical file of SST ``split``: ``sst/<split>.txt`` under ``data_dir`` or the data
    directories, else ``trees/<split>.txt`` of the Stanford zip at ``url``."""
    if split not in SPLITS:
        raise ValueError(f"unknown SST split {split!r}; expected one of {SPLITS}")
    return datadir.DatasetFile(f"sst/{split}.txt", url=url, archive_member=f"trees/{split}.txt",
                               data_dir=None if data_dir is None else str(data_dir))


def resolve_split_path(split: str, data_dir=None, url: str = SST_URL) -> pathlib.Path:
    """Local path of ``sst/<split>.txt``: ``data_dir``, the data directory (``$FOLD_DATA_DIR``, else
    ``../shared/data`` beside the checkout), the cache, or a download.

    The download fetches ``url`` (the Stanford zip) and extracts ``trees/<split>.txt``; offline
    it raises :class:`pipelines.datadir.DataNotFoundError` naming every place looked in.
    """
    return split_file(split, data_dir, url).resolve()


def data_files(sst_config: dict) -> list[datadir.DataFile]:
    """The files an SST run with the ``sst`` section ``sst_config`` reads (see
    :meth:`pipelines.experiment.Experiment.data_files`): per split, the user's ``sst.<split>_file``
    (an :class:`~pipelines.datadir.OwnFile`) or, when it is null, the canonical split
    (:func:`split_file`, under ``sst.data_dir`` first); none for a split set to ``""``; and the
    ``sst.embeddings`` file when one is named (``"random"``, the ablation's random vectors, names
    no file)."""
    files: list[datadir.DataFile] = []
    for split in SPLITS:
        own = sst_config.get(f"{split}_file")
        if own is None:
            files.append(split_file(split, sst_config.get("data_dir")))
        elif own != "":
            files.append(datadir.OwnFile(str(own), f"sst.{split}_file"))
    if sst_config.get("embeddings") and sst_config["embeddings"] != RANDOM_EMBEDDINGS:
        files.append(datadir.OwnFile(str(sst_config["embeddings"]), "sst.embeddings"))
    return files


def load_split(split: str, data_dir=None, skip_bad: bool = False, verify: bool = True,
               use_cache: bool = True) -> tuple[list, LoadReport]:
    """Load SST ``split`` (``"train"``, ``"dev"`` or ``"test"``) as ``(trees, report)``.

    ``verify`` checks the file against :data:`SST_SHA256` (raises :class:`SSTChecksumError`;
    a freshly downloaded file that fails is deleted from the cache).  Expected sizes:
    train 8544, dev 1101, test 2210 trees.  See :func:`load_file` for errors and caching.
    """
    path = resolve_split_path(split, data_dir)
    try:
        return load_file(path, skip_bad=skip_bad,
                         expected_sha256=SST_SHA256[split] if verify else None,
                         use_cache=use_cache)
    except SSTChecksumError:
        cached = datadir.cache_dir() / f"sst/{split}.txt"
        if path.resolve() == cached.resolve():
            cached.unlink(missing_ok=True)  # do not keep a bad download around
        raise


def load_split_source(split: str, path: Optional[Union[str, os.PathLike]] = None, data_dir=None,
                      skip_bad: bool = False) -> tuple[list, LoadReport, bool]:
    """Trees of ``split`` from the user's own file ``path``, or (``path`` None) the canonical SST
    split (found via :func:`resolve_split_path` and checked against :data:`SST_SHA256`).

    A user file is any PTB-format file with a label 0..4 on every node; its checksum is not
    checked.  Returns ``(trees, report, canonical)``: ``canonical`` is True iff the file's
    SHA-256 is the published one of ``split`` (so a user file that is a copy of SST counts).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown SST split {split!r}; expected one of {SPLITS}")
    if path is None:
        trees, report = load_split(split, data_dir=data_dir, skip_bad=skip_bad)
        return trees, report, True
    path = pathlib.Path(os.path.abspath(os.path.expanduser(str(path))))
    if not path.is_file():
        raise FileNotFoundError(f"sst.{split}_file: no such file {path}")
    trees, report = load_file(path, skip_bad=skip_bad, expected_sha256=None, use_cache=False)
    return trees, report, report.sha256 == SST_SHA256[split]


# --------------------------------------------------------------------------- tree helpers

def leaves(tree: Node) -> list:
    """Words (or word ids) of ``tree`` left to right."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if len(node) == 2:
            out.append(node[1])
        else:
            stack.append(node[2])
            stack.append(node[1])
    return out


# --------------------------------------------------------------------------- tokens

_UNESCAPE = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def normalize_token(token: str) -> str:
    """Plain form of a PTB token, for embedding look-up only (the trees keep the raw token).

    ``-LRB-``/``-RRB-`` (and square/curly variants) -> brackets, ``\\/`` -> ``/``,
    ``\\*`` -> ``*``, U+00A0 -> ASCII space (``8\\u00a01\\/2`` -> ``8 1/2``).
    """
    if token in _UNESCAPE:
        return _UNESCAPE[token]
    if "\\" in token:
        token = token.replace("\\/", "/").replace("\\*", "*")
    if "\u00a0" in token:
        token = token.replace("\u00a0", " ")
    return token
