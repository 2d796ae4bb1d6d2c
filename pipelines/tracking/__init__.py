"""Tracking: what a run sends to MLflow, and what waits while the server does not answer.

* :mod:`.tracker`: the :class:`~pipelines.tracking.tracker.Tracker` of a run (params, metrics, tables,
  figures, a model package); :mod:`.store`: the tracking URI and its store; :mod:`.run_metadata`: a
  run's params, name, tags, experiment; :mod:`.values`: keys and values as MLflow takes them;
* :mod:`.outbox`: the buffer replayed when the server is back (:mod:`.replay`: ``python -m
  pipelines.tracking replay DIR``); :mod:`.runs_view`: the saved MLflow UI views;
  :mod:`.system_metrics` and :mod:`.dataset_inputs`: the machine's metrics and the dataset inputs.

Nothing here imports the model, training or sweep code: a kind of operation with files (the
``model``) is registered by its owner (:func:`pipelines.tracking.outbox.register_kind`).
"""
