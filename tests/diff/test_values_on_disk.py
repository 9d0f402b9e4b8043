"""Past a budget, the values a plain call's hooks keep go to disk (``introspect.run.spill``)
and read back bit for bit, laid out as they were, two values of one memory still of one
memory; a diff judges the same with every value on disk as with every value held. Small
models of plain torch, written here."""

from __future__ import annotations

import gc
import importlib
import os
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

import introspect
from introspect.cli.main import main
from introspect.errors import InputError
from introspect.run import spill
from introspect.run.capture import capture_calls
from introspect.run.spill import Holding, Spilled, hold_budget
from introspect.run.truth import run_truth, same_view
from tests.ports.batch import port_batch


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(8, 12)
        self.act = torch.nn.GELU()
        self.last = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.first(x))
        a, b, c = h.split(4, dim=-1)  # three views of one memory
        return self.last(a) + self.last(b.transpose(0, 1).transpose(0, 1)) + c


def _stored(value: torch.Tensor) -> Spilled:
    holding = Holding(0)
    stored = holding.store(value, (0.0,))
    assert isinstance(stored, Spilled)
    holding.flush()
    return stored


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16, torch.int64, torch.bool])
def test_a_value_reads_back_bit_for_bit_as_it_was_laid_out(dtype):
    torch.manual_seed(1)
    whole = (torch.randn(6, 10) * 100).to(dtype)
    for value in (whole, whole.t(), whole[1:4, 2:7], whole[:, 3], whole[2:3].expand(5, 10)):
        read = _stored(value).load()
        assert read.dtype == value.dtype and read.shape == value.shape
        assert read.stride() == value.stride()
        assert read.storage_offset() == value.storage_offset()
        assert torch.equal(read.view(torch.uint8) if dtype == torch.bool else read,
                           value.view(torch.uint8) if dtype == torch.bool else value)


def test_negative_zero_and_nan_payloads_come_back_as_their_bits():
    value = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -1.5])
    value.view(torch.int32)[2] = 0x7FC00123  # a NaN with a payload
    read = _stored(value).load()
    assert torch.equal(read.view(torch.int32), value.view(torch.int32))


def test_every_value_on_disk_reads_back_as_the_values_held():
    model, x = _Net().eval(), torch.randn(3, 8)
    with capture_calls(model) as held:
        run_truth(model, {"x": x})
    with capture_calls(model, hold_bytes=0) as spilled:
        run_truth(model, {"x": x})
    assert [(c.name, c.mode) for c in held.calls] == [(c.name, c.mode) for c in spilled.calls]
    on_disk = 0
    for a, b in zip(held.calls, spilled.calls, strict=True):
        assert [leaf.path for leaf in a.inputs + a.outputs] == \
            [leaf.path for leaf in b.inputs + b.outputs]
        for x_leaf, y_leaf in zip(a.inputs + a.outputs, b.inputs + b.outputs, strict=True):
            on_disk += isinstance(y_leaf.held, Spilled)
            assert torch.equal(x_leaf.value, y_leaf.value)
            assert x_leaf.value.stride() == y_leaf.value.stride()
        assert all(torch.equal(p, q) for p, q in zip(a.args, b.args, strict=True))
    assert on_disk > 10


def test_values_of_one_memory_still_view_one_memory_when_read_back():
    model, x = _Net().eval(), torch.randn(3, 8)
    with capture_calls(model, hold_bytes=0) as calls:
        run_truth(model, {"x": x})
    act = next(c for c in calls.calls if c.name == "act" and c.mode == "autograd")
    lasts = [c for c in calls.calls if c.name == "last" and c.mode == "autograd"]
    out = act.outputs[0].value
    firsts = [c.inputs[0].value for c in lasts]  # views of the GELU's output
    assert all(f.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
               for f in firsts)
    # the next module's input is the output before it, read back: the same view
    first = next(c for c in calls.calls if c.name == "first" and c.mode == "autograd")
    assert same_view(first.outputs[0].value, act.inputs[0].value)


def test_a_spilled_value_is_what_the_module_returned_though_the_model_edits_it_later():
    class Edits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.inner(x)
            returned = y.clone()
            y.mul_(2.0)  # after the hook saw it
            return y + returned

    model, x = Edits().eval(), torch.randn(2, 4)
    expected = model.inner(x).detach()
    with capture_calls(model) as held:
        run_truth(model, {"x": x})
    with capture_calls(model, hold_bytes=0) as spilled:
        run_truth(model, {"x": x})
    held_leaf = next(c for c in held.calls if c.name == "inner").outputs[0]
    spilled_leaf = next(c for c in spilled.calls if c.name == "inner").outputs[0]
    assert not held_leaf.unchanged()  # held: the edited memory, dropped as not returned
    assert spilled_leaf.unchanged() and torch.equal(spilled_leaf.value, expected)


def test_pages_let_go_of_read_back_the_same():
    holding = Holding(0)
    value = torch.randn(64, 1024)
    stored = holding.store(value, (0.0,))
    holding.flush()
    read = stored.load()
    assert torch.equal(read, value)
    holding.release_pages()
    assert torch.equal(read, value)  # (the same tensor: its pages read from the file again)


def test_a_write_that_fails_keeps_the_copy_in_memory_and_spills_no_more(monkeypatch):
    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill, "_write_fully", full)
    holding = Holding(0)
    values = [torch.randn(100) for _ in range(3)]
    seen = values[0].clone()
    first = holding.store(values[0], (0.0,))
    holding.flush()
    assert isinstance(first, Spilled) and holding.folder is not None and holding.folder.failed
    values[0].add_(1.0)  # the model's memory moves on; the copy the hook took does not
    assert torch.equal(first.load(), seen)
    assert holding.store(values[1], (0.0,)) is values[1]  # held from now on


