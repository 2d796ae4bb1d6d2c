"""Training: one experiment's run on Ray Data -> Ray Train -> MLflow.

* :mod:`.run`: :func:`~pipelines.training.run.run` (the run, checked before Ray starts), the
  entry points' shared ``main`` and report;
* :mod:`.checks`: what a run checks before its MLflow run and Ray (:func:`~pipelines.training.checks.check_run`);
* :mod:`.storage`: ``ray.storage_path``, probed before the run and named when it fails during it;
* :mod:`.worker`: what each Ray Train worker does per epoch (steps, evaluation, checkpoints);
* :mod:`.optim` and :mod:`.sparse_grads`: the optimizer and the sparse-embedding gradient sync.
"""
