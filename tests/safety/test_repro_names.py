"""A repro program holds no names as code (issue 42, part 1): ``repro.py`` is run by whoever
receives it, so running it must be as safe as reading it.

The ports here are files of their own, written into a folder whose path holds ``\"\"\"``,
backslashes, ``\\N`` and ``\\U``; they import nothing from introspect. Their names carry a
payload that, pasted into source, would create the file ``PWNED`` in the current folder:
the --candidate spec (file and attribute), a module added with ``add_module``, a class's
``__qualname__``, a ``str`` subclass argument whose ``__repr__`` is code, and the
reference's --model folder. Each goes through the CLI and the API; the script is then
run alone, in a folder of its own, where importing introspect or transformers fails.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from introspect.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MY_PORT = ROOT / "examples" / "ci" / "my_port.py"
FAULTY_PORT = ROOT / "examples" / "ci" / "faulty_port.py"

# A name that, pasted into a docstring, runs open("PWNED", "w") (no "." for add_module, no
# ":" for the spec); paths and labels that, pasted into a string, stop it compiling.
PAYLOAD = 'p"""; open("PWNED", "w"); """'
FOLDER = 'C:\\Users\\U0001\\N{x}"""\nopen("PWNED", "w")\n#'
MODEL_FOLDER = 'bert"""\nopen("PWNED", "w")\n"""\\N'
EVIL_REPR = "'tanh'); open('PWNED', 'w'); print(end=''"  # gelu(x, approximate=<this>)

PORT = '''"""A port whose names are hostile (tests/safety/test_repro_names.py)."""
import importlib.util

import torch
from torch import nn

PAYLOAD = {payload!r}
KIND = {kind!r}
_spec = importlib.util.spec_from_file_location("my_port_for_names", {my_port!r})
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


class Evil(str):
    """A string argument whose repr is code."""

    def __repr__(self):
        return {evil!r}

    __str__ = __repr__


class Act(nn.GELU if KIND == "tanh" else nn.Threshold):
    """torch's own module (a leaf of the recording), under a hostile class name."""


Act.__module__ = "torch.nn.modules.activation"
Act.__qualname__ = PAYLOAD


class Wrap(nn.Module):
    def __init__(self, name, inner):
        super().__init__()
        self.name = name
        self.add_module(name, inner)

    def forward(self, x):
        return getattr(self, self.name)(x)


def act():
    if KIND == "tanh":
        module = Act()
        module.approximate = Evil("tanh")  # F.gelu(x, approximate=Evil("tanh"))
    else:
        module = Act(0.0, float("inf"))  # inf where the GELU is not: an inf figure
    return Wrap("act\\\\N", module)  # a backslash and an N, as a module's name


def build(reference):
    model = my_port.build(reference)
    model.blocks[1].act = Wrap(PAYLOAD, act())
    return model


globals()[PAYLOAD] = build
'''

EMBEDDING_PORT = '''"""A port whose word-embedding table is off by 1e-3 in half its features
(test_repro_names.py; all of them off alike would be a shift the LayerNorm takes out)."""
import importlib.util

import torch

_spec = importlib.util.spec_from_file_location("my_port_for_rows", {my_port!r})
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


def build(reference):
    model = my_port.build(reference)
    with torch.no_grad():
        model.embed.tok.weight[:, :64].add_(1e-3)
    return model
'''