def test_the_file_has_no_name_and_is_closed_with_the_calls(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (read TMPDIR again)
    model, x = _Net().eval(), torch.randn(3, 8)
    with capture_calls(model, hold_bytes=0) as calls:
        run_truth(model, {"x": x})
    folder = calls.holding.folder
    assert folder is not None and folder.size > 0 and not folder.failed
    assert list(tmp_path.iterdir()) == []  # (written, read back, and no name on disk)
    whole = next(c for c in calls.calls if c.name == "" and c.mode == "autograd")
    assert torch.equal(whole.outputs[0].value, model(x))
    file = folder.file
    del calls, folder, whole
    gc.collect()
    assert file.closed


_KILLED = """
import os, signal, sys, torch
from introspect.run.spill import Holding
holding = Holding(0)
kept = [holding.store(torch.randn(1000), (0.0,)) for _ in range(20)]
holding.flush()
print(holding.folder.size, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_diff_killed_mid_spill_leaves_no_file_behind(tmp_path):
    done = subprocess.run([sys.executable, "-c", _KILLED], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert int(done.stdout) == 20 * 4000  # (it spilled)
    assert list(tmp_path.iterdir()) == []


def _judged(reference, candidate, batch):
    result = introspect.diff(reference, candidate, batch, nodes=False)
    return (result.passed, result.max_abs_err, result.first_divergence,
            result.modules.to_csv(), result.op_level, result.notes)


@pytest.mark.parametrize("style, fault", [("nanogpt_style", None), ("functional", None),
                                          ("nanogpt_style", "gelu_tanh"),
                                          ("pytorchic_bert", "scale_missing"),
                                          ("functional", "ln_eps")])
def test_a_diff_judges_alike_with_every_value_on_disk(minilm, style, fault, monkeypatch):
    """Every value the hooks keep on disk, and no module's output kept from an ancestor's
    run (the same budget, 0): the same verdict, rows and naming as with every value held."""
    module = importlib.import_module(f"tests.ports.{style}")
    reference = minilm.model
    batch = port_batch(minilm.tokenizer)
    candidate = module.build(reference, fault, layer=1)
    monkeypatch.delenv(spill.HOLD_VARIABLE, raising=False)
    held = _judged(reference, candidate, batch)
    made = []
    monkeypatch.setattr(spill, "SpillFolder", _counted(made))
    monkeypatch.setenv(spill.HOLD_VARIABLE, "0")
    on_disk = _judged(reference, candidate, batch)
    assert made and made[0].size > 0  # (the values went to disk)
    assert on_disk == held
    assert held[0] == (fault is None)


def _counted(made):
    class Counted(spill.SpillFolder):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    return Counted


def test_the_budget_is_read_from_the_environment(monkeypatch):
    model = torch.nn.Linear(1024, 1024)
    monkeypatch.delenv(spill.HOLD_VARIABLE, raising=False)
    assert hold_budget(model) == spill.HOLD_FLOOR_BYTES
    monkeypatch.setenv(spill.HOLD_VARIABLE, "1.5")
    assert hold_budget(model) == 3 << 19
    for bad in ("lots", "inf", "nan"):
        monkeypatch.setenv(spill.HOLD_VARIABLE, bad)
        with pytest.raises(InputError, match=spill.HOLD_VARIABLE):
            hold_budget(model)


def test_a_value_viewing_a_weight_is_held_as_the_model_holds_it():
    class Rows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(16, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.table[: x.shape[0]]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rows = Rows()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.rows(x)

    model, x = Model().eval(), torch.randn(3, 4)
    with capture_calls(model, hold_bytes=0) as calls:
        run_truth(model, {"x": x})
    rows = next(c for c in calls.calls if c.name == "rows" and c.mode == "autograd")
    assert not isinstance(rows.outputs[0].held, Spilled)
    assert rows.outputs[0].value.untyped_storage().data_ptr() == \
        model.rows.table.untyped_storage().data_ptr()
    root = next(c for c in calls.calls if c.name == "" and c.mode == "autograd")
    assert isinstance(root.outputs[0].held, Spilled)


@pytest.mark.parametrize("asked", ["lots", "inf", "1e400"])
def test_a_budget_that_is_no_number_is_refused_before_any_work(asked, monkeypatch, tmp_path,
                                                                 capsys):
    monkeypatch.setenv(spill.HOLD_VARIABLE, asked)
    out = tmp_path / "report"
    assert main(["diff", "--model", "bert-tiny", "--candidate", "scratch", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{spill.HOLD_VARIABLE}=" in err[0]
    assert not out.exists()


def test_a_writer_that_breaks_never_leaves_a_hook_waiting(monkeypatch):
    def broken(*_):
        raise RuntimeError("anything")

    monkeypatch.setattr(spill, "_write_fully", broken)
    monkeypatch.setattr(spill, "PENDING_BYTES", 1024)  # (each value waits for the one before)
    holding = Holding(0)
    values = [torch.randn(512) for _ in range(4)]  # 2 KiB each: over the pending room
    stored = [holding.store(v, (0.0,)) for v in values]
    holding.flush()
    assert isinstance(stored[0], Spilled)
    assert all(torch.equal(s.load() if isinstance(s, Spilled) else s, v)
               for s, v in zip(stored, values, strict=True))
