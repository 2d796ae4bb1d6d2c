"""Tracking: what a run sends to MLflow, and what waits while the server does not answer.

* :mod:`.tracker`: :class:`~pipelines.tracking.tracker.Tracker` (params, metrics, tables, figures,
  files, a model package) and the tracking URI; ``python -m pipelines.tracking replay DIR``;
* :mod:`.outbox`: the signed, locked buffer of operations replayed when the server is back;
* :mod:`.runs_view`: the saved MLflow UI views (runs table, charts);
* :mod:`.system_metrics` and :mod:`.dataset_inputs`: the machine's metrics and the dataset inputs.

Nothing here imports the model, training or sweep code: a kind of operation with files (the
``model``) is registered by its owner (:func:`pipelines.tracking.outbox.register_kind`).
"""
