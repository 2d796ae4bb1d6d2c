"""Using a trained model on many inputs: batch inference on Ray Data
(:mod:`.batch`, ``python -m pipelines.predict``) and online serving on Ray Serve (:mod:`.serve`,
``python -m pipelines.predict.serve``).
"""
