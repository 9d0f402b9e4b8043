"""introspect: see inside a HuggingFace BERT, draw it, and diff two implementations.

Exit codes: 0 ok / parity holds, 1 parity fails, 2 bad usage or bad input.
Set INTROSPECT_DEBUG=1 to see the full traceback of an error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from introspect.cli.refusal import one_line
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
        sys.stderr.write(one_line(f"{self.prog}: error: {message} (see '{self.prog} --help')")
                         + "\n")
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
    """Run one command; its exit code. ``argv`` None: the process's own command line.

    Run as the process's command (``argv`` None), the run always ends: threads a port
    started and never ended are not waited for (the streams are flushed and the process
    ends with the command's code).
    """
    threads_before = set(threading.enumerate())
    code = _run(argv)
    if argv is None:
        _end_unless_waited_on(code, threads_before)
    return code


def _run(argv: Sequence[str] | None) -> int:
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
    from introspect.cli.options import check_numbers, quiet_libraries
    from introspect.models import guards, ports
    from introspect.run.spill import asked_hold_bytes

    written_before = files.written_count()
    ran_before = set(ports.RAN)
    try:
        files.check_lock_wait()  # before the slow part, not when the first file is written
        asked_hold_bytes()  # (INTROSPECT_HOLD_MIB read before any work too)
        check_numbers(args)
        # os._exit in code it runs: an exception, not an exit; -q: transformers quiet too
        with guards.exits_refused(), quiet_libraries(args):
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
        sys.stderr.write(one_line(f"introspect {args.command}: error: {message}") + "\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        done = files.describe_written(written_before)
        sys.stderr.write(one_line(f"introspect {args.command}: interrupted; {done}") + "\n")
        return 130
    except BaseException as e:  # user code's exit that slipped past ports.port_code, or a bug
        if os.environ.get("INTROSPECT_DEBUG"):
            raise
        sys.stderr.write(one_line(f"introspect {args.command}: error: "
                                  f"{_unexpected(e, sorted(set(ports.RAN) - ran_before))}")
                         + "\n")
        return EXIT_BAD_INPUT


def _raised_in_introspect(error: BaseException) -> bool:
    """Whether the innermost frame of ``error`` that is neither a library's nor Python's
    own is introspect's: a bug of ours met while the user's code ran (a hook, module
    evidence), not the user's code failing."""
    import sysconfig
    from pathlib import Path

    package = Path(__file__).resolve().parents[1]
    libraries = {Path(sysconfig.get_paths()[key]).resolve()
                 for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    innermost = None
    trace = error.__traceback__
    while trace is not None:
        path = Path(trace.tb_frame.f_code.co_filename)
        if path.is_absolute():
            resolved = path.resolve()
            if resolved.is_relative_to(package) or not any(
                    resolved.is_relative_to(library) for library in libraries):
                innermost = resolved
        trace = trace.tb_next
    return innermost is not None and innermost.is_relative_to(package)


def _unexpected(error: BaseException, user_code: list[str]) -> str:
    """One line for what no handler foresaw: user code's doing, or a bug of ours."""
    from introspect.models.guards import ProcessExitCalled

    if isinstance(error, ProcessExitCalled):
        what = f"called os._exit({error.code!r})"
    elif isinstance(error, SystemExit):
        what = f"called sys.exit({error.code!r})"
    else:
        text = " ".join(str(error).split())
        what = f"raised {type(error).__name__}" + (f": {text[:200]}" if text else "")
    if user_code and not _raised_in_introspect(error):
        return f"code it ran ({', '.join(user_code)}) {what}; no verdict"
    if isinstance(error, (SystemExit, ProcessExitCalled)):
        return f"code it ran {what}; no verdict"
    return (f"internal error: introspect {what}; no verdict (a bug: please report it, with "
            "the traceback INTROSPECT_DEBUG=1 shows)")


def _end_unless_waited_on(code: int, threads_before: set[threading.Thread]) -> None:
    """End the process with ``code`` now if a thread started during the run still runs.

    The interpreter would wait for such a thread at exit, forever for one that never ends.
    """
    from introspect.models.guards import linger, real_exit

    if not linger(threads_before):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or full stream: the code still says what happened
            pass
    from introspect import files

    files.remove_temps()
    real_exit(code)