def _write_port(folder: Path, name: str, kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    port = folder / name
    port.write_text(PORT.format(payload=PAYLOAD, kind=kind, my_port=str(MY_PORT),
                                evil=EVIL_REPR))
    return port


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tiny_models):
    """Two ports under a hostile folder (the tanh GELU, with a str-subclass argument; a
    threshold to inf), a bert-tiny checkpoint under a hostile folder name, and the repros
    the CLI and the API write for them."""
    import introspect

    base = tmp_path_factory.mktemp("names")
    folder = base / FOLDER
    ports = {"tanh": _write_port(folder, 'tanh"""\\N.py', "tanh"),
             "inf": _write_port(folder, 'inf"""\\U0001.py', "inf")}
    checkpoint = base / MODEL_FOLDER
    tiny_models("base", "sdpa").model.save_pretrained(checkpoint)
    runs: dict[tuple[str, str], tuple[int, Path]] = {}
    for kind, port in ports.items():
        repro = base / f"cli-{kind}"
        code = main(["diff", "--model", str(checkpoint), "--candidate", f"{port}:{PAYLOAD}",
                     "--repro", str(repro), "--quiet"])
        runs["cli", kind] = code, repro
        spec = importlib.util.spec_from_file_location(f"hostile_{kind}", port)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        loaded = introspect.load_model(str(checkpoint))
        result = introspect.diff(loaded.model, getattr(module, PAYLOAD)(loaded),
                                 introspect.tokenize(loaded.tokenizer))
        result.reference_label = f"{PAYLOAD} (a label)"
        result.candidate_label = module.Evil(PAYLOAD)  # a label that is no plain str
        repro = base / f"api-{kind}"
        result.write_repro(repro)
        runs["api", kind] = (1 if not result.passed else 0), repro
    plain = base / "plain"  # the same bug, plainly named, for the script's text
    assert main(["diff", "--model", "bert-tiny", "--candidate", f"{FAULTY_PORT}:build",
                 "--repro", str(plain), "--quiet"]) == 1
    return runs, plain, result


