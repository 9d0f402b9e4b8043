"""What users would otherwise pick: torchview, torchlens, torchinfo, torch.export +
ShapeProp, hooks.

Each is called as its documentation shows, on the same model and inputs as introspect.
torchlens wraps every torch function the first time it traces, and the wrappers stay
for the life of the process, so its tasks run in a fresh process of their own
(``torchlens_case``) with their own plain-forward baseline measured before it is used.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.fx.passes.shape_prop import ShapeProp

from benchmarks.cases import CAPTURE, DIFF, FORWARD, TO_SVG_FULL, TO_SVG_MODULES, TRACE_SHAPES
from benchmarks.timing import Repetitions, Work, time_median
from benchmarks.workloads import Inputs

TORCHVIEW = "torchview"
TORCHINFO = "torchinfo.summary (module outputs only)"
TORCHLENS = "torchlens"
EXPORT = "torch.export + ShapeProp"
HOOKS = "forward hooks"

TORCHLENS_TRACE = "torchlens.trace (every op's output)"  # capture, as the row's tool
TORCHLENS_DRAW = "drawing, every op (from a torchlens trace)"


def installed(package: str) -> bool:
    """Whether an optional benchmark extra can be imported."""
    import importlib.util

    return importlib.util.find_spec(package) is not None


def export_with_shapes(model: torch.nn.Module, inputs: Inputs) -> torch.fx.GraphModule:
    """The other way to an fx graph with shapes: torch.export (ATen ops), then ShapeProp."""
    exported = torch.export.export(model, args=(), kwargs=inputs.tensors)
    gm = exported.module()
    with torch.no_grad():
        ShapeProp(gm).propagate(*inputs.tensors.values())  # placeholders in kwargs order
    return gm


def torchinfo_summary(model: torch.nn.Module, inputs: Inputs) -> Any:
    """torchinfo's table of every module's output shape and parameters (it runs the model)."""
    import torchinfo

    return torchinfo.summary(model, input_data=dict(inputs.tensors), depth=100, verbose=0,
                             device="cpu")


def leaf_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Modules with no children: what a hand-written comparison hooks."""
    return {name: m for name, m in model.named_modules() if name and not any(m.children())}


def capture_with_hooks(model: torch.nn.Module, inputs: Inputs) -> dict[str, Any]:
    """Every leaf module's output from one forward pass, by module name, as people write it."""
    captured: dict[str, Any] = {}

    def keep(name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            captured[name] = output

        return hook

    handles = [m.register_forward_hook(keep(name)) for name, m in leaf_modules(model).items()]
    try:
        with torch.no_grad():
            model(**inputs.tensors)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def compare_with_hooks(reference: torch.nn.Module, candidate: torch.nn.Module,
                       inputs: Inputs) -> dict[str, float]:
    """The hand-written layer comparison: hook both models, pair outputs by module name.

    Works here because the from-scratch BERT uses HF's module names; a port with other
    names or fused modules needs a hand-made map, which this does not count.
    """
    expected = capture_with_hooks(reference, inputs)
    actual = capture_with_hooks(candidate, inputs)
    errors = {}
    for name, value in expected.items():
        other = actual.get(name)
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor) \
                and value.shape == other.shape:
            errors[name] = (value.float() - other.float()).abs().max().item()
    return errors


def torchview_svg(model: torch.nn.Module, inputs: Inputs, depth: float) -> bytes:
    """torchview's ``draw_graph`` (it runs the model) rendered to SVG by Graphviz."""
    import torchview

    drawn = torchview.draw_graph(model, input_data=dict(inputs.tensors), depth=depth,
                                 device="cpu")
    return drawn.visual_graph.pipe(format="svg")


def alternative_work(hf: torch.nn.Module, scratch: torch.nn.Module, inputs: Inputs) -> list[Work]:
    """Every alternative run in this process, with the baseline its ratio divides by."""
    missing_torchview = "" if installed("torchview") else "not installed (pip install '.[bench]')"
    missing_torchinfo = "" if installed("torchinfo") else "not installed (pip install '.[bench]')"
    return [
        Work(TRACE_SHAPES, EXPORT, lambda: export_with_shapes(hf, inputs), units=1.5),
        Work(TRACE_SHAPES, TORCHINFO, lambda: torchinfo_summary(hf, inputs), units=1.5,
             skip=missing_torchinfo),
        Work(CAPTURE, HOOKS, lambda: capture_with_hooks(hf, inputs), units=1.2),
        Work(TO_SVG_MODULES, f"{TORCHVIEW} depth 3", lambda: torchview_svg(hf, inputs, 3),
             units=1.2, output_bytes=len, skip=missing_torchview),
        Work(TO_SVG_FULL, f"{TORCHVIEW} full depth",
             lambda: torchview_svg(hf, inputs, float("inf")), units=1.2, output_bytes=len,
             skip=missing_torchview),
        Work(DIFF, f"{HOOKS} (by module name)", lambda: compare_with_hooks(hf, scratch, inputs),
             baseline=2, units=1.1, held_activations=2),
    ]


def torchlens_trace(model: torch.nn.Module, inputs: Inputs) -> Any:
    """``torchlens.trace``: log every operation's output in one forward pass."""
    import torchlens

    return torchlens.trace(model, input_kwargs=dict(inputs.tensors))  # saves every output


def torchlens_svg(trace: Any) -> bytes:
    """torchlens's drawing of a trace (every op, unrolled), rendered to SVG by Graphviz."""
    with tempfile.TemporaryDirectory() as folder:
        trace.draw(vis_outpath=str(Path(folder) / "graph"), vis_fileformat="svg",
                   vis_save_only=True)
        return next(Path(folder).glob("*.svg")).read_bytes()


def torchlens_case(hf: torch.nn.Module, inputs: Inputs, repetitions: Repetitions,
                   budget_s: float | None = None) -> dict[str, Any]:
    """torchlens's tasks with their own forward baseline; run in a new interpreter.

    Returns seconds (medians) by task name, the SVG's size, the runs made (the fewest
    of the three tasks'), and the time of one trace + drawing.
    """
    import contextlib
    import io
    import warnings

    baseline = time_median(lambda: _forward(hf, inputs), repetitions, budget_s)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # torchlens warns about HF's scalar escapes
        traced = time_median(lambda: torchlens_trace(hf, inputs), repetitions, budget_s)
        trace = traced.result
        drawn = time_median(lambda: torchlens_svg(trace), repetitions, budget_s)
    return {FORWARD: baseline.median, TORCHLENS_TRACE: traced.median,
            TORCHLENS_DRAW: drawn.median, "svg_bytes": len(drawn.result),
            "warmup": min(traced.warmup, drawn.warmup),
            "runs": min(len(traced.times), len(drawn.times)),
            "one run": traced.median + drawn.median}


def _forward(model: torch.nn.Module, inputs: Inputs) -> Any:
    with torch.no_grad():
        return model(**inputs.tensors)
