"""``python -m pipelines.predict.serve`` under hostile load, on its own local Ray on loopback
(direct ingress, as the docs run it): clients that send headers and part of a body, then go
silent, more of them than the replica has request slots, get 408 and free their slots while good
requests beside them are answered with the right rows; an idle connection is closed."""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from pipelines.model.package import write_package
from pipelines.model.stored import download_package
from tests.pipelines.helpers import sst_lines, untrained_sst, read_until
from tests.pipelines.mlflow_server import unused_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

#: the replica's request slots (``max_ongoing_requests`` of :func:`pipelines.predict.serve.build_app`
#: at the default batch size 32): the slow clients outnumber them
SLOTS = 128
BODY_TIMEOUT_S = 3
IDLE_TIMEOUT_S = 2


class Server:
    """The running serve command: its process, base URL, port and the predictor it serves."""

    def __init__(self, proc, url, port, predictor, lines, banner):
        self.proc, self.url, self.port, self.predictor, self.lines, self.banner = proc, url, port, predictor, lines, banner


def post(url, body: bytes, timeout: float = 300):
    req = urllib.request.Request(url + "/invocations", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def records(trees) -> bytes:
    return json.dumps({"dataframe_records": [{"tree": t} for t in trees]}).encode()


def assert_rows(predictor, trees, body):
    want = predictor.predict(trees)["prob_2"].to_numpy(dtype=float)
    got = [np.nan if p["prob_2"] is None else p["prob_2"] for p in body["predictions"]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def start_server(data_dir, tmp_path, *extra: str) -> Server:
    exp, cfg, mc, model, _ = untrained_sst(data_dir)
    pkg = tmp_path / "model" / "artifacts" / "package"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    predictor = download_package(str(tmp_path / "model")).predictor()
    port = unused_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.predict.serve", "--model", str(tmp_path / "model"),
                             "--port", str(port), "--cpus-per-replica", "0.5", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    banner = read_until(proc, "stops it", 300)
    return Server(proc, f"http://127.0.0.1:{port}", port, predictor, sst_lines(data_dir, 30), banner)


def stop_server(server: Server, sig=signal.SIGINT) -> str:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, sig)
    try:
        rest, _ = server.proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        rest, _ = server.proc.communicate()
    return rest


@pytest.fixture(scope="module")
def server(data_dir, tmp_path_factory):
    s = start_server(data_dir, tmp_path_factory.mktemp("serve-faults"), "--body-timeout-s", str(BODY_TIMEOUT_S),
                     "--idle-timeout-s", str(IDLE_TIMEOUT_S))
    yield s
    stop_server(s)


def _slow_client(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    s.sendall(b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 999999\r\n\r\n{\"dataframe_records\": [{\"tree\": \"(2 ")
    return s


def _answer(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = s.recv(65536)
        if not piece:
            break
        data += piece
    return data


@pytest.mark.fault
def test_slow_clients_beyond_the_request_slots_get_408_and_good_requests_are_answered(server):
    slow = [_slow_client(server.port) for _ in range(SLOTS + 12)]
    try:
        time.sleep(0.5)                        # they hold their slots before the good requests come
        good = [[server.lines[i % 30], server.lines[(7 * i) % 30]] for i in range(16)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda trees: post(server.url, records(trees)), good))
        for trees, (status, body) in zip(good, answers):
            assert status == 200, body
            assert_rows(server.predictor, trees, body)
        heads = [_answer(s) for s in slow]
    finally:
        for s in slow:
            s.close()
    statuses = [h.split(b" ", 2)[1] if h.startswith(b"HTTP/1.1 ") else h[:40] for h in heads]
    assert statuses == [b"408"] * len(slow), statuses
    body = heads[0].split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in heads[0] else b""
    assert b"did not arrive within" in body or not body


@pytest.mark.fault
def test_an_idle_connection_is_closed_after_the_idle_timeout(server):
    """After its answer, a keep-alive connection left idle is closed by the server (the read
    ends with b"" instead of the socket's 60 s timeout: the hang guard, and below Ray Serve's default keep-alive of 90 s)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            data += piece
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"ok\n"), data


def _balanced_tree(leaves: int, words: list) -> str:
    """A PTB tree of ``leaves`` leaves and ``2 * leaves - 1`` nodes, balanced."""
    count = [0]

    def build(n):
        if n == 1:
            count[0] += 1
            return f"(2 {words[count[0] % len(words)]})"
        return f"(2 {build(n // 2)} {build(n - n // 2)})"
    return build(leaves)


def _stats(url) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=300) as r:
        return json.loads(r.read())


def test_ping_and_small_requests_are_answered_while_heavy_requests_are_in_flight(server):
    """Four requests of 60 trees of 1,023 nodes (the size cap) each: while the replica still works
    on them (its ``in_flight`` count), ``/ping`` and a one-tree request are answered, the latter
    with its row; then the heavy ones are answered with theirs."""
    words = [w for line in server.lines for w in line.replace("(", " ").replace(")", " ").split() if not w.isdigit()]
    heavy = [[_balanced_tree(512, words[k:])] * 60 for k in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post, server.url, records(trees)) for trees in heavy]
        deadline = time.monotonic() + 300
        while _stats(server.url)["in_flight"] < len(heavy):      # all four read and waiting on the engine
            assert not any(f.done() for f in futures), [f.result() for f in futures if f.done()]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with urllib.request.urlopen(server.url + "/ping", timeout=300) as r:
            assert r.read() == b"ok\n"
        status, body = post(server.url, records(server.lines[:1]))
        assert status == 200, body
        assert_rows(server.predictor, server.lines[:1], body)
        assert _stats(server.url)["in_flight"] >= 1 and not all(f.done() for f in futures)
        for trees, f in zip(heavy, futures):
            status, body = f.result()
            assert status == 200, body
            assert [p["error"] for p in body["predictions"]] == [None] * len(trees)
            assert_rows(server.predictor, trees[:1], {"predictions": body["predictions"][:1]})


def test_sigterm_stops_the_server_as_ctrl_c_does(data_dir, tmp_path):
    """A supervisor's stop (SIGTERM to the command's process alone, not its group): the server
    answers no more, the command says it stopped and exits 130, and the Ray it started goes with
    it (no process of its session is left)."""
    s = start_server(data_dir, tmp_path)
    assert "Ctrl-C or SIGTERM stops it" in s.banner
    s.proc.send_signal(signal.SIGTERM)
    try:
        rest, _ = s.proc.communicate(timeout=120)
    finally:
        stop_server(s)                        # (a no-op when it stopped)
    assert s.proc.returncode == 130 and "pipelines.predict.serve: stopped" in rest, rest
    deadline = time.monotonic() + 120
    while True:
        try:
            os.killpg(s.proc.pid, 0)          # any process left in the command's session?
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the server's session outlived it"
        time.sleep(1)
    with pytest.raises(OSError):
        urllib.request.urlopen(s.url + "/ping", timeout=5)
