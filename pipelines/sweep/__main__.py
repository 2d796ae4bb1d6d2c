"""``python -m pipelines.sweep``: :func:`pipelines.sweep.run.main`."""
import sys

from pipelines.sweep.run import main

main(sys.argv[1:])
