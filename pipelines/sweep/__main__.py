"""``python -m pipelines.sweep``: :func:`pipelines.sweep.cli.main`."""
import sys

from pipelines.sweep.cli import main

main(sys.argv[1:])
