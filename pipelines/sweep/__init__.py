"""Sweeps on Ray Tune: seeds (the paper's mean (sd) and ensemble) and hyperparameter searches, one
MLflow parent run with a nested run per trial.

* :mod:`.run`: planning, running and resuming a sweep; ``python -m pipelines.sweep``;
* :mod:`.space`: ``--search KEY=KIND(ARGS)`` parsed into Tune's space;
* :mod:`.report`: what the parent run shows (pure functions of the trials' outcomes).
"""
