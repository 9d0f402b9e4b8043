"""The reports under ``reports/`` (linked from the README) are what ``make demo`` writes
now: each is written again here, with the demo's own arguments, and compared byte for byte
(text: but for the last digits of floats, which follow the CPU's kernels).

A change to a table, a legend or a drawing that leaves the stored reports behind fails here;
``make demo`` rewrites them.
"""

from __future__ import annotations

import re
from pathlib import Path

from introspect.cli.main import main
from tests.golden import same_but_rounding

ROOT = Path(__file__).resolve().parents[1]


def _demo_commands() -> dict[str, list[str]]:
    """The Makefile's demo commands that write the files compared here, by file."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    commands = {}
    for line in recipe.splitlines():
        found = re.match(r"\t\$\(BIN\)/introspect (trace|draw|diff) (.*)$", line)
        if found:
            words = [found.group(1), *found.group(2).split()]
            flag = "--out" if "--out" in words else "-o"
            commands[words[words.index(flag) + 1]] = words
    return commands


def test_the_stored_reports_are_what_the_demo_writes_now(tmp_path, monkeypatch):
    commands = _demo_commands()
    wanted = ["reports/minilm_nodes.csv", "reports/minilm_layers.csv", "reports/minilm.svg",
              "reports/diff"]
    assert set(wanted) <= set(commands), commands
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    for target in wanted:
        assert main(commands[target]) == 0, target
    written = [p for target in wanted for p in
               (sorted((tmp_path / target).iterdir()) if (tmp_path / target).is_dir()
                else [tmp_path / target])]
    stale = [str(p.relative_to(tmp_path)) for p in written
             if not _same(p.read_bytes(), (ROOT / p.relative_to(tmp_path)).read_bytes())]
    assert stale == [], f"run `make demo` and commit: {stale}"


def _same(written: bytes, stored: bytes) -> bool:
    """Byte for byte; or, for text, alike but for the last digits of floats that another
    CPU's kernels round otherwise (``golden.same_but_rounding``: words, statuses, counts
    and shapes still exact)."""
    if written == stored:
        return True
    try:
        return same_but_rounding(stored.decode("utf-8"), written.decode("utf-8"))
    except UnicodeDecodeError:
        return False
