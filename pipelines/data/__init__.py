"""The data path, in the order the data flows: files -> Ray Data blocks of records -> steps -> the
training worker.

* :mod:`pipelines.data.sources`: generic file sources read in Ray Data tasks (lines);
* :mod:`pipelines.data.skips`: the skip report (what was left out, counted and named);
* :mod:`pipelines.data.splits`: a split as blocks of rows ``pos``, ``rec``;
* :mod:`pipelines.data.positions`: which record lands in which step on which rank (numpy);
* :mod:`pipelines.data.step`: the step record and :func:`pipelines.data.step.build_step`;
* :mod:`pipelines.data.assembly`: steps assembled in Ray Data tasks (gather or sort);
* :mod:`pipelines.data.background`: trace pass, epoch head, eval cache (actors);
* :mod:`pipelines.data.feed`: the datasets declared on the driver and read by the worker.

:mod:`pipelines.data.cache` is the per-process cache they share.  Design notes:
``docs/data-path.md``.
"""
