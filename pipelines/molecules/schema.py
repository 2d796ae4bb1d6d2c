"""The ``molecules.*`` config keys of the molecules experiment (Tox21, ESOL or your own CSV).

Contract: :data:`SCHEMA` maps each dotted key to its :class:`pipelines.config.Field` (type,
default, checks, doc); it is :attr:`pipelines.molecules.experiment.MoleculeExperiment.config_schema`,
so every ``molecules.*`` key is checked and documented from here.  Pure data: no import beyond
:mod:`pipelines.config`.
"""
from __future__ import annotations

from pipelines.config import Field

__all__ = ["SCHEMA"]

SCHEMA: dict[str, Field] = {
    "molecules.dataset": Field(str, "tox21", choices=("tox21", "esol", "csv"),
                               doc="csv: your own file (molecules.csv, .smiles_column, .task_columns, .task_type)"),
    "molecules.csv": Field(str, None, nullable=True, doc="your own molecules: a CSV file, plain or .gz, with a header "
                                                         "(needs molecules.dataset: csv)"),
    "molecules.smiles_column": Field(str, "smiles", doc="the SMILES column of molecules.csv"),
    "molecules.id_column": Field(str, None, nullable=True, doc="a molecule id column of molecules.csv (null: row<line>)"),
    "molecules.task_columns": Field(list, [], doc="label columns of molecules.csv (empty field = missing label)"),
    "molecules.task_type": Field(str, "classification", choices=("classification", "regression"),
                                 doc="molecules.csv labels: 0/1 (BCE, ROC-AUC) or real values (MSE, RMSE)"),
    "molecules.split": Field(str, "random", choices=("random", "scaffold")),
    "molecules.split_seed": Field(int, 0, min=0, doc="seed of the random split"),
    "molecules.fractions": Field(list, [0.8, 0.1, 0.1], doc="train/valid/test fractions"),
    "molecules.limit": Field(int, None, min=3, nullable=True,
                             doc="a seeded random sample of N molecules of the file, not its head (the run's seed "
                                 "picks them; before the split; tests, smoke runs)"),
    "molecules.max_atoms": Field(int, 150, min=1, doc="molecules with more (heavy) atoms are skipped, counted as "
                                                      "skipped/all/over_max_atoms and each named in the run's "
                                                      "data/skipped.csv (the first ones in the log): a weave layer's "
                                                      "pairs, and tracing's time and memory, grow with atoms squared "
                                                      "(Tox21's largest has 132)"),
    "molecules.atom_hidden": Field(int, 50, min=1),
    "molecules.pair_hidden": Field(int, 50, min=1),
    "molecules.n_weave": Field(int, 2, min=1),
    "molecules.gather": Field(str, "sum", choices=("sum", "gaussian")),
    "molecules.mol_hidden": Field(int, 128, min=1),
    "molecules.final_pair_output": Field(bool, False, doc="compute the (unread) p_y of the last layer"),
    "molecules.row_layout": Field(str, "concat", choices=("concat", "readers"),
                                  doc="foldengine row layout: 'concat' plans each molecule once when traced "
                                      "(batches ~3x cheaper to build, python -m benchmarks.build); 'readers' plans per batch"),
}