def _run_alone(script: Path, cwd: Path, *, audited: bool = False
               ) -> subprocess.CompletedProcess[str]:
    """``python repro.py`` in ``cwd``, where importing introspect or transformers fails.

    ``audited``: through an audit hook that stops the run at the first file it opens to
    write, process it starts, or code it compiles or runs besides the script itself."""
    blockers = cwd / "blocked"
    for name in ("introspect", "transformers"):
        (blockers / name).mkdir(parents=True, exist_ok=True)
        (blockers / name / "__init__.py").write_text(
            f"raise ImportError('the repro imported {name}')\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(blockers), "HOME": str(cwd)}
    command = [sys.executable, str(script)]
    if audited:
        command = [sys.executable, "-c", _AUDITED, str(script)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


_AUDITED = '''
import json, pathlib, runpy, sys
import torch, safetensors, safetensors.torch
script = sys.argv[1]
sys.argv = [script]
execs = []
def hook(event, args):
    if event == "open" and args[1] is not None and any(c in str(args[1]) for c in "wax+"):
        raise RuntimeError(f"the repro opened {args[0]!r} to write")
    if event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn",
                 "os.fork", "ctypes.dlopen"):
        raise RuntimeError(f"the repro ran {event}")
    if event == "exec":
        execs.append(args)
        if len(execs) > 1:
            raise RuntimeError("the repro ran code besides its own")
    if event == "compile" and args[1] not in (script, "<unknown>") and args[0] is not None:
        raise RuntimeError(f"the repro compiled {args[1]!r}")
sys.addaudithook(hook)
runpy.run_path(script, run_name="__main__")
'''

RUNS = [("cli", "tanh"), ("api", "tanh"), ("cli", "inf"), ("api", "inf")]


@pytest.mark.parametrize("surface, kind", RUNS)
def test_hostile_names_give_a_verdict_and_a_repro(hostile, surface, kind):
    runs, _, _ = hostile
    code, repro = runs[surface, kind]
    assert code == 1  # a verdict: the attention-head step too ran on the hostile names
    assert sorted(p.name for p in repro.iterdir()) == ["inputs.safetensors", "repro.py"]


@pytest.mark.parametrize("surface, kind", RUNS)
@pytest.mark.parametrize("audited", [False, True], ids=["plain", "audited"])
def test_the_script_runs_no_name_and_reproduces(hostile, surface, kind, audited, tmp_path):
    runs, _, _ = hostile
    moved = tmp_path / "attached"
    shutil.copytree(runs[surface, kind][1], moved)
    here = tmp_path / "here"
    here.mkdir()
    done = _run_alone(moved / "repro.py", here, audited=audited)
    assert not list(tmp_path.rglob("PWNED")), "a name ran as code"
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.isprintable() for line in lines)
    assert lines[0].startswith("reference: ") and lines[1].startswith("candidate: ")
    assert "PWNED" in lines[1]  # the names are there, as text: escaped, on one line each
    assert lines[2:4] == [
        "reference op, max abs error against its recorded output: 0 (bit-identical)",
        "candidate op, max abs error against its recorded output: 0 (bit-identical)"]
    if kind == "inf":
        assert "max abs difference inf (introspect measured inf)" in lines[4]
    assert lines[5] == "FAIL: the two ops part here"


def _about(repro: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(repro / "inputs.safetensors"), framework="pt") as stored:
        return json.loads(stored.metadata()["introspect.repro"])


@pytest.mark.parametrize("surface, kind", RUNS)
def test_no_string_of_the_program_holds_a_name(hostile, surface, kind):
    runs, _, _ = hostile
    repro = runs[surface, kind][1]
    text = (repro / "repro.py").read_text()
    tree = ast.parse(text)
    strings = [node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    for fragment in ("PWNED", "Users", "bert", "tanh\"\"\"", "p\"\"\"", "hostile"):
        assert not any(fragment in s for s in strings), fragment
    assert "PWNED" not in text and "Evil" not in text
    # what the model is named goes in as data, beside the tensors
    about = _about(repro)
    assert PAYLOAD in about["candidate"]["label"]
    assert (MODEL_FOLDER if surface == "cli" else PAYLOAD) in about["reference"]["label"]
    assert about["candidate"]["what"] == f"torch.nn.modules.activation.{PAYLOAD}"
    assert about["candidate"]["module"] == f"blocks.1.act.{PAYLOAD}.act\\N"
    if kind == "tanh":
        assert "approximate='tanh')" in text  # the str subclass, as the plain str it holds
    else:
        assert math.isinf(about["measured"])


def test_the_script_depends_only_on_the_ops(hostile):
    """The hostile tanh port and examples/ci/faulty_port.py run the same ops: one text."""
    runs, plain, _ = hostile
    text = (plain / "repro.py").read_text()
    assert (runs["cli", "tanh"][1] / "repro.py").read_text() == text
    assert (runs["api", "tanh"][1] / "repro.py").read_text() == text


@pytest.mark.parametrize("figure", [math.nan, math.inf, -math.inf])
def test_a_nan_or_inf_figure_is_a_value(hostile, figure, tmp_path):
    runs, _, result = hostile  # the inf port's, through the API
    result = dataclasses.replace(result, first_divergence=dataclasses.replace(
        result.first_divergence, local_max_abs_err=figure))
    result.write_repro(tmp_path / "repro")
    done = _run_alone(tmp_path / "repro" / "repro.py", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"(introspect measured {figure:.6g})" in done.stdout
    assert (tmp_path / "repro" / "repro.py").read_text() == \
        (runs["api", "inf"][1] / "repro.py").read_text()  # the figure is data, not text


def test_an_embedding_lookup_bundles_the_rows_it_reads(tmp_path):
    port = tmp_path / "embedding_port.py"
    port.write_text(EMBEDDING_PORT.format(my_port=str(MY_PORT)))
    repro = tmp_path / "repro"
    assert main(["diff", "--model", "bert-tiny", "--candidate", f"{port}:build",
                 "--repro", str(repro), "--quiet"]) == 1
    from safetensors import safe_open

    with safe_open(str(repro / "inputs.safetensors"), framework="pt") as stored:
        shapes = {key: stored.get_slice(key).get_shape() for key in stored.keys()}
    ids = shapes["reference.recorded_output"][:-1]
    tokens = math.prod(ids)
    tables = [shape for shape in shapes.values() if len(shape) == 2 and shape[-1] == 128]
    assert tables and all(rows <= tokens + 1 for rows, _ in tables)  # + the padding row
    read = 4 * 128 * (tokens + 1) * 2 + 4 * 128 * tokens * 2  # rows and outputs, each side
    size = (repro / "inputs.safetensors").stat().st_size
    assert size < 2 * read + 16_384, size  # the table is 30,522 rows: 15.6 MB a side
    done = _run_alone(repro / "repro.py", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[2:4] == [
        "reference op, max abs error against its recorded output: 0 (bit-identical)",
        "candidate op, max abs error against its recorded output: 0 (bit-identical)"]
