"""``python -m pipelines.tracking replay DIR``: :func:`pipelines.tracking.tracker.replay_main`."""
import sys

from pipelines.tracking.tracker import replay_main

sys.exit(replay_main())
