"""``python -m pipelines.predict``: :func:`pipelines.predict.batch.main`."""
import sys

from pipelines.predict.batch import main

main(sys.argv[1:])
