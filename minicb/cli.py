"""The ``minicb`` command: one console script, one module per subcommand in ``commands/``.

Each subcommand module defines ``register(subparsers)``, which adds its parser and sets
``func`` to the function that runs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ["generate", "replay", "serve", "demo", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minicb", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"minicb.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError) as err:  # clear errors, not tracebacks, for bad input
        print(f"minicb {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
