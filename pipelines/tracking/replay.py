"""``python -m pipelines.tracking replay DIR [--uri URI]``: send the operations a run buffered in its
outbox (:mod:`pipelines.tracking.outbox`) while its tracking server was unreachable, in order.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from pipelines.tracking import outbox
from pipelines.tracking.store import client_for, resolve_uri

__all__ = ["replay_main"]


def replay_main(argv: Optional[list[str]] = None) -> int:
    """``python -m pipelines.tracking replay DIR [--uri URI]``: send an outbox's operations."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.tracking",
                                     description="Send the MLflow logging operations a run buffered while its "
                                                 "tracking server was unreachable.")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="send an outbox directory's operations, in order")
    rp.add_argument("path", help="the outbox directory the run's error named")
    rp.add_argument("--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.path):
        parser.error(f"{args.path}: no such outbox directory")
    uri = resolve_uri(args.uri)
    from pipelines.errors import entry_point

    with entry_point("python -m pipelines.tracking replay", argv,
                     interrupted="interrupted: what was sent is gone from the outbox; run the same command "
                                 "again to send the rest"):
        info = outbox.describe(args.path)
        sent = outbox.Outbox(args.path).replay(client_for(uri), wait=False)
    print(f"sent {sent} of {info['operations']} buffered operation(s) of run(s) {', '.join(info['runs'])} "
          f"to {uri}" + (f"; {info['foreign']} line(s) not written by the run were left untouched"
                         if info["foreign"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(replay_main())
