"""The weave model as a predictor of raw SMILES (:class:`pipelines.model.prediction.Predictor`).

Input column ``smiles``.  Output, one row per molecule: one column per task, named after it:
the probability of the positive class (classification, e.g. Tox21's ``NR-AR``) or the value in
the original units (regression, e.g. ESOL's ``logS``: the model's standardised output times the
training split's standard deviation plus its mean).  A SMILES that RDKit rejects, or a molecule
of more than ``max_atoms`` heavy atoms (training's ``molecules.max_atoms``; the pair features
grow with its square), gets its ``error`` and null predictions.
"""
from __future__ import annotations

from typing import Sequence

import torch

from pipelines.model.prediction import InputTooLarge, Predictor

from pipelines.molecules.featurize import featurize_mol, parse_smiles, written_heavy_atoms
from pipelines.molecules.scaling import TargetScaling

__all__ = ["MoleculePredictor"]


class MoleculePredictor(Predictor):
    """Predicts with ``compiler`` (the weave model, weights loaded).

    Args:
      tasks: the task names (the output columns), in the model's output order.
      classification: sigmoid of the logits if true, else the outputs in the targets' units
        (:meth:`pipelines.molecules.scaling.TargetScaling.unscale`).
      mean, std: the target scaling (floats, or one per task).
      max_atoms: the largest molecule (heavy atoms) predicted; a SMILES longer than
        ``CHARS_PER_ATOM * max_atoms`` characters is refused before RDKit parses it.
    """

    input_column = "smiles"
    size_unit = "atoms"
    CHARS_PER_ATOM = 40

    def __init__(self, compiler, tasks: Sequence[str], classification: bool, mean=0.0, std=1.0,
                 max_atoms: int = 150):
        self.compiler = compiler.eval()
        self.max_size = int(max_atoms)
        self.output_columns = list(tasks)
        self.classification = classification
        self.scaling = TargetScaling(mean, std)

    def parse(self, raw) -> tuple:
        """The weave model's input ``(atoms, pairs)`` of one SMILES
        (:func:`pipelines.molecules.featurize.featurize`)."""
        if not isinstance(raw, str):
            raise TypeError(f"expected a SMILES string, got {type(raw).__name__}")
        if len(raw) > self.CHARS_PER_ATOM * self.max_size:
            raise InputTooLarge(
                f"a SMILES of {len(raw)} characters is longer than any molecule of at most {self.max_size} atoms "
                f"(molecules.max_atoms) can be written")
        if written_heavy_atoms(raw) > self.max_size:   # before the parse, whose cost grows with the molecule
            raise self.too_large(written_heavy_atoms(raw), "molecules.max_atoms")
        mol = parse_smiles(raw)
        if mol.GetNumAtoms() > self.max_size:
            raise self.too_large(mol.GetNumAtoms(), "molecules.max_atoms")
        return featurize_mol(mol, smiles=raw.strip()).model_input()

    @torch.no_grad()
    def run(self, graphs: list) -> list:
        out = self.compiler(self.compiler.build_batch(graphs)).float().cpu()
        values = torch.sigmoid(out) if self.classification else self.scaling.unscale(out)
        return [dict(zip(self.output_columns, row)) for row in values.tolist()]
