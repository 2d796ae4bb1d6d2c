"""benchmarks.serve pins the MLflow workers' torch to one intra-op thread (issue 68)."""
import subprocess
import sys

from benchmarks.serve import mlflow_worker_env


def test_a_process_started_with_the_worker_env_runs_torch_on_one_thread():
    env = mlflow_worker_env(base={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "8"})
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1" and env["PATH"] == "/usr/bin:/bin"
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "1"
    two = mlflow_worker_env(2, base={})
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=two,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "2"
