"""GPU utilisation of a training pipeline run: how busy the GPU is, and how long steps wait for data.

Runs the SST pipeline (:func:`pipelines.sst.train.main`, Tai preset unless other ``args`` are
given) with ``ray.use_gpu=true`` while ``nvidia-smi`` samples the GPU every ``sample_ms``.

Reported (a dict, JSON-ready):

* ``gpu_busy_share``: mean of ``utilization.gpu`` (the share of each sample period in which a
  kernel ran) over the samples taken between the first training step and the end of training;
  also per epoch (``epochs[i]["gpu_busy_share"]``, from each epoch's start and ``time/epoch_s``).
* ``steady_wait_share`` per epoch: the trainer's data wait / (data wait + compute) after an
  epoch's first batch (``time/steady_wait_share``), the largest rank's; ``first_wait_s``.
* ``peak_gpu_mem_mb``: the largest ``memory.used`` sample.

    python -m benchmarks.gpu_utilization --out results/gpu_util.json -- epochs=2 ray.num_workers=1

``scripts/gpu_check.sh`` runs it on a GPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

__all__ = ["GpuSampler", "run"]


class GpuSampler:
    """``nvidia-smi`` sampling in the background: ``(unix_time, utilization %, memory MiB)`` tuples."""

    def __init__(self, sample_ms: int = 200, gpu: int = 0):
        self.samples: List[tuple] = []
        self._proc = subprocess.Popen(
            ["nvidia-smi", f"--id={gpu}", "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", f"-lms={sample_ms}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), util, mem))

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._thread.join(timeout=10)

    def busy_share(self, t0: float, t1: float) -> Optional[float]:
        """Mean utilisation (0..1) of the samples taken in ``[t0, t1]`` (None: no sample)."""
        sel = [u for t, u, _ in self.samples if t0 <= t <= t1]
        return statistics.mean(sel) / 100.0 if sel else None


def run(args: Sequence[str] = (), config: str = "conf/sst_tai2015.yaml", sample_ms: int = 200) -> Dict[str, object]:
    """Train with ``ray.use_gpu=true`` under a :class:`GpuSampler`; returns the figures above."""
    from pipelines.sst.train import main

    sampler = GpuSampler(sample_ms)
    t_start = time.time()
    try:
        res = main(["--config", config, "ray.use_gpu=true", *args])
    finally:
        t_end = time.time()
        sampler.stop()
    epochs = []
    for i, h in enumerate(res.history, 1):
        start = h.get("time/first_step_unix")
        row = {"epoch": i, "epoch_s": h.get("time/epoch_s"), "steady_wait_share": h.get("time/steady_wait_share"),
               "first_wait_s": h.get("time/first_wait_s"), "data_wait_s": h.get("time/data_wait_s")}
        if start and h.get("time/epoch_s"):
            row["gpu_busy_share"] = sampler.busy_share(start, start + h["time/epoch_s"])
        epochs.append(row)
    first = next((e for e in res.history if e.get("time/first_step_unix")), None)
    t_first = first["time/first_step_unix"] if first else t_start
    return {"args": list(args), "config": config, "run_id": res.run_id, "wall_s": t_end - t_start,
            "gpu_busy_share": sampler.busy_share(t_first, t_end),
            "peak_gpu_mem_mb": max((m for _, _, m in sampler.samples), default=None),
            "samples": len(sampler.samples), "sample_ms": sample_ms, "epochs": epochs,
            "best": {k: v for k, v in res.metrics.items() if k.startswith("best/")}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_utilization",
                                 description="GPU busy share and data-wait share of an SST pipeline run")
    ap.add_argument("--config", default="conf/sst_tai2015.yaml")
    ap.add_argument("--sample-ms", type=int, default=200)
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides (after --)")
    a = ap.parse_args(argv)
    result = run(a.overrides, a.config, a.sample_ms)
    print(json.dumps(result, indent=1, default=str))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
