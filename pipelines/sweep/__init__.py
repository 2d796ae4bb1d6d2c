"""Sweeps on Ray Tune: seeds (the paper's mean (sd) and ensemble) and hyperparameter searches, one
MLflow parent run with a nested run per trial.

* :mod:`.plan`: the sweep's definition checked, its CPUs fixed; :mod:`.space`: ``--search`` specs;
* :mod:`.run`: running and resuming a sweep; :mod:`.trials`: its trials on Ray Tune;
* :mod:`.parent`: the MLflow parent run; :mod:`.ensemble`: the ensemble of a seed sweep;
* :mod:`.report`: what the parent run shows (pure functions of the trials' outcomes);
* :mod:`.cli`: ``python -m pipelines.sweep``.
"""
