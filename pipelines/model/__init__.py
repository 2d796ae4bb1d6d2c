"""A trained model: the package (weights, config, what inference needs), the predictor over raw
inputs, and the MLflow Model (pyfunc) that wraps them.

* :mod:`.package`: :func:`~pipelines.model.package.write_package` / ``load_predictor`` (plain
  data, registered experiment classes only);
* :mod:`.prediction`: :class:`~pipelines.model.prediction.Predictor`, raw inputs -> one row each;
* :mod:`.mlflow_model`: ``log_model`` / ``log_package`` and the pyfunc ``FoldModel``.
"""
