"""The ``--trace FILE`` option, for every subcommand that runs a workload.

add_trace_option(parser)              # in register()
with traced(llm.engine, args):        # in run(), around the workload
    ...
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from typing import Any


def add_trace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        metavar="FILE",
        default=None,
        help="record every event to a JSONL trace (read it with `minicb replay FILE`)",
    )


def traced(engine: Any, args: argparse.Namespace, **header: Any) -> AbstractContextManager:
    """Record ``engine``'s events to ``args.trace`` while the block runs; nothing if unset."""
    from minicb.trace import record_trace

    return record_trace(
        engine, getattr(args, "trace", None), command=getattr(args, "command", None), **header
    )
