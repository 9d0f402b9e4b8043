"""The trace cache lives in memory only: no folder is read, listed, pruned or written.

Issue 22 found the earlier disk cache pruning users' ``*.json`` files and resolving a
crafted entry to ``os.system``. The disk layer is gone; these tests prove it stays gone:
a process that traces twice (a cache hit) with every cache-like variable pointed at a
folder of 300 user JSON files and a crafted entry touches nothing in it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]

WATCHED = textwrap.dedent("""
    import os, sys
    folder = sys.argv[1]
    touched = []
    def audit(event, args):
        if any(isinstance(a, (str, bytes, os.PathLike)) and os.fsdecode(a).startswith(folder)
               for a in args):
            touched.append(event)
    sys.addaudithook(audit)
    from introspect.cli.main import main
    codes = [main(["trace", "--model", "bert-tiny", "--format", "csv", "-o", os.devnull])
             for _ in range(2)]
    from introspect.tracing import cache as tc
    print(codes, sorted(set(touched)), tc.enabled())
""")


def test_tracing_twice_touches_no_file_of_a_folder_named_as_a_cache(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    for i in range(300):
        (folder / f"user-{i:03d}.json").write_text(json.dumps({"n": i}))
    marker = tmp_path / "executed"
    crafted = {"module": "torch", "qualname": "os.system", "args": [f"touch {marker}"],
               "graph": "os.system", "target": "os.system"}
    (folder / ("0" * 64 + ".json")).write_text(json.dumps(crafted))
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "INTROSPECT_CACHE_DIR": str(folder), "XDG_CACHE_HOME": str(folder)}
    env.pop("INTROSPECT_NO_CACHE", None)
    run = subprocess.run([sys.executable, "-c", WATCHED, str(folder)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[0, 0] [] True"  # both traces ran, nothing was touched
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}
    assert after == before and len(after) == 301
    assert not marker.exists()


def test_the_cache_module_has_no_file_operation():
    source = (ROOT / "introspect" / "tracing" / "cache.py").read_text()
    tree = ast.parse(source)
    called = {node.func.attr if isinstance(node.func, ast.Attribute) else
              getattr(node.func, "id", "") for node in ast.walk(tree)
              if isinstance(node, ast.Call)}
    io = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "unlink", "remove",
          "rename", "replace", "glob", "iterdir", "scandir", "listdir", "rmtree", "mkdir",
          "makedirs", "import_module", "loads", "load", "__import__"}
    assert called & io == set()
    assert "INTROSPECT_CACHE_DIR" not in source
