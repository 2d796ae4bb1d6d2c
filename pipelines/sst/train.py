"""``python -m pipelines.sst.train``: the training command
(``python -m pipelines.training``) for the SST experiment, with one extra flag:
``--embeddings PATH`` is ``sst.embeddings=PATH`` (a GloVe-format text file; default GloVe 6B 50d).

    python -m pipelines.sst.train --config conf/sst_treelstm.yaml [key=value ...]
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.training.run import RunResult, main as train_main

from pipelines.sst.experiment import SSTExperiment


def _split_embeddings_flag(argv: Sequence[str]) -> list[str]:
    """``--embeddings PATH`` / ``--embeddings=PATH`` -> the override ``sst.embeddings=PATH``."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--embeddings":
            path = next(it, None)
            if path is None:
                raise SystemExit("--embeddings needs a PATH")
            out.append(f"sst.embeddings={path}")
        elif a.startswith("--embeddings="):
            out.append("sst.embeddings=" + a.split("=", 1)[1])
        else:
            out.append(a)
    return out


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunResult]:
    argv = _split_embeddings_flag(list(sys.argv[1:] if argv is None else argv))
    return train_main(argv, "pipelines.sst.train", SSTExperiment)


if __name__ == "__main__":
    main(sys.argv[1:])
