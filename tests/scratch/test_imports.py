"""The from-scratch BERT imports nothing from transformers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import introspect.scratch

SCRATCH_DIR = Path(introspect.scratch.__file__).parent


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_no_module_of_the_package_imports_transformers() -> None:
    files = sorted(SCRATCH_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "model.py", "config.py", "loading.py"}
    for path in files:
        offending = {m for m in imported_modules(path) if m.split(".")[0] == "transformers"}
        assert not offending, f"{path.name} imports {offending}"


def test_importing_and_running_the_package_loads_no_transformers() -> None:
    code = (
        "import sys, torch, introspect.scratch as s\n"
        "m = s.BertForMaskedLM(s.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,"
        " num_attention_heads=2, intermediate_size=16))\n"
        "m(input_ids=torch.ones(1, 3, dtype=torch.long))\n"
        "loaded = [n for n in sys.modules if n.split('.')[0] == 'transformers']\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=SCRATCH_DIR.parents[1])
