"""The diff engine is the package ``introspect/diff/``; ``introspect.diff`` stays the function."""

from __future__ import annotations

import importlib
import subprocess
import sys


def test_importing_the_package_never_hides_the_function():
    # In a fresh interpreter: importing a module of the package first is the risky order.
    code = ("import introspect.diff.records, introspect.diff.ops.align\n"
            "import introspect\n"
            "from introspect.diff.api import diff\n"
            "from introspect.diff.ops import align\n"
            "assert introspect.diff is diff, introspect.diff\n"
            "assert align.align_graphs is not None\n"
            "assert introspect.DiffResult.__module__ == 'introspect.diff.result'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_function_first_then_the_package():
    import introspect

    function = introspect.diff
    importlib.import_module("introspect.diff.tables")
    assert introspect.diff is function
    assert callable(introspect.diff)
