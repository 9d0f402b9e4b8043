"""The README's and the documentation's code blocks, read as a user reads them.

- a command is each line of a ```sh block (comments left out) and the ``$ `` line of a
  ```text block; a line ending in ``\\`` continues on the next;
- an output block is a ```text block whose first line is ``$ COMMAND``: the lines under it
  are what COMMAND prints (stderr, then stdout), and a line ``...`` stands for any number
  of lines left out.

``run_documented`` runs commands in an empty folder, as a user would after
``introspect examples``; ``matches`` compares an output block with a real run. With
``INTROSPECT_UPDATE_DOCS=1``, ``update_outputs`` rewrites every output block that has no
``...`` from the real run (a block with ``...`` is reported, to be edited by hand).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests import launch
from tests.golden import same_but_rounding

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "PYPI.md",
         *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "PYPI.md")]
ELIDED = "..."
_BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


@dataclass(frozen=True)
class OutputBlock:
    page: Path
    command: str
    lines: tuple[str, ...]  # the output shown, "..." where lines are left out


def _joined(body: str) -> str:
    return re.sub(r" *\\\n *", " ", body)  # a command continued with \ is one command


def page_commands(page: Path) -> list[str]:
    """One page's commands, in order."""
    commands = []
    for lang, body in _BLOCK.findall(page.read_text(encoding="utf-8")):
        for line in _joined(body).splitlines():
            if lang == "sh":
                command = line.split(" #")[0].strip()
            elif lang == "text" and line.startswith("$ "):
                command = line[2:].strip()
            else:
                continue
            if command:
                commands.append(command)
    return commands


def documented_commands() -> list[tuple[Path, str]]:
    """Every page's commands: the README first, then the pages of docs/ by name."""
    return [(page, command) for page in PAGES for command in page_commands(page)]


def output_blocks(page: Path) -> list[OutputBlock]:
    blocks = []
    for lang, body in _BLOCK.findall(page.read_text(encoding="utf-8")):
        lines = _joined(body).splitlines() if lang == "text" else []
        if lines and lines[0].startswith("$ "):
            blocks.append(OutputBlock(page, lines[0][2:].strip(),
                                      tuple(line.rstrip() for line in lines[1:])))
    return blocks


def python_snippets(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def argv_and_env(command: str) -> tuple[list[str], dict[str, str]]:
    """``VAR=x introspect ...`` or ``python ...`` as an argv for this interpreter and the
    variables set in front of it."""
    words = shlex.split(command)
    extra = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
    words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
    if words[0] == "introspect":
        return [sys.executable, "-m", "introspect", *words[1:]], extra
    assert words[0] == "python", command
    return [sys.executable, *words[1:]], extra


def run_documented(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv, extra = argv_and_env(command)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", **extra}
    env.pop("NO_COLOR", None)
    if "COLUMNS" not in extra:
        env.pop("COLUMNS", None)  # a pipe: the documented default width
    return launch.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def shown(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What a terminal shows of a run: notices (stderr) first, then the output."""
    return [line.rstrip() for line in (done.stderr + done.stdout).splitlines()]


def matches(expected: tuple[str, ...], actual: list[str]) -> bool:
    """``expected``'s lines appear in ``actual`` in order, ``...`` standing for any lines;
    without ``...`` at an end, that end is anchored. Lines are alike but for the last
    digits of floats, which follow the CPU's kernels (``golden.same_but_rounding``)."""
    parts: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == ELIDED:
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) == 1:
        return _alike(list(expected), actual)
    first, *middle, last = parts
    if not _alike(first, actual[:len(first)]):
        return False
    position = len(first)
    for part in middle:
        position = _find(part, actual, position)
        if position < 0:
            return False
        position += len(part)
    return not last or (len(actual) - len(last) >= position
                        and _alike(last, actual[-len(last):]))


def _alike(expected: list[str], actual: list[str]) -> bool:
    return len(expected) == len(actual) and all(
        same_but_rounding(a, b) for a, b in zip(expected, actual, strict=True))


def _find(part: list[str], actual: list[str], start: int) -> int:
    for i in range(start, len(actual) - len(part) + 1):
        if _alike(part, actual[i:i + len(part)]):
            return i
    return -1 if part else start


def update_outputs(runs: dict[str, subprocess.CompletedProcess[str]]) -> list[str]:
    """Rewrite each output block without ``...`` from its run; return the blocks that have
    ``...`` and no longer match (to be edited by hand)."""
    by_hand = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in output_blocks(page):
            actual = shown(runs[block.command])
            if matches(block.lines, actual):
                continue
            if any(line.strip() == ELIDED for line in block.lines):
                by_hand.append(f"{page.relative_to(ROOT)}: $ {block.command}")
                continue
            old = "\n".join(block.lines)
            start = text.index(f"$ {block.command}") if f"$ {block.command}" in text else None
            assert start is not None, block.command  # a command continued with \ differs
            head, tail = text[:start], text[start:]
            text = head + tail.replace(old, "\n".join(actual), 1)
        page.write_text(text, encoding="utf-8")
    return by_hand


def has_graphviz() -> bool:
    return shutil.which("dot") is not None
