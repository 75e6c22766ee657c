"""The ``hotloop`` command: parses arguments and dispatches to each subcommand's ``run``."""

from __future__ import annotations

import argparse
import importlib
import sys

from hotloop import __version__

# Each module has add_parser(subparsers); imports stay light until a command runs.
_SUBCOMMANDS = ["serve", "chat", "lite", "bench", "plan", "check_env"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotloop", description="hotloop: serve and run LLMs.")
    parser.add_argument("--version", action="version", version=f"hotloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        module = importlib.import_module(f"hotloop.cli.{name}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        code = 130
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"hotloop {args.command}: error: {e}", file=sys.stderr)
        code = 1
    sys.exit(code or 0)
