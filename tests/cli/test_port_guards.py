"""A port cannot harm the run: `introspect diff --candidate PORT` with ports that misbehave.

The ports live in tests/cli/port_files/: builders that change the reference they are given
(a weight by one bit, a module, a hook, a forward, a class, the config), that exit or raise
what is not an Exception in their import, build or forward, two files both named port.py,
and a port that keeps tensors on itself. Each misdeed is one line on stderr and exit 2.
"""

from __future__ import annotations

import collections
import copy
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from introspect.cli.main import main
from introspect.models.ports import fingerprint, port_module_name, resolve_builder, what_changed
from tests import launch
from tests.refusals import shows

PORTS = Path(__file__).resolve().parent / "port_files"


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def diff(spec: str, *options: str) -> list[str]:
    return ["diff", "--model", "bert-tiny", "-q", "--candidate", spec, *options]


# --- The reference is fingerprinted around build ----------------------------------------

HARMS = {
    "scales_a_weight": "changed the reference: encoder.layer.0.attention.self.query.weight ",
    "nudges_one_element": "changed the reference: encoder.layer.1.output.dense.weight ",
    "changes_a_buffer": "changed the reference: embeddings.position_ids ",
    "replaces_a_module": "encoder.layer.1.intermediate (replaced by a BertIntermediate) (",
    "adds_a_hook": "encoder.layer.0.output (a forward hook added)",
    "adds_a_pre_hook": "encoder.layer.0 (a forward pre-hook added)",
    "swaps_a_forward": "encoder.layer.0.intermediate.dense.forward (swapped on the instance)",
    "patches_a_class": "BertIntermediate.forward (patched on the class)",
    "adds_a_global_hook": "torch's global forward hooks",
    "changes_eps": "embeddings.LayerNorm.eps (1e-12 -> 1e-05)",
    "changes_the_config": "config.output_hidden_states (False -> True)",
    "trains_the_reference": "BertModel (put in training mode, with every module inside it",
    "casts_the_reference": "embeddings.word_embeddings.weight (float32 -> float64) and 38 more",
}


@pytest.fixture
def undo_global_changes(monkeypatch):
    """The class patch and the global hook a harmful port makes, undone after the test."""
    from transformers.models.bert.modeling_bert import BertIntermediate

    monkeypatch.setattr(BertIntermediate, "forward", BertIntermediate.forward)
    monkeypatch.setattr(torch.nn.modules.module, "_global_forward_hooks",
                        collections.OrderedDict())


@pytest.mark.parametrize("builder, message", HARMS.items(), ids=list(HARMS))
def test_a_build_that_changes_the_reference_is_exit_2_naming_what(builder, message, tmp_path,
                                                                   capsys, undo_global_changes):
    spec = f"{PORTS / 'harms.py'}:{builder}"
    out = tmp_path / "report"
    assert main(diff(spec, "--out", str(out))) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("introspect diff: error: the port's build changed the reference: ")
    assert message in line and shows(spec, line) and len(line) < 200
    assert not out.exists()


def test_a_build_that_only_reads_the_reference_passes(capsys):
    """Deep-copying it, running it, calling .eval() on it: nothing changed, no refusal."""
    assert main(diff(f"{PORTS / 'harms.py'}:only_reads")) == 0
    assert "parity holds" in capsys.readouterr().out


def test_a_forward_that_changes_the_reference_is_exit_2(capsys):
    assert main(diff(f"{PORTS / 'harms.py'}:forward_changes_the_reference")) == 2
    assert only_line(capsys.readouterr().err) == (
        "introspect diff: error: the port's forward changed the reference while the diff ran "
        "it (no verdict): encoder.layer.0.attention.self.query.weight")


def test_a_port_sharing_the_references_weights_passes_until_a_cast_would_change_them(capsys):
    spec = f"{PORTS / 'harms.py'}:shares_a_weight"
    assert main(diff(spec)) == 0
    capsys.readouterr()
    assert main(diff(spec, "--candidate-dtype", "bfloat16")) == 2
    line = only_line(capsys.readouterr().err)
    assert "--candidate-dtype bfloat16 cast the reference too" in line
    assert "encoder.layer.0.attention.self.query.weight (float32 -> bfloat16)" in line


