"""`introspect diff --candidate PORT`: a user's port given as file.py:NAME or module:NAME.

The port is examples/ci/my_port.py, a BERT written without introspect.scratch; these
tests run it through the CLI as a CI job would, healthy and with a fault injected.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from introspect.cli.main import main
from tests import launch
from tests.refusals import shows

EXAMPLE_PORT = Path(__file__).resolve().parents[2] / "examples" / "ci" / "my_port.py"


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_port_file_spec_passes(capsys):
    assert main(["diff", "--model", "bert-tiny", "--candidate", f"{EXAMPLE_PORT}:build"]) == 0
    out = capsys.readouterr().out
    assert f"{EXAMPLE_PORT}:build vs hf BertModel" in out
    assert "parity holds (max abs error 0;" in out


def test_port_module_spec_passes_from_the_users_repository(tmp_path, monkeypatch, capsys):
    package = tmp_path / "my_repo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "port.py").write_text(EXAMPLE_PORT.read_text())
    monkeypatch.chdir(tmp_path)  # the module is found from the working folder, as `python -m`
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["diff", "--model", "bert-tiny", "--candidate", "my_repo.port:build", "-q"]) == 0
    assert "parity holds" in capsys.readouterr().out


def test_a_fault_in_the_port_fails_at_the_right_node(tmp_path, capsys):
    faulty = tmp_path / "faulty_port.py"
    faulty.write_text(textwrap.dedent(f"""
        import importlib.util
        import torch

        spec = importlib.util.spec_from_file_location("my_port", {str(EXAMPLE_PORT)!r})
        my_port = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(my_port)

        def build(reference):
            model = my_port.build(reference)
            model.blocks[1].act = torch.nn.GELU(approximate="tanh")  # the bug
            return model
    """))
    assert main(["diff", "--model", "bert-tiny", "--candidate", f"{faulty}:build", "-q"]) == 1
    out = capsys.readouterr().out
    assert "parity FAILS" in out
    assert "first divergence: encoder_layer_1_intermediate_intermediate_act_fn" in out
    assert "tanh approximation of GELU" in out


def test_port_as_the_reference(capsys):
    argv = ["diff", "--model", "bert-tiny", "--reference", f"{EXAMPLE_PORT}:build",
            "--candidate", "hf", "-q"]
    assert main(argv) == 0
    assert f"hf BertModel (bert-tiny, sdpa) vs {EXAMPLE_PORT}:build" in capsys.readouterr().out


BAD_PORTS = {
    "missing.py:build": "no such file 'missing.py'",
    "{dir}/port.py:nothing": "has no attribute 'nothing'",
    "{dir}/port.py:NOT_CALLABLE": "NOT_CALLABLE is a int, not a callable",
    "{dir}/port.py:returns_a_dict": "returned a dict, not a torch.nn.Module",
    "{dir}/port.py:raises": "raised RuntimeError: my port cannot load layer 7",
    "{dir}/broken.py:build": "failed to import: SyntaxError",
    "no_such_package.port:build": "no module named 'no_such_package.port'",
    "nonsense": "expected hf, scratch, a checkpoint folder",
}


@pytest.fixture
def port_dir(tmp_path):
    (tmp_path / "port.py").write_text(textwrap.dedent("""
        NOT_CALLABLE = 3

        def returns_a_dict(reference):
            return {"model": reference.model}

        def raises(reference):
            raise RuntimeError("my port cannot load layer 7\\nmore detail")
    """))
    (tmp_path / "broken.py").write_text("def build(:\n")
    return tmp_path


@pytest.mark.parametrize("spec, message", BAD_PORTS.items(), ids=list(BAD_PORTS))
def test_bad_port_is_one_line_exit_2_naming_the_spec(spec, message, port_dir, tmp_path, capsys):
    spec = spec.format(dir=port_dir)
    out = tmp_path / "report"
    assert main(["diff", "--model", "bert-tiny", "-q", "--candidate", spec,
                 "--out", str(out)]) == 2
    line = only_line(capsys.readouterr().err)
    assert message in line and len(line) < 200
    assert shows(spec, line) or spec == "nonsense" and "'nonsense'" in line
    assert not out.exists()


def test_bad_port_through_the_real_cli_has_no_traceback(tmp_path):
    done = launch.run([sys.executable, "-m", "introspect", "diff", "--model", "bert-tiny",
                       "-q", "--candidate", f"{tmp_path}/none.py:build"],
                      capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert "no such file" in only_line(done.stderr) and "Traceback" not in done.stderr


def test_options_that_do_not_apply_to_a_port_are_refused(capsys):
    argv = ["diff", "--model", "bert-tiny", "-q", "--candidate", f"{EXAMPLE_PORT}:build",
            "--candidate-attn", "eager"]
    assert main(argv) == 2
    assert "--candidate-attn works with --candidate hf or scratch" in only_line(
        capsys.readouterr().err)
