"""A peer library in its own process: length-prefixed pickled requests over a pipe.

A peer is measured at its best, which means in its own interpreter: DyNet's -ffast-math build
changes the floating-point environment of the process that loads it, and dgl/dgllife need a
torch of their own (``scripts/make_dgllife_venv.sh``).  The peer's module runs
``python -m benchmarks.<module> --serve``, a loop of :func:`serve_loop`; the benchmark's process
drives it through a :class:`PeerProcess`.  Every timed request answers with the peer process's
own wall and CPU seconds, so the figures are the peer's, not the pipe's.

Wire format: each message is an 8-byte little-endian length followed by a pickle.  A request
is a tuple ``(name, *args)``; the reply is the handler's return value, or ``("error", text)``.
The serving process's original standard output carries the replies; anything else the peer
prints there (DyNet prints notes at import) goes to standard error.
"""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

__all__ = ["send", "receive", "serve_loop", "reply_stream", "PeerProcess", "PeerError", "RemoteTimes"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PeerError(RuntimeError):
    """A request failed in the peer process (the message names the peer and its error)."""


def send(stream, obj) -> None:
    """Write one message (length, then pickle) and flush."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def receive(stream):
    """Read one message; ``EOFError`` when the other side closed the pipe."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the other process closed the pipe")
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(n))


def reply_stream():
    """The serving process's reply channel: a duplicate of file descriptor 1 (standard output),
    after which descriptor 1 points at standard error, so that C libraries printing to standard
    output cannot corrupt the replies.  Call it before importing the peer library."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return out


def serve_loop(handlers: Mapping[str, Callable], stdin=None, stdout=None) -> None:
    """Answer requests until ``("quit",)`` or end of input: ``handlers[name](*args)`` for each
    request ``(name, *args)``; an exception is answered ``("error", "Type: message")``."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    while True:
        try:
            req = receive(stdin)
        except EOFError:
            return
        if req[0] == "quit":
            send(stdout, None)
            return
        try:
            handler = handlers.get(req[0])
            if handler is None:
                raise ValueError(f"unknown request {req[0]!r}")
            reply = handler(*req[1:])
        except Exception as err:   # noqa: BLE001 - sent back, raised in the benchmark's process
            reply = ("error", f"{type(err).__name__}: {err}")
        send(stdout, reply)


class PeerProcess:
    """``python -m <module> --serve`` started with the repository on ``PYTHONPATH``.

    Args:
      module: the serving module (``benchmarks.dgllife_weave``).
      python: the peer's interpreter (default this one).
      name: the peer's name in error messages.
      env: extra environment variables (``None`` values are removed from the inherited ones).
    """

    def __init__(self, module: str, python: Optional[str] = None, name: str = "peer",
                 env: Optional[Mapping[str, Optional[str]]] = None, args: Sequence[str] = ()):
        self.name = name
        full = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        for k, v in (env or {}).items():
            if v is None:
                full.pop(k, None)
            else:
                full[k] = v
        self.proc = subprocess.Popen([python or sys.executable, "-m", module, "--serve", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT, env=full)

    def call(self, *request):
        """Send ``request``, return the reply; :class:`PeerError` for an error reply."""
        try:
            send(self.proc.stdin, request)
            reply = receive(self.proc.stdout)
        except (EOFError, BrokenPipeError) as err:
            self.proc.wait(timeout=30)
            raise PeerError(f"the {self.name} process ended (exit code {self.proc.poll()}); "
                            f"its standard error says why") from err
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            raise PeerError(f"the {self.name} process: {reply[1]}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("quit")
            except (EOFError, BrokenPipeError, OSError, PeerError):
                pass
            self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteTimes:
    """A timed column whose work runs in a peer process: each call of ``call()`` returns
    ``(wall_s, cpu_s, ...)`` measured there, kept in :attr:`walls` and :attr:`cpus`; a benchmark
    replaces the pipe-inclusive seconds its timer took with these (after its warm-up rounds)."""

    def __init__(self, call):
        self.call = call
        self.walls: list = []
        self.cpus: list = []

    def __call__(self) -> None:
        reply = self.call()
        self.walls.append(reply[0])
        self.cpus.append(reply[1])