def test_fingerprint_sees_one_bit_and_nothing_else(tiny_models):
    model = copy.deepcopy(tiny_models().model)
    model.embeddings.LayerNorm.custom = float("nan")  # a NaN attribute equals itself
    before = fingerprint(model)
    assert what_changed(before, fingerprint(model)) == []
    weight = model.encoder.layer[1].attention.output.dense.weight
    with torch.no_grad():
        old = weight[0, 0].clone()
        weight[0, 0] = torch.nextafter(old, torch.tensor(float("inf")))
    assert what_changed(before, fingerprint(model)) == [
        "encoder.layer.1.attention.output.dense.weight"]
    with torch.no_grad():
        weight[0, 0] = old
    assert what_changed(before, fingerprint(model)) == []


# --- What a port raises beyond Exception is exit 2, never 0 ------------------------------

STOPS = {
    "exits.py:exits_0": "called sys.exit(0) in its build; no verdict",
    "exits.py:exits_none": "called sys.exit(None) in its build; no verdict",
    "exits.py:interrupts": "raised KeyboardInterrupt in its build; no verdict",
    "exits.py:raises_a_base_exception": "raised Stop: unwinding in its build; no verdict",
    "exits.py:forward_exits_0": "called sys.exit(0) in its forward, while the diff ran it",
    "exits.py:forward_interrupts": "raised KeyboardInterrupt in its forward, while the diff",
    "exits.py:forward_raises_a_base_exception": "raised Stop: unwinding in its forward",
    "exits_on_import.py:build": "called sys.exit(0) while it was imported; no verdict",
    "interrupts_on_import.py:build": "raised KeyboardInterrupt while it was imported",
}


@pytest.mark.parametrize("spec, message", STOPS.items(), ids=list(STOPS))
def test_a_port_that_exits_or_raises_a_base_exception_is_exit_2(spec, message, capsys):
    spec = str(PORTS / spec)
    assert main(diff(spec)) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("introspect diff: error: port '") and shows(spec, line)
    assert message in line and len(line) < 200


