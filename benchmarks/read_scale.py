"""Reading a text file in Ray Data tasks (:func:`pipelines.data.sources.read_lines`) is linear in
its size: files of ``S`` and ``4 S`` bytes of ordinary SST lines, and one single line of ``S``
bytes (over the line limit: one row error, read past), each read to the end in a fresh pass.
Prints seconds, rows and the time ratio; the 4x file should take at most ~4.5x.

    python -m benchmarks.read_scale [--mb 256]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def _write(path: str, n_bytes: int, one_line: bool) -> None:
    piece = (b"x" * (1 << 20)) if one_line else (b"(3 (2 (2 a) (2 good)) (2 movie))\n" * 32768)
    with open(path, "wb") as f:
        written = 0
        while written < n_bytes:
            f.write(piece)
            written += len(piece)
        f.write(b"\n")


def _read(path: str):
    from pipelines.data.sources import read_lines

    t0, rows, errors = time.perf_counter(), 0, 0
    for batch in read_lines(path).iter_batches(batch_format="pyarrow", batch_size=None):
        rows += batch.num_rows
        errors += batch.num_rows - batch.column("error").null_count
    return time.perf_counter() - t0, rows, errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.read_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="S in MiB (the larger file is 4 S)")
    a = ap.parse_args(argv)
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    S = a.mb << 20
    with tempfile.TemporaryDirectory(prefix="read-scale-") as d:
        out = {}
        for name, n, one in (("1x", S, False), ("4x", 4 * S, False), ("one line", S, True)):
            path = os.path.join(d, name.replace(" ", "_") + ".txt")
            _write(path, n, one)
            _read(path) if name == "1x" else None     # warm-up: Ray Data's first dataset starts its workers
            out[name] = _read(path)
            os.remove(path)
            print(f"{name:9s} {n / 2**20:7.0f} MiB  {out[name][0]:7.1f} s  {out[name][1]:>10,d} rows  "
                  f"{out[name][2]} row error(s)")
    print(f"time 4x / 1x: {out['4x'][0] / out['1x'][0]:.2f} (linear: 4.0)")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
