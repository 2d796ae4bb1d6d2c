"""One error path for every entry point (``pipelines.*.train``, ``pipelines.sweep``,
``pipelines.predict``, ``pipelines.tracking replay``): a failure the user can cause and fix (a bad
config key, a missing or unreadable file, a checkpoint that is not one, an unreachable tracking
store, a refused outbox) prints one line ``<command>: <what>: <why>; <what to do>`` on stderr and
exits with status 2; Ctrl-C prints one line and exits with 130.  ``--verbose`` (or
``verbose=true``) shows the traceback instead.  Anything else is a bug and keeps its traceback.

    with entry_point("pipelines.sst.train", argv):
        ...
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional, Sequence

__all__ = ["EXIT_USER_ERROR", "EXIT_INTERRUPTED", "user_error", "known_errors", "entry_point", "one_line"]

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130

_KNOWN: list = [FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError]


def user_error(cls: type) -> type:
    """Class decorator: ``cls`` is an error a user causes and fixes, whose message is the whole
    story (it names its input); :func:`entry_point` prints it as one line.  The modules that define
    such errors (config, checkpoint, tracking, outbox) register them here."""
    if cls not in _KNOWN:
        _KNOWN.append(cls)
    return cls


def known_errors() -> tuple[type, ...]:
    """The exception classes :func:`entry_point` reports as one line: the OS's file errors and
    every class registered with :func:`user_error`."""
    return tuple(_KNOWN)


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (its lines joined)."""
    text = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return text or type(err).__name__


def _verbose(argv: Optional[Sequence[str]]) -> bool:
    args = list(sys.argv[1:] if argv is None else argv)
    return any(a in ("--verbose", "-v", "verbose=true", "verbose=True") for a in args)


@contextlib.contextmanager
def entry_point(command: str, argv: Optional[Sequence[str]] = None,
                interrupted: str = "interrupted") -> Iterator[None]:
    """Run an entry point's body: a known error (:func:`known_errors`) becomes one line on stderr
    and ``SystemExit(2)``; ``KeyboardInterrupt`` one line (``interrupted``: what was kept and how
    to go on) and ``SystemExit(130)``; with ``--verbose`` in ``argv`` both propagate as they are."""
    verbose = _verbose(argv)
    try:
        yield
    except KeyboardInterrupt:
        if verbose:
            raise
        print(f"{command}: {interrupted}", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except known_errors() as err:
        if verbose:
            raise
        print(f"{command}: {one_line(err)}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
