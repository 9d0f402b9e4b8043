"""Regenerate the README's CLI reference from the commands' own --help.

Run:  python scripts/cli_reference.py          # rewrite README.md in place
      python scripts/cli_reference.py --check  # exit 1 if the README is stale

tests/test_readme.py runs the check, so the README can never drift from the CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
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
    blocks = [f"<details><summary><code>{title}</code></summary>\n\n```text\n{text.rstrip()}\n"
              "```\n\n</details>" for title, text in sections]
    return "\n\n".join(blocks)


def updated_readme(readme: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the markers {START} ... {END}")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_text()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    current = README.read_text()
    fresh = updated_readme(current)
    if "--check" in argv:
        if fresh != current:
            print("README.md's CLI reference is stale: run python scripts/cli_reference.py")
            return 1
        return 0
    README.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
