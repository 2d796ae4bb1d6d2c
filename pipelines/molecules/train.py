"""``python -m pipelines.molecules.train``: the training command
(``python -m pipelines.training``) for the molecules experiment (Tox21, ESOL or your own CSV:
``molecules.dataset``).

    python -m pipelines.molecules.train --config conf/molecules_tox21.yaml [key=value ...]
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.training.run import RunResult, main as train_main

from pipelines.molecules.experiment import MoleculeExperiment


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunResult]:
    return train_main(list(sys.argv[1:] if argv is None else argv), "pipelines.molecules.train", MoleculeExperiment)


if __name__ == "__main__":
    main(sys.argv[1:])
