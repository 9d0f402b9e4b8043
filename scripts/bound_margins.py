"""Print the margin of every numeric bound the tests assert: bound over measured.

A bound read off one machine's result passes there and fails on the next CPU (issue 36:
a float64 gradient bound of 1e-9 met 1.02e-9 on an Intel Xeon). The tests assert their
bounds through ``tests/bounds.py``, which records each one with its margin when
``INTROSPECT_BOUND_LOG`` names a file; this script runs the tests that way and prints the
table, the smallest margins first, flagging those under ``--warn=X`` (3x by default).

Usage::

    python scripts/bound_margins.py                      # the tests marked numeric
    python scripts/bound_margins.py tests/diff -m ''     # any pytest selection
    INTROSPECT_BOUND_LOG=all.jsonl python scripts/bound_margins.py tests/a.py   # kept, added to
    ATEN_CPU_CAPABILITY=default python scripts/bound_margins.py   # another CPU path

For an upper bound (``< b``) the margin is ``b / measured``; for a fault that must show
(``> f``) it is ``measured / f``; for an allclose budget, the budget over the error at the
element nearest it. A margin under a few x means the bound is tuned, not derived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARGS = ["-m", "numeric"]


def run_tests(pytest_args: list[str], log: Path) -> int:
    """Run pytest with the bound log on; its exit code."""
    env = dict(os.environ, INTROSPECT_BOUND_LOG=str(log), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    return subprocess.call(command, cwd=ROOT, env=env)


def read_margins(log: Path) -> list[dict]:
    """The recorded bounds, one per (test, what, bound): the smallest margin of repeats."""
    worst: dict[tuple[str, str, str], dict] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        key = (row["test"], row["what"], row["bound"])
        if key not in worst or row["margin"] < worst[key]["margin"]:
            worst[key] = row
    return sorted(worst.values(), key=lambda r: r["margin"])


def table(rows: list[dict], warn: float) -> str:
    """The rows as aligned text, the tightest first."""
    lines = [f"{'margin':>9}  {'measured':>9}  {'bound':<32} test [what]"]
    for r in rows:
        flag = "  <-- tight" if r["margin"] < warn else ""
        what = f" [{r['what']}]" if r["what"] else ""
        lines.append(f"{r['margin']:>8.3g}x  {r['measured']:>9.3g}  {r['bound']:<32} "
                     f"{r['test']}{what}{flag}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Arguments go to pytest as they are (none: ``-m numeric``), but ``--warn=X``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    warn = 3.0
    for arg in [a for a in argv if a.startswith("--warn=")]:
        warn = float(arg.split("=", 1)[1])
        argv.remove(arg)
    with tempfile.TemporaryDirectory() as tmp:
        # INTROSPECT_BOUND_LOG set: that file is kept and added to (runs in parts, one table)
        log = Path(os.environ.get("INTROSPECT_BOUND_LOG") or Path(tmp) / "bounds.jsonl")
        log.touch()
        code = run_tests(argv or DEFAULT_ARGS, log)
        rows = read_margins(log)
    print(table(rows, warn))
    tight = sum(r["margin"] < warn for r in rows)
    print(f"{len(rows)} bounds, {tight} under {warn:g}x; pytest exit {code}")
    return code or int(tight > 0)


if __name__ == "__main__":
    sys.exit(main())
