"""The ``hotloop`` command: parses arguments and dispatches to each subcommand's ``run``."""

from __future__ import annotations

import argparse
import importlib
import re
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
    except (ValueError, OSError, RuntimeError) as e:  # (OSError: an unreadable file, a full disk ...)
        print(
            f"hotloop {args.command}: error: {name_the_flag(str(e), _option_flags(parser, args))}",
            file=sys.stderr,
        )
        code = 1
    sys.exit(code or 0)


def _option_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """Destination -> flag of the options of the (sub)command that ``args`` came from."""
    flags: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest or "", None)
            if chosen in action.choices:
                flags.update(_option_flags(action.choices[chosen], args))
        elif action.option_strings:
            longs = [o for o in action.option_strings if o.startswith("--")]
            flags[action.dest] = (longs or action.option_strings)[0]
    return flags


_FIELD = re.compile(r"([a-z][a-z0-9_]*)=")


def name_the_flag(message: str, flags: dict[str, str]) -> str:
    """``tp=0 must be ...`` (a config field's words) -> ``--tp 0 must be ...``: the flag the user typed,
    when the message starts with a field of this command's options."""
    m = _FIELD.match(message)
    if m is None or m.group(1) not in flags:
        return message
    return f"{flags[m.group(1)]} {message[m.end() :]}"
