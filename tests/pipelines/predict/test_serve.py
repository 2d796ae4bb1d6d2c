"""The Ray Serve deployment on a real local Ray: concurrent requests with good and bad rows are
batched together and each gets exactly the rows the model's predictor gives for its own inputs
(the predictor the pyfunc model wraps), as strict JSON; oversized and malformed requests are
refused with 413 / 400 and the replica keeps answering."""
from __future__ import annotations

import concurrent.futures
import json
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest

from pipelines.model.package import write_package
from pipelines.model.stored import PackageFiles
from tests.pipelines.helpers import sst_lines, untrained_sst
from tests.pipelines.mlflow_server import unused_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BAD_TREE = "(3 (2 unbalanced) (3 tree)"


def _strict(name):
    raise ValueError(f"not strict JSON: {name}")


def _post(url, doc, raw: bytes = None):
    body = raw if raw is not None else json.dumps(doc).encode()
    req = urllib.request.Request(url + "/invocations", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read(), parse_constant=_strict)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def served(ray_cluster, data_dir, tmp_path_factory):
    from ray import serve

    from pipelines.predict.serve import ServeSettings, start

    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    pkg = tmp_path_factory.mktemp("serve") / "package"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    files = PackageFiles((pkg / "package.json").read_bytes(), (pkg / "weights.pt").read_bytes(), str(pkg))
    settings = ServeSettings(max_batch_size=16, batch_wait_s=0.05, max_request_bytes=20_000, max_rows=50)
    url = start(files, settings, port=unused_port(), cpus_per_replica=0.5)
    yield url, files.predictor(), sst_lines(data_dir, 40)
    serve.shutdown()


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(served):
    url, predictor, lines = served
    requests = [[lines[i % 40], lines[(3 * i) % 40]] + ([BAD_TREE] if i % 3 == 0 else []) for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda inputs: _post(url, {"dataframe_records": [{"tree": t} for t in inputs]}),
                                requests))
    for inputs, (status, body) in zip(requests, answers):
        assert status == 200, body
        got = pd.DataFrame(body["predictions"])
        want = predictor.predict(inputs)
        assert len(got) == len(inputs)
        assert [p["label"] for p in body["predictions"]] == [None if pd.isna(v) else int(v) for v in want["label"]]
        np.testing.assert_allclose(got["prob_3"].to_numpy(dtype=float), want["prob_3"].to_numpy(dtype=float),
                                   rtol=1e-5, atol=1e-6)
        bad = [t == BAD_TREE for t in inputs]
        assert [p["error"] is not None for p in body["predictions"]] == bad
        assert all(body["predictions"][k]["prob_0"] is None for k, b in enumerate(bad) if b)
    with urllib.request.urlopen(url + "/stats", timeout=30) as r:
        stats = json.loads(r.read())
    assert stats["requests"] >= 24 and stats["batches"] < stats["requests"], stats


def test_the_mlflow_request_formats_are_accepted(served):
    url, predictor, lines = served
    want = predictor.predict(lines[:2])["prob_1"].tolist()
    for doc in ({"dataframe_split": {"columns": ["tree"], "data": [[lines[0]], [lines[1]]]}},
                {"inputs": {"tree": lines[:2]}}, {"inputs": lines[:2]}, {"instances": lines[:2]}):
        status, body = _post(url, doc)
        assert status == 200, body
        np.testing.assert_allclose([p["prob_1"] for p in body["predictions"]], want, rtol=1e-5)


def test_oversized_and_malformed_requests_are_refused_and_the_replica_keeps_answering(served):
    url, predictor, lines = served
    status, body = _post(url, None, raw=b"{" + b" " * 30_000 + b"}")
    assert status == 413 and "over the limit of 20000" in body["message"]
    status, body = _post(url, {"inputs": [lines[0]] * 51})
    assert status == 400 and "51 rows in one request > the limit of 50" in body["message"]
    status, body = _post(url, None, raw=b"not json")
    assert status == 400 and "not JSON" in body["message"]
    status, body = _post(url, {"dataframe_records": [{"a": 1, "b": 2}]})
    assert status == 400 and "no column 'tree'" in body["message"]
    status, body = _post(url, {"inputs": ["(2 " * 2000 + "(2 a)" + ")" * 2000]})       # deep: a row error
    assert status == 200 and body["predictions"][0]["error"].startswith("InputTooLarge")
    status, body = _post(url, {"inputs": [lines[0]]})
    assert status == 200 and body["predictions"][0]["error"] is None
