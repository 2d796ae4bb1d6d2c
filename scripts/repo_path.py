"""Put this checkout's root on ``sys.path`` (imported first by the ``bench_*.py`` scripts).

``benchmarks/`` is a folder of the repository, not an installed package (``pip install
foldengine`` installs ``foldengine``, ``schedulers`` and ``pipelines``), so a script finds the
benchmarks of the checkout it lives in, whatever the working directory.
"""
import pathlib
import sys

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
