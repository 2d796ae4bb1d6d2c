"""Input pipeline at scale (issue 14): how reading, parsing and tracing behave as the data grows.

For each workload (``sst``: the SST training file repeated ``k`` times; ``tox21``: the Tox21
CSV's rows repeated ``k`` times, read as ``molecules.dataset: csv``) and each ``k`` (default
1, 5, 20), two measurements, each in a fresh Python process (so its peak RSS is its own) with
its own local Ray:

* ``input``: the input pipeline alone: ``experiment.read_splits`` (files
  read and parsed in Ray Data tasks, vocabulary / label statistics by aggregation), then
  :func:`pipelines.data.feed.declare_feed` (the training split's trace pass started in the
  background, eval batches built and cached), then the first batch of epoch 1 on rank 0 (the
  first step of the epoch head, :class:`pipelines.data.background.EpochHead`, when there is one; else
  of ``train_e1_r0``; built from records), then the first batch of ``train_e2_r0`` (read from the traces: it waits for
  the trace pass).  Reports ``read_s``, ``trace_s`` (the declaration), ``first_batch_s``,
  ``e2_first_batch_s`` and ``parsed_per_s`` (data rows of all files read / ``read_s``).
* ``train``: a short :func:`pipelines.training.run.run` (2 epochs of ``--steps`` steps, so that the
  trace pass for epoch 2 runs beside epoch 1 as in a real run; 2 DDP workers, tracking off).
  Reports ``first_step_s`` (from calling ``run`` to the end of the first optimizer step on
  every rank: the worker metric ``time/first_step_unix``), ``wait_share``
  (``time/steady_wait_share`` of epoch 1: data wait / (wait + compute) after the first batch,
  the largest rank's) and ``e2_first_wait_s`` (epoch 2's wait for its first batch; with
  ``--steps`` far below a real epoch this includes the rest of the trace pass).

Both report ``driver_rss_mb`` (the process's peak RSS, ``ru_maxrss``) and ``ray_rss_mb`` (the
largest peak RSS, ``VmHWM``, of any process the driver started: Ray's GCS, raylet, workers;
sampled from ``/proc`` every 0.2 s; RSS counts the object-store pages a process touched, so
``ray_anon_mb`` also gives the largest private (``RssAnon``) memory seen in any of them, and
``ray_anon_proc`` that process's title).
``modes`` names the data path measured (``streaming``, the only one).

The goals of issue 14 at the largest ``k`` vs ``k=1`` (the ``ratios`` table): driver peak RSS
within +100 MB, time to first step within 1.5x, steady-state data-wait share < 10%.

    python -m benchmarks.input_scale [--workloads sst,tox21] [--ks 1,5,20] [--modes streaming]
                                     [--phases input,train] [--steps 20] [--epochs 2] [--eval-limit 250]
                                     [--base-rows N] [--num-cpus N] [--no-mlflow]

Prints and logs (MLflow experiment ``bench_input_scale``) time to the first training step, driver
peak RSS, the largest RSS of any Ray process, records parsed per second and the trainer's
steady-state data-wait share, and the ratios of the largest k to the smallest.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

from .reporting import REPO_ROOT, echo, format_table, git_state, log_to_mlflow

__all__ = ["WORKLOADS", "make_corpus", "run", "measure"]

WORKLOADS = ("sst", "tox21")
COLUMNS = ["workload", "k", "mode", "phase", "records", "read_s", "trace_s", "first_batch_s", "e2_first_batch_s",
           "parsed_per_s", "first_step_s", "wait_share", "e2_first_wait_s", "driver_rss_mb", "ray_rss_mb", "ray_anon_mb", "ray_anon_proc", "wall_s"]


# ---------------------------------------------------------------------------- corpora

def make_corpus(workload: str, k: int, out_dir: str, data_dir: str, base_rows: Optional[int] = None) -> str:
    """Write the workload's file repeated ``k`` times (its first ``base_rows`` data rows only when
    given) into ``out_dir``; returns its path.  Streams: never holds more than one copy."""
    if workload == "sst":
        with open(os.path.join(data_dir, "sst", "train.txt"), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        header = b""
    elif workload == "tox21":
        with gzip.open(os.path.join(data_dir, "molecules", "tox21.csv.gz"), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        header, lines = lines[0], lines[1:]
    else:
        raise ValueError(f"unknown workload {workload!r}; expected one of {WORKLOADS}")
    if base_rows:
        lines = lines[:base_rows]
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    path = os.path.join(out_dir, f"{workload}_x{k}" + (".txt" if workload == "sst" else ".csv"))
    with open(path, "wb") as f:
        f.write(header)
        for _ in range(k):
            f.writelines(lines)
    return path


def _config(workload: str, path: str, mode: str, steps: int, eval_limit: int, tmp: str, epochs: int = 2):
    from pipelines.config import load_config, merged_schema

    common = [f"epochs={epochs}", f"max_steps_per_epoch={steps}", "tracking.mode=off", "ray.num_workers=2",
              f"ray.storage_path={tmp}/ray_results", "log_every=0", "ray.no_progress_timeout_s=600"]
    if workload == "sst":
        from pipelines.sst.experiment import SCHEMA, SSTExperiment

        cfg = load_config(os.path.join(REPO_ROOT, "conf", "sst_tai2015.yaml"),
                          common + [f"sst.train_file={path}", f"sst.limit_dev={eval_limit}",
                                    f"sst.limit_test={eval_limit}"], merged_schema(SCHEMA))
        return SSTExperiment(), cfg
    from pipelines.molecules.data import TOX21_TASKS
    from pipelines.molecules.experiment import SCHEMA, MoleculeExperiment

    cfg = load_config(os.path.join(REPO_ROOT, "conf", "molecules_tox21.yaml"),
                      common + ["molecules.dataset=csv", f"molecules.csv={path}",
                                "molecules.task_columns=[" + ",".join(TOX21_TASKS) + "]",
                                "molecules.id_column=mol_id", "molecules.smiles_column=smiles",
                                "molecules.fractions=[0.9,0.05,0.05]", "data.skip_bad=true"],
                      merged_schema(SCHEMA))
    return MoleculeExperiment.from_config(cfg), cfg


# ---------------------------------------------------------------------------- one measurement (child)

def _descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def _rss_kb(pid: int) -> tuple:
    """``(VmHWM, RssAnon)`` of ``pid`` in kB: peak resident set (shared pages such as the object
    store's included) and the current private (anonymous) resident memory."""
    out = {"VmHWM:": 0, "RssAnon:": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0] + ":"
                if key in out:
                    out[key] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out["VmHWM:"], out["RssAnon:"]


def _proc_title(pid: int) -> str:
    """The process's title (Ray names its processes, e.g. ``ray::BackgroundWorker.trace``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0", 1)[0].decode(errors="replace").strip()[:60]
    except OSError:
        return "?"


class RaySampler(threading.Thread):
    """Largest peak RSS and largest sampled private RSS (kB) of any descendant process, sampled
    every ``period`` seconds, and the title of the process with that private RSS; and the CPU
    seconds the descendants used since :meth:`mark` (:meth:`cpu_since_mark`; a process that ends
    between two samples loses at most its last ``period`` of CPU)."""

    def __init__(self, period: float = 0.2):
        super().__init__(daemon=True)
        self.period, self.max_kb, self.max_anon_kb, self.stop = period, 0, 0, threading.Event()
        self.max_anon_proc = ""
        self._cpu: Dict[int, float] = {}
        self._marked: Dict[int, float] = {}

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.period)

    def sample(self) -> None:
        for p in _descendants(os.getpid()):
            hwm, anon = _rss_kb(p)
            self.max_kb = max(self.max_kb, hwm)
            if anon > self.max_anon_kb:
                self.max_anon_kb, self.max_anon_proc = anon, _proc_title(p)
            cpu = _cpu_s(p)
            if cpu is not None:
                self._cpu[p] = cpu

    def mark(self) -> None:
        """Start counting CPU seconds from now (:meth:`cpu_since_mark`)."""
        self.sample()
        self._marked = dict(self._cpu)

    def cpu_since_mark(self) -> float:
        """CPU seconds (user + system) of the descendant processes since :meth:`mark`."""
        self.sample()
        return sum(c - self._marked.get(p, 0.0) for p, c in self._cpu.items())


def _cpu_s(pid: int) -> Optional[float]:
    """User + system CPU seconds of ``pid`` (``/proc/<pid>/stat``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def measure(workload: str, path: str, mode: str, phase: str, steps: int, eval_limit: int,
            num_cpus: Optional[int], epochs: int = 2) -> Dict[str, float]:
    """One measurement in this process (see the module docstring); a dict of figures."""
    import ray
    import ray.data

    t_start = time.time()
    sampler = RaySampler()
    sampler.start()
    from pipelines.cluster import WORKER_POOL_CONFIG, headless_kwargs

    tmp = tempfile.mkdtemp(prefix="bench_input_scale_")
    exp, cfg = _config(workload, path, mode, steps, eval_limit, tmp, epochs)
    ray.init(num_cpus=num_cpus, log_to_driver=False, _system_config=dict(WORKER_POOL_CONFIG), **headless_kwargs())
    out: Dict[str, float] = {}
    try:
        if phase == "input":
            from pipelines.data.background import EpochHead, read_head
            from pipelines.seeding import seed_all
            from pipelines.data.feed import declare_feed, train_dataset_name
            from pipelines.cluster import configure_ray_data

            configure_ray_data(cfg)
            seed_all(int(cfg["seed"]))
            t0 = time.perf_counter()
            splits = exp.read_splits(cfg)
            n = {s: src.n for s, src in splits.sources.items()}
            out["read_s"] = time.perf_counter() - t0
            rows = sum(n.values()) + splits.skipped.total
            out["records"] = float(n["train"])
            out["parsed_per_s"] = rows / out["read_s"]
            t0 = time.perf_counter()
            declared = declare_feed(exp, cfg, splits, 2)
            out["trace_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            heads = [b for b in declared.background if isinstance(b, EpochHead)]
            if heads:       # epoch 1's first steps come from the head builders (pipelines.data.background)
                next(read_head(heads[0].refs[0]))
            else:
                next(iter(declared.datasets[train_dataset_name(1, 0)].iter_rows()))
            out["first_batch_s"] = time.perf_counter() - t0
            if epochs > 1:
                t0 = time.perf_counter()
                next(iter(declared.datasets[train_dataset_name(2, 0)].iter_rows()))
                out["e2_first_batch_s"] = time.perf_counter() - t0
        else:
            from pipelines.training.run import run as train_run

            t_run = time.time()
            res = train_run(exp, cfg)
            hist = [h for h in res.history if "time/first_step_unix" in h]
            out["first_step_s"] = hist[0]["time/first_step_unix"] - t_run
            out["wait_share"] = hist[0]["time/steady_wait_share"]
            if len(hist) > 1:
                out["e2_first_wait_s"] = hist[1]["time/first_wait_s"]
    finally:
        sampler.stop.set()
        sampler.join()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    out["driver_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out["ray_rss_mb"] = sampler.max_kb / 1024.0
    out["ray_anon_mb"] = sampler.max_anon_kb / 1024.0
    out["ray_anon_proc"] = sampler.max_anon_proc
    out["wall_s"] = time.time() - t_start
    return out


# ---------------------------------------------------------------------------- driver

def _child(args: dict, timeout: float) -> Dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.input_scale", "--child", json.dumps(args)]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"measurement {args} failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run(workloads: Sequence[str] = WORKLOADS, ks: Sequence[int] = (1, 5, 20), modes: Sequence[str] = ("streaming",),
        phases: Sequence[str] = ("input", "train"), steps: int = 20, eval_limit: int = 250,
        base_rows: Optional[int] = None, num_cpus: Optional[int] = None, data_dir: Optional[str] = None,
        epochs: int = 2,
        work_dir: Optional[str] = None, timeout: float = 3600, mlflow: bool = True, log=echo) -> List[Dict]:
    """Measure every (workload, k, mode, phase) in its own process; print the table and the
    ratios of the largest ``k`` to the smallest; log both to MLflow (experiment
    ``bench_input_scale``).  Returns the rows (the ratios rows last, ``phase == "ratio"``)."""
    for w in workloads:
        if w not in WORKLOADS:
            raise ValueError(f"unknown workload {w!r}; expected one of {WORKLOADS}")
    for m in modes:
        if m != "streaming":
            raise ValueError(f"unknown mode {m!r}; expected streaming (the driver path is gone)")
    data_dir = data_dir or os.environ.get("FOLD_DATA_DIR")
    if not data_dir:
        raise ValueError("pass data_dir or set FOLD_DATA_DIR")
    ks = sorted(set(int(k) for k in ks))
    own = work_dir is None
    work_dir = work_dir or tempfile.mkdtemp(prefix="bench_input_scale_")
    rows: List[Dict] = []
    try:
        for w in workloads:
            for k in ks:
                path = make_corpus(w, k, work_dir, data_dir, base_rows)
                for mode in modes:
                    for phase in phases:
                        args = dict(workload=w, path=path, mode=mode, phase=phase, steps=steps,
                                    eval_limit=eval_limit, num_cpus=num_cpus, epochs=epochs)
                        r = {"workload": w, "k": k, "mode": mode, "phase": phase, **_child(args, timeout)}
                        rows.append(r)
                        log(format_table([r], [c for c in COLUMNS if c in r]))
                if own:
                    os.remove(path)
    finally:
        if own:
            for f in os.listdir(work_dir):
                os.remove(os.path.join(work_dir, f))
            os.rmdir(work_dir)
    ratios = []
    lo, hi = ks[0], ks[-1]
    for w in workloads:
        for mode in modes:
            for phase in phases:
                a = next((r for r in rows if (r["workload"], r["k"], r["mode"], r["phase"]) == (w, lo, mode, phase)), None)
                b = next((r for r in rows if (r["workload"], r["k"], r["mode"], r["phase"]) == (w, hi, mode, phase)), None)
                if a is None or b is None:
                    continue
                q = {"workload": w, "k": f"{hi}/{lo}", "mode": mode, "phase": phase,
                     "driver_rss_delta_mb": b["driver_rss_mb"] - a["driver_rss_mb"],
                     "ray_rss_ratio": b["ray_rss_mb"] / max(a["ray_rss_mb"], 1e-9),
                     "ray_anon_ratio": b["ray_anon_mb"] / max(a["ray_anon_mb"], 1e-9)}
                if phase == "train":
                    q["first_step_ratio"] = b["first_step_s"] / max(a["first_step_s"], 1e-9)
                    q["wait_share_at_max_k"] = b["wait_share"]
                else:
                    q["parsed_per_s_ratio"] = b["parsed_per_s"] / max(a["parsed_per_s"], 1e-9)
                ratios.append(q)
    log("\nall measurements:\n" + format_table(rows, [c for c in COLUMNS if any(c in r for r in rows)]))
    if ratios:
        cols = ["workload", "k", "mode", "phase", "driver_rss_delta_mb", "ray_rss_ratio", "ray_anon_ratio",
                "first_step_ratio",
                "wait_share_at_max_k", "parsed_per_s_ratio"]
        log(f"\nk={hi} vs k={lo} (goals: driver RSS delta <= 100 MB, first step ratio <= 1.5, "
            "wait share < 0.1):\n" + format_table(ratios, [c for c in cols if any(c in q for q in ratios)]))
    if mlflow:
        metrics = {}
        for r in rows:
            for key, v in r.items():
                if isinstance(v, float):
                    metrics[f"{r['workload']}/k{r['k']}/{r['mode']}/{r['phase']}/{key}"] = v
        for q in ratios:
            for key, v in q.items():
                if isinstance(v, float):
                    metrics[f"{q['workload']}/ratio/{q['mode']}/{q['phase']}/{key}"] = v
        params = dict(workloads=",".join(workloads), ks=",".join(map(str, ks)), modes=",".join(modes),
                      phases=",".join(phases), steps=steps, epochs=epochs, eval_limit=eval_limit, base_rows=base_rows,
                      num_cpus=num_cpus, **git_state())
        run_id = log_to_mlflow("bench_input_scale", params, {"measurements": rows, "ratios": ratios}, metrics,
                               run_name="input_scale")
        log(f"MLflow run {run_id}")
    return rows + [dict(q, phase="ratio:" + q["phase"]) for q in ratios]


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":   # one measurement, in a child process of run()
        print("RESULT " + json.dumps(measure(**json.loads(argv[1]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.input_scale",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS), type=_csv(str))
    ap.add_argument("--ks", default="1,5,20", type=_csv(int))
    ap.add_argument("--modes", default="streaming", type=_csv(str))
    ap.add_argument("--phases", default="input,train", type=_csv(str))
    ap.add_argument("--steps", type=int, default=20, help="training steps of the short run")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the short run (1: no trace pass, "
                    "no epoch-2 wait; for large k where the pass takes long)")
    ap.add_argument("--eval-limit", type=int, default=250, help="SST dev/test trees evaluated")
    ap.add_argument("--base-rows", type=int, default=None, help="repeat only the first N rows (quick runs)")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of each local Ray (default: all)")
    ap.add_argument("--data-dir", default=None, help="default: $FOLD_DATA_DIR")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
