"""The public API as a user sees it: dir() lists it, and type checkers see real signatures
(the package loads lazily, so without TYPE_CHECKING imports they would see Any)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import introspect

ROOT = Path(__file__).resolve().parents[1]
API = {"trace", "diff", "load_model", "tokenize", "IntrospectGraph", "DiffResult", "scratch",
       "render", "testing", "__version__", "LoadedModel", "TokenizedInputs", "Divergence",
       "HeadParity", "AttentionMaps", "attention"}


def test_dir_lists_the_api_before_it_is_loaded():
    code = "import introspect; print(' '.join(dir(introspect)))"
    names = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True, cwd=ROOT).stdout.split())
    assert API <= names


def test_every_listed_name_resolves():
    for name in introspect.__all__:
        assert getattr(introspect, name) is not None, name


def test_the_tracer_package_does_not_hide_the_trace_function():
    # A fresh process, the package imported before the function is looked up. Under the
    # package's old name (introspect/trace/) the first line failed: ``introspect.trace``
    # is the function, which has no attribute ``cache``.
    code = ("import introspect.tracing.cache as c\n"
            "import introspect\n"
            "from introspect.graph import trace\n"
            "assert callable(c.why_uncacheable)\n"
            "assert introspect.trace is trace, introspect.trace\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert not (ROOT / "introspect" / "trace").exists()  # no package left to shadow it


@pytest.mark.slow
def test_mypy_sees_the_real_signature_of_diff(tmp_path):
    pytest.importorskip("mypy")
    user = tmp_path / "user_code.py"
    user.write_text(textwrap.dedent("""
        import introspect

        loaded = introspect.load_model("bert-tiny")
        inputs = introspect.tokenize(loaded.tokenizer)
        result = introspect.diff(loaded.model, loaded.model, inputs, atoll=1e-5)
        reveal_type(result)
    """))
    from tests.test_packaging import MYPY_INI

    (tmp_path / "mypy.ini").write_text(MYPY_INI)  # torch & co. skipped: seconds, not minutes
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           str(tmp_path / "mypy.ini"), "--no-error-summary",
                           "--cache-dir", str(tmp_path / "cache"), str(user)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert 'Unexpected keyword argument "atoll" for "diff"' in done.stdout, done.stdout
    assert "Revealed type is" in done.stdout and "DiffResult" in done.stdout


def test_all_names_the_lazy_api():
    assert set(introspect.__all__) == {"__version__", *introspect._LAZY_API,
                                       *introspect._LAZY_SUBMODULES}


@pytest.mark.slow
def test_the_readmes_python_type_checks(tmp_path):
    pytest.importorskip("mypy")
    readme = (ROOT / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert snippets and "compare_heads" in "".join(snippets)
    user = tmp_path / "readme_python.py"
    user.write_text("\n".join(snippets) + "\nreveal_type(parity)\nreveal_type(loaded)\n")
    from tests.test_packaging import MYPY_INI

    (tmp_path / "mypy.ini").write_text(MYPY_INI)  # torch & co. skipped: seconds, not minutes
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           str(tmp_path / "mypy.ini"), "--no-error-summary", "--cache-dir",
                           str(tmp_path / "cache"), str(user)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [], done.stdout
    assert 'Revealed type is "introspect.attention.heads.HeadParity"' in done.stdout, done.stdout
    assert 'Revealed type is "introspect.models.load.LoadedModel"' in done.stdout, done.stdout


def test_the_result_types_are_public():
    from introspect.attention.heads import HeadParity
    from introspect.diff.records import Divergence
    from introspect.models.load import LoadedModel, TokenizedInputs

    assert (introspect.LoadedModel, introspect.TokenizedInputs, introspect.Divergence,
            introspect.HeadParity) == (LoadedModel, TokenizedInputs, Divergence, HeadParity)
    assert callable(introspect.attention)
    assert introspect.attention.compare_heads.__name__ == "compare_heads"


def test_the_typed_view_of_attention_has_the_real_signatures():
    import inspect

    from introspect.attention.heads import compare_heads
    from introspect.attention.maps import attention

    typed = introspect._AttentionPackage
    assert str(inspect.signature(typed.compare_heads)) == str(inspect.signature(compare_heads))
    assert str(inspect.signature(typed.attention)) == str(inspect.signature(attention))
    call = str(inspect.signature(typed.__call__)).replace("(self, ", "(")
    assert call == str(inspect.signature(attention))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npx") is None, reason="pyright runs through npx (Node.js)")
def test_the_readmes_python_type_checks_under_pyright(tmp_path):
    """pyright infers nothing from an installed package's code it cannot find: the
    README's Python, against this interpreter's install (the Makefile's strict editable
    one, or a wheel), resolves ``introspect`` and its public types."""
    readme = (ROOT / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, re.S)
    user = tmp_path / "readme_python.py"
    user.write_text("\n".join(snippets) + "\nreveal_type(parity)\nreveal_type(loaded)\n")
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the snippets run from a checkout
    (tmp_path / "pyrightconfig.json").write_text('{"typeCheckingMode": "basic"}')
    done = subprocess.run(["npx", "--yes", "pyright@1.1.389", "--pythonpath", sys.executable,
                           str(user)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert re.search(r"^0 errors", done.stdout, re.M), done.stdout + done.stderr
    assert 'Type of "parity" is "HeadParity"' in done.stdout, done.stdout
    assert 'Type of "loaded" is "LoadedModel"' in done.stdout, done.stdout
