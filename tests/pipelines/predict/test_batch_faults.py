"""``python -m pipelines.predict`` against what goes wrong around it: two runs into one
``--output`` (the second refused at once while the first writes, the first's rows alone in the
folder)."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from pipelines.model.package import write_package
from pipelines.predict import batch as predict
from tests.pipelines.helpers import sst_lines, untrained_sst

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def model_dir(data_dir, tmp_path_factory):
    exp, cfg, mc, model, _ = untrained_sst(data_dir)
    root = tmp_path_factory.mktemp("predict-model") / "model"
    write_package(str(root / "artifacts" / "package"), exp, cfg, mc, model.state_dict())
    return str(root)


def _command(model_dir, inputs, output, *extra):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen([sys.executable, "-m", "pipelines.predict", "--model", model_dir, "--input", str(inputs),
                             "--output", str(output), "--no-tracking", "--actors", "1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.mark.fault
def test_a_second_run_into_the_same_output_is_refused_while_the_first_writes(model_dir, data_dir, tmp_path):
    lines = sst_lines(data_dir, 30)
    a, b, out = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "out"
    a.write_text("\n".join(lines[i % 30] for i in range(1000)) + "\n")
    b.write_text("\n".join(lines[:7]) + "\n")
    first = _command(model_dir, a, out)
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(out / predict.LOCK_FILE):     # the first holds the folder
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = _command(model_dir, b, out, "--overwrite")
        said, _ = second.communicate(timeout=300)
        assert first.poll() is None, "the first run ended before the second was refused: no overlap tested"
        assert second.returncode == 1, said
        assert f"pipelines.predict: {out}: another pipelines.predict (pid {first.pid}) is writing into it" in said, said
        said_first, _ = first.communicate(timeout=500)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, said_first
    assert "predicted 1000 rows" in said_first, said_first
    got = pd.concat([pd.read_parquet(f) for f in glob.glob(str(out / "part-*.parquet"))])
    assert len(got) == 1000 and set(got["path"]) == {str(a)}
    assert not os.path.exists(out / predict.LOCK_FILE)
    third = _command(model_dir, b, out)                          # after it: the earlier-output check
    said, _ = third.communicate(timeout=300)
    assert third.returncode == 1 and "holds the output of an earlier run" in said, said


def test_a_directory_or_a_symlink_loop_as_input_is_named_as_such(tmp_path):
    """--input naming a directory or a symbolic link that leads nowhere says which, not "missing"."""
    from pipelines.predict.batch import resolve_inputs

    (tmp_path / "trees").mkdir()
    with pytest.raises(FileNotFoundError, match=r"trees: a directory, not an input file.*trees/\*\.txt"):
        resolve_inputs([str(tmp_path / "trees")])
    loop = tmp_path / "loop.txt"
    loop.symlink_to(loop)
    with pytest.raises(FileNotFoundError, match=r"loop.txt: a symbolic link that leads to no file"):
        resolve_inputs([str(loop)])
    with pytest.raises(FileNotFoundError, match=r"nope.txt: missing"):
        resolve_inputs([str(tmp_path / "nope.txt")])
