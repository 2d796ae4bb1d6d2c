"""The weave model as a predictor of raw SMILES (:class:`pipelines.prediction.Predictor`).

Input column ``smiles``.  Output, one row per molecule: one column per task, named after it:
the probability of the positive class (classification, e.g. Tox21's ``NR-AR``) or the value in
the original units (regression, e.g. ESOL's ``logS``: the model's standardised output times the
training split's standard deviation plus its mean).  A SMILES that RDKit rejects gets its
``error`` and null predictions.
"""
from __future__ import annotations

from typing import Sequence

import torch

from pipelines.prediction import Predictor

from .featurize import featurize

__all__ = ["MoleculePredictor"]


class MoleculePredictor(Predictor):
    """Predicts with ``compiler`` (the weave model, weights loaded).

    Args:
      tasks: the task names (the output columns), in the model's output order.
      classification: sigmoid of the logits if true, else ``out * std + mean``.
      mean, std: the target scaling (floats, or one per task).
    """

    input_column = "smiles"

    def __init__(self, compiler, tasks: Sequence[str], classification: bool, mean=0.0, std=1.0):
        self.compiler = compiler.eval()
        self.output_columns = list(tasks)
        self.classification = classification
        self.mean = torch.as_tensor(mean, dtype=torch.float32)
        self.std = torch.as_tensor(std, dtype=torch.float32)

    def parse(self, raw) -> tuple:
        """The weave model's input ``(atoms, pairs)`` of one SMILES
        (:func:`pipelines.molecules.featurize.featurize`)."""
        if not isinstance(raw, str):
            raise TypeError(f"expected a SMILES string, got {type(raw).__name__}")
        return featurize(raw).model_input()

    @torch.no_grad()
    def run(self, graphs: list) -> list:
        out = self.compiler(self.compiler.build_batch(graphs)).float().cpu()
        values = torch.sigmoid(out) if self.classification else out * self.std + self.mean
        return [dict(zip(self.output_columns, row)) for row in values.tolist()]
