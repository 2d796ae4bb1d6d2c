"""Helpers over SST tuple trees (leaf ``(label, word)``, inner node ``(label, left, right)``)
that only the tests use: node iteration, depth, PTB serialisation, binary labels and the
counts of data/README.md section 1."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, Iterator, Optional

from pipelines.sst.data import LABELS, Node


@dataclasses.dataclass(frozen=True)
class TreeStats:
    """Summary of a list of trees; depth counts nodes on the longest root-to-leaf path."""
    n_sentences: int
    n_tokens: int
    n_nodes: int
    mean_length: float
    max_length: int
    max_depth: int
    root_label_counts: tuple  # counts of root labels 0..4
    node_label_counts: tuple  # counts of all node labels 0..4


def is_leaf(node: Node) -> bool:
    """True for a leaf ``(label, word)``, False for an inner node ``(label, left, right)``."""
    return len(node) == 2


def iter_nodes(tree: Node) -> Iterator[Node]:
    """All nodes in pre-order (root first, left before right)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if len(node) == 3:
            stack.append(node[2])
            stack.append(node[1])


def tree_depth(tree: Node) -> int:
    """Nodes on the longest root-to-leaf path (a single leaf has depth 1)."""
    best, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        if len(node) == 2:
            best = max(best, d)
        else:
            stack.append((node[1], d + 1))
            stack.append((node[2], d + 1))
    return best


def to_string(tree: Node) -> str:
    """Serialise back to the PTB line format; ``to_string(parse_line(l)) == l`` for SST lines."""
    if len(tree) == 2:
        return f"({tree[0]} {tree[1]})"
    return f"({tree[0]} {to_string(tree[1])} {to_string(tree[2])})"


def binary_label(label: int) -> Optional[int]:
    """Fine-grained label -> binary: 0, 1 -> 0 (negative); 3, 4 -> 1 (positive); 2 -> None."""
    if label in (0, 1):
        return 0
    if label in (3, 4):
        return 1
    if label == 2:
        return None
    raise ValueError(f"SST label must be 0..4, got {label!r}")


def binary_trees(trees: Iterable[Node]) -> list:
    """Trees whose root is not neutral (the usual binary task: 6920/872/1821 for train/dev/test).

    Node labels are left fine-grained; map them with :func:`binary_label` where needed.
    """
    return [t for t in trees if t[0] != 2]


def tree_stats(trees: Iterable[Node]) -> TreeStats:
    """Counts as in data/README.md section 1 (sentences, tokens, nodes, lengths, depth, labels)."""
    n = n_tokens = n_nodes = max_len = max_depth = 0
    roots, labels = Counter(), Counter()
    for t in trees:
        n += 1
        roots[t[0]] += 1
        length = 0
        stack = [(t, 1)]
        while stack:
            node, d = stack.pop()
            labels[node[0]] += 1
            n_nodes += 1
            if len(node) == 2:
                length += 1
                if d > max_depth:
                    max_depth = d
            else:
                stack.append((node[1], d + 1))
                stack.append((node[2], d + 1))
        n_tokens += length
        max_len = max(max_len, length)
    return TreeStats(n_sentences=n, n_tokens=n_tokens, n_nodes=n_nodes,
                     mean_length=n_tokens / n if n else 0.0, max_length=max_len,
                     max_depth=max_depth, root_label_counts=tuple(roots[i] for i in LABELS),
                     node_label_counts=tuple(labels[i] for i in LABELS))