def test_with_two_ports_the_one_that_exits_is_named(capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "ci" / "my_port.py"
    exiting = f"{PORTS / 'exits.py'}:forward_exits_0"
    assert main(["diff", "--model", "bert-tiny", "-q", "--reference", f"{example}:build",
                 "--candidate", exiting]) == 2
    line = only_line(capsys.readouterr().err)
    assert shows(exiting, line) and "' called sys.exit(0) in its forward" in line


def test_a_module_port_that_exits_on_import_is_exit_2(tmp_path, monkeypatch, capsys):
    package = tmp_path / "exiting_repo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "port.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(diff("exiting_repo.port:build")) == 2
    assert "port 'exiting_repo.port:build' called sys.exit(0) while it was imported" in \
        only_line(capsys.readouterr().err)


def test_a_real_ctrl_c_during_the_build_is_an_interrupt(capsys):
    """SIGINT from outside is the user's wish: 130, as anywhere else in the CLI."""
    assert main(diff(f"{PORTS / 'exits.py'}:gets_ctrl_c")) == 130
    assert only_line(capsys.readouterr().err).startswith("introspect diff: interrupted")


def test_a_system_exit_that_escapes_the_port_guard_is_still_exit_2(monkeypatch, capsys):
    import introspect.cli.diff_cmd as diff_cmd

    def exits(*args, **kwargs):
        sys.exit(0)

    monkeypatch.setattr(diff_cmd, "compute_diff", exits)
    assert main(["diff", "--model", "bert-tiny", "-q"]) == 2
    assert only_line(capsys.readouterr().err) == (
        "introspect diff: error: code it ran called sys.exit(0); no verdict")


@pytest.mark.parametrize("builder", ["exits_0", "forward_exits_0"])
def test_sys_exit_0_through_the_real_cli_exits_2(builder):
    done = launch.run([sys.executable, "-m", "introspect", *diff(
        f"{PORTS / 'exits.py'}:{builder}")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert "called sys.exit(0)" in only_line(done.stderr)


# --- Each port file under its own name ----------------------------------------------------

def test_two_files_named_port_py_each_run_their_own_code(capsys):
    """a/port.py and b/port.py, each with its own helpers.py: exact and tanh GELU."""
    first, second = PORTS / "a" / "port.py", PORTS / "b" / "port.py"
    assert main(diff(f"{first}:build")) == 0
    assert main(diff(f"{second}:build")) == 1
    assert "tanh approximation of GELU" in capsys.readouterr().out
    assert main(diff(f"{first}:build")) == 0  # and back: nothing of b stayed behind


def test_port_module_names_follow_the_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    first, second = PORTS / "a" / "port.py", PORTS / "b" / "port.py"
    resolve_builder(f"{first}:build")
    resolve_builder(f"{second}:build")
    names = port_module_name(first), port_module_name(second)
    assert names[0] != names[1] and all(n.startswith("_introspect_port_port_") for n in names)
    assert sys.modules[names[0]].FOLDER == "a" and sys.modules[names[1]].FOLDER == "b"
    assert sys.modules[names[0]].make_act is not sys.modules[names[1]].make_act


# --- Tensors kept on a module while tracing -----------------------------------------------

def test_a_port_keeping_tensors_on_itself_traces_twice_and_runs(tiny_models):
    import introspect
    from introspect.models.load import tokenize
    from introspect.models.ports import LoadedReference
    from introspect.tracing.tracer import trace_module

    loaded = tiny_models()
    build = resolve_builder(f"{PORTS / 'stores_tensors.py'}:build")
    port = build(LoadedReference(loaded.model, loaded.model.config, None, loaded.tokenizer,
                                 "bert-tiny", "base", "sdpa"))
    inputs = tokenize(loaded.tokenizer, ("I love cats!", "He hates pineapple pizza."))
    for _ in range(2):
        introspect.trace(port, inputs)
        trace_module(port, inputs.tensors, fast=False, cache=False)
        for block in port.blocks:
            assert block.last is None and block.history == {}  # as before the trace
            assert "Proxy" not in repr(vars(block))
    copy.deepcopy(port)
    with torch.no_grad():
        out = port(**inputs.tensors)
    assert torch.equal(port.blocks[-1].last, out["last_hidden_state"])


def test_a_port_keeping_tensors_on_itself_diffs_twice(capsys):
    spec = f"{PORTS / 'stores_tensors.py'}:build"
    assert main(diff(spec)) == 0
    assert main(diff(spec)) == 0
    assert capsys.readouterr().out.count("parity holds") == 2


def test_the_guards_say_nothing_of_a_healthy_port(capsys):
    """The example port through every guard: still exit 0, nothing on stderr."""
    example = Path(__file__).resolve().parents[2] / "examples" / "ci" / "my_port.py"
    assert main(diff(f"{example}:build")) == 0
    assert capsys.readouterr().err == ""


def test_without_a_port_nothing_is_guarded():
    from introspect.models.ports import port_code

    with pytest.raises(KeyboardInterrupt), port_code([], "in its forward"):
        raise KeyboardInterrupt


def test_debug_shows_the_port_s_own_exit(monkeypatch):
    monkeypatch.setenv("INTROSPECT_DEBUG", "1")
    with pytest.raises(SystemExit) as raised:
        main(diff(f"{PORTS / 'exits.py'}:exits_0"))
    assert raised.value.code == 0


def test_an_import_that_exits_leaves_no_module_behind(tmp_path):
    port = tmp_path / "port.py"
    port.write_text(textwrap.dedent("""
        import sys
        sys.exit(3)
    """))
    from introspect.errors import InputError

    with pytest.raises(InputError, match=r"called sys.exit\(3\) while it was imported"):
        resolve_builder(f"{port}:build")
    assert port_module_name(port) not in sys.modules


def test_a_trace_that_fails_still_puts_the_attributes_back():
    """The Proxy is stored, then a data-dependent branch stops fx: nothing stays behind."""
    from introspect.errors import TraceError
    from introspect.tracing.tracer import trace_module

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)
            self.inner.seen = "nothing yet"

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            x = self.inner(input_ids.float())
            self.inner.seen = x
            self.kept = x
            if bool(x.sum() > 0):  # fx cannot decide this
                return x
            return -x

    model = Branchy()
    with pytest.raises(TraceError):
        trace_module(model, {"input_ids": torch.ones(2, 4, dtype=torch.long)}, fast=False,
                     cache=False)
    assert model.inner.seen == "nothing yet" and "kept" not in vars(model)


def test_a_port_that_exits_against_a_capture_is_exit_2(tmp_path, capsys):
    capture = tmp_path / "ref.safetensors"
    assert main(["capture", "--model", "bert-tiny", "-q", "-o", str(capture)]) == 0
    spec = f"{PORTS / 'exits.py'}:forward_exits_0"
    assert main(diff(spec, "--reference-dump", str(capture))) == 2
    line = only_line(capsys.readouterr().err)
    assert shows(spec, line) and "' called sys.exit(0) in its forward, while the capture ran it" \
        in line
