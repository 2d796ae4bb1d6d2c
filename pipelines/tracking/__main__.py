"""``python -m pipelines.tracking replay DIR``: :func:`pipelines.tracking.replay.replay_main`."""
import sys

from pipelines.tracking.replay import replay_main

sys.exit(replay_main())
