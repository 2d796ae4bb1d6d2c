"""benchmarks.peer_process: the pipe between a benchmark and a peer library's own process."""
from __future__ import annotations

import io

import pytest

from benchmarks import peer_process


def test_messages_round_trip_and_the_loop_answers_each_request():
    requests = io.BytesIO()
    for req in [("add", 2, 3), ("fail",), ("nope",), ("quit",), ("add", 1, 1)]:
        peer_process.send(requests, req)
    requests.seek(0)
    replies = io.BytesIO()

    def fail():
        raise KeyError("x")
    peer_process.serve_loop({"add": lambda a, b: a + b, "fail": fail}, requests, replies)
    replies.seek(0)
    got = []
    while True:
        try:
            got.append(peer_process.receive(replies))
        except EOFError:
            break
    # the request after quit is never read
    assert got == [5, ("error", "KeyError: 'x'"), ("error", "ValueError: unknown request 'nope'"), None]


def test_a_peer_that_ends_is_named():
    """A peer process that is gone (here a module without a serving loop, which exits at once):
    the call says which peer ended and with what exit code."""
    p = peer_process.PeerProcess("benchmarks.peer_process", name="test peer")
    p.proc.wait(timeout=60)
    with pytest.raises(peer_process.PeerError, match=r"the test peer process ended \(exit code 0\)"):
        p.call("anything")
    p.close()
