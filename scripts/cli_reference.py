"""Regenerate the documentation's command-line reference (docs/cli.md) from the parser.

Run:  python scripts/cli_reference.py          # rewrite docs/cli.md in place
      python scripts/cli_reference.py --check  # exit 1 if it is stale

tests/test_readme.py runs the check, so the reference can never drift from the CLI: a new
command or option fails the suite until this script is run again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def reference_text() -> str:
    """The --help of `introspect` and of each subcommand, as Markdown code blocks."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; fix it for the file
    from introspect.cli.main import COMMANDS, build_parser

    parser = build_parser()
    sections = [("introspect --help", parser.format_help())]
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for name in COMMANDS:
        sections.append((f"introspect {name} --help",
                         subparsers.choices[name].format_help()))  # type: ignore[attr-defined]
    blocks = [f"## `{title.removesuffix(' --help')}`\n\n```text\n{text.rstrip()}\n```"
              for title, text in sections]
    return "\n\n".join(blocks)


def updated_page(page: str) -> str:
    if START not in page or END not in page:
        raise SystemExit(f"{PAGE} lacks the markers {START} ... {END}")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_text()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    current = PAGE.read_text(encoding="utf-8")
    fresh = updated_page(current)
    if "--check" in argv:
        if fresh != current:
            print("docs/cli.md is stale: run python scripts/cli_reference.py")
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
