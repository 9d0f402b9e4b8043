"""introspect: see inside a HuggingFace BERT, draw it, and diff two implementations.

Exit codes: 0 ok / parity holds, 1 parity fails, 2 bad usage or bad input.
Set INTROSPECT_DEBUG=1 to see the full traceback of an error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from introspect.cli.version import VersionAction
from introspect.errors import IntrospectError

# Subcommand name -> module; each module's docstring is its --help text and it defines
# add_arguments(parser) and run(args) -> exit code.
COMMANDS = {
    "trace": "introspect.cli.trace_cmd",
    "draw": "introspect.cli.draw_cmd",
    "diff": "introspect.cli.diff_cmd",
    "attention": "introspect.cli.attention_cmd",
    "capture": "introspect.cli.capture_cmd",
    "examples": "introspect.cli.examples_cmd",
    "completion": "introspect.cli.completion_cmd",
}

EXIT_OK, EXIT_PARITY_FAILS, EXIT_BAD_INPUT = 0, 1, 2


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; a user error here is one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="introspect", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        doc = module.__doc__ or ""
        sub = commands.add_parser(name, help=doc.strip().splitlines()[0], description=doc,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is None and "_ARGCOMPLETE" in os.environ:  # Tab in a shell: answer and exit
        from introspect.cli.completion_cmd import complete

        complete(parser)
    args = parser.parse_args(argv)
    if args.command is None:  # usage and one line on stderr, as for any other usage error
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"introspect: error: give a command ({', '.join(COMMANDS)}); "
                         "see 'introspect --help'\n")
        return EXIT_BAD_INPUT
    from introspect import files

    written_before = files.written_count()
    try:
        code = int(args.run(args))
        files.flush_stdout()  # `> /dev/full` fails here, not in Python's exit
        return code
    except (IntrospectError, OSError) as e:
        if os.environ.get("INTROSPECT_DEBUG"):
            raise
        # an OSError is a file-system error no check foresaw (stdout full or closed, say)
        message = files.describe_failure(e) if isinstance(e, OSError) else str(e)
        if files.written_since(written_before):  # a later output failed: say what is done
            message += f" ({files.describe_written(written_before)})"
        sys.stderr.write(f"introspect {args.command}: error: {message}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        done = files.describe_written(written_before)
        sys.stderr.write(f"introspect {args.command}: interrupted; {done}\n")
        return 130
    except BaseException as e:  # SystemExit from user code that slipped past ports.port_code
        if os.environ.get("INTROSPECT_DEBUG"):
            raise
        what = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) \
            else f"raised {type(e).__name__}"
        sys.stderr.write(f"introspect {args.command}: error: code it ran {what}; "
                         "no verdict\n")
        return EXIT_BAD_INPUT
