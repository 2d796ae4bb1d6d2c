"""The recursion limit raised while tracing (:mod:`foldengine.recursion`): two threads tracing
at once leave the interpreter's limit as it was, and neither lowers it under the other."""
from __future__ import annotations

import sys
import threading

import torch

import foldengine as fe
from foldengine import blocks as fb
from foldengine.recursion import raised_recursion_limit


def test_nested_and_overlapping_callers_restore_the_limit_the_first_one_saved():
    before = sys.getrecursionlimit()
    a, b = raised_recursion_limit(before + 3000), raised_recursion_limit(before + 1000)
    a.__enter__()
    b.__enter__()
    assert sys.getrecursionlimit() == before + 3000
    a.__exit__(None, None, None)                  # the first one leaves while the second is inside
    assert sys.getrecursionlimit() == before + 1000
    b.__exit__(None, None, None)
    assert sys.getrecursionlimit() == before


def _paused_compiler(entered: threading.Event, release: threading.Event) -> fe.Compiler:
    def pause(x):
        entered.set()
        assert release.wait(60)
        return x
    return fe.Compiler(fb.InputTransform(pause) >> fb.Scalar(), scheduler="depth")


def test_two_threads_tracing_at_once_leave_the_limit_as_it_was_and_never_lower_it_under_each_other():
    """Thread A starts tracing, then B; A finishes while B still traces; then B finishes.  Saving
    and restoring per tracer would drop the limit to the default under B, then leave it at A's
    raised value for good."""
    before = sys.getrecursionlimit()
    ev = {k: threading.Event() for k in ("a_in", "a_go", "b_in", "b_go")}
    seen, errors = {}, []

    def trace(name, compiler):
        try:
            compiler.build_batch([1.0])
            seen[name] = sys.getrecursionlimit()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    ta = threading.Thread(target=trace, args=("a", _paused_compiler(ev["a_in"], ev["a_go"])))
    tb = threading.Thread(target=trace, args=("b", _paused_compiler(ev["b_in"], ev["b_go"])))
    ta.start()
    assert ev["a_in"].wait(60)
    tb.start()
    assert ev["b_in"].wait(60)
    ev["a_go"].set()
    ta.join(60)
    assert sys.getrecursionlimit() > before        # B is still tracing: still raised
    ev["b_go"].set()
    tb.join(60)
    assert not errors, errors
    assert sys.getrecursionlimit() == before


def test_the_front_end_and_the_compiler_share_one_count():
    before = sys.getrecursionlimit()
    entered, release = threading.Event(), threading.Event()
    compiler = _paused_compiler(entered, release)
    t = threading.Thread(target=compiler.build_batch, args=([1.0],))
    t.start()
    assert entered.wait(60)
    lin = torch.nn.Linear(2, 2)
    model = fe.batched(lambda x: lin(fe.tensor(x)), modules=lin)
    model.build_batch([[1.0, 2.0]])               # enters and leaves while the compiler traces
    assert sys.getrecursionlimit() > before
    release.set()
    t.join(60)
    assert sys.getrecursionlimit() == before
