"""introspect's own measurements: trace, trace + shapes, drawings, diff, the trace cache.

Each task is a plain function of the models and inputs, so the same code is timed in
the harness and run once in a fresh process for its peak memory (``memory``).

Every task but the cache hits runs with the trace cache off, so repeated runs measure
tracing and not a cache lookup; the cache hits are their own rows, next to the full
trace (every node on FakeTensors, no shortcut: what ``introspect.trace`` cost before the
shape rules, the layer replay and the cache).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

import introspect
from benchmarks.timing import Work
from benchmarks.workloads import Inputs
from introspect.render import draw_graph, render_bytes
from introspect.tracing.tracer import trace_module

TOOL = "introspect"

# Task names shared by the harness, the report and the alternatives.
FORWARD = "plain forward"
TRACE = "trace (fx graph)"
TRACE_SHAPES = "trace + shapes"
DRAW_FOLDED = "drawing, folded (from a traced graph)"
DRAW_FULL = "drawing, every node (from a traced graph)"
TO_SVG_MODULES = "model to SVG, module level"
TO_SVG_FULL = "model to SVG, every op"
DIFF = "diff HF vs scratch"
CAPTURE = "capture every layer's output"
TRACE_FULL = "trace, every node on FakeTensors (no shortcut, no cache)"
CACHE_MEMORY = "trace, cache hit in memory"


def forward(model: torch.nn.Module, inputs: Inputs) -> Any:
    """One plain forward pass, as a user runs it for inference."""
    with torch.no_grad():
        return model(**inputs.tensors)


def trace_graph(model: torch.nn.Module, inputs: Inputs) -> Any:
    """The fx graph alone (``trace_module``, shapes from the trace included), no cache."""
    return trace_module(model, inputs.tensors, cache=False)


def trace_full(model: torch.nn.Module, inputs: Inputs) -> Any:
    """The same graph traced the old way: every node, leaves included, on FakeTensors."""
    return trace_module(model, inputs.tensors, fast=False, cache=False)


def trace_with_shapes(model: torch.nn.Module, inputs: Inputs) -> Any:
    """``introspect.trace``: the fx graph with ShapeProp's shapes, and the node records."""
    return introspect.trace(model, inputs.for_introspect, cache=False)


def trace_cached(model: torch.nn.Module, inputs: Inputs) -> Any:
    """``introspect.trace`` served by the cache in memory (warmed by the task's setup).

    The cache has no disk layer: ``python -m benchmarks.cache_bench`` measured a warm disk
    cache saving nothing on a whole ``introspect trace`` process.
    """
    return introspect.trace(model, inputs.for_introspect)


@contextlib.contextmanager
def no_trace_cache() -> Iterator[None]:
    """``INTROSPECT_NO_CACHE=1`` for the duration: every trace is a real one."""
    before = os.environ.get("INTROSPECT_NO_CACHE")
    os.environ["INTROSPECT_NO_CACHE"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["INTROSPECT_NO_CACHE"]
        else:
            os.environ["INTROSPECT_NO_CACHE"] = before


def drawing_svg(graph: Any, full: bool) -> bytes:
    """The folded drawing (every module, encoder layers ×N) or every node, as SVG bytes."""
    return render_bytes(draw_graph(graph, depth="full" if full else None), "svg")


def diff(reference: torch.nn.Module, candidate: torch.nn.Module, inputs: Inputs) -> Any:
    """``introspect.diff``: trace both (no cache), align, compare every node's output."""
    with no_trace_cache():
        return introspect.diff(reference, candidate, inputs.for_introspect)


def diff_without_recording(reference: torch.nn.Module, candidate: torch.nn.Module,
                           inputs: Inputs) -> Any:
    """``introspect.diff(..., nodes=False)`` (``introspect diff`` with no report): a PASS
    the outputs and module evidence prove records and replays nothing."""
    with no_trace_cache():
        return introspect.diff(reference, candidate, inputs.for_introspect, nodes=False)


def faulty_twin(scratch: torch.nn.Module) -> torch.nn.Module:
    """A copy of the from-scratch twin with the tanh GELU in layer 1: a FAIL that module
    evidence and the op level both localise (``encoder.layer.1``, the activation)."""
    import copy

    faulty = copy.deepcopy(scratch)
    faulty.encoder.layer[1].intermediate.intermediate_act_fn = torch.nn.GELU(approximate="tanh")
    return faulty


def introspect_work(hf: torch.nn.Module, scratch: torch.nn.Module, inputs: Inputs) -> list[Work]:
    """Every introspect task on one model and input, with its baseline and expected cost.

    The drawings are timed from a graph traced beforehand (drawing reads records and
    never runs the model); the harness adds the trace to get "model to SVG".
    """
    traced: dict[str, Any] = {}

    def trace_once() -> None:
        traced.setdefault("graph", trace_with_shapes(hf, inputs))

    def warm_cache() -> None:
        introspect.trace(hf, inputs.for_introspect)

    return [
        Work(TRACE, TOOL, lambda: trace_graph(hf, inputs), units=0.5),
        Work(TRACE_FULL, TOOL, lambda: trace_full(hf, inputs), units=1.0),
        Work(TRACE_SHAPES, TOOL, lambda: trace_with_shapes(hf, inputs), units=1.2),
        Work(CACHE_MEMORY, TOOL, lambda: trace_cached(hf, inputs), setup=warm_cache,
             units=0.1),
        Work(DRAW_FOLDED, TOOL, lambda: drawing_svg(traced["graph"], full=False),
             setup=trace_once, units=0.2, output_bytes=len),
        Work(DRAW_FULL, TOOL, lambda: drawing_svg(traced["graph"], full=True),
             setup=trace_once, teardown=traced.clear, units=1.0, output_bytes=len),
        Work(DIFF, TOOL, lambda: diff(hf, scratch, inputs), baseline=2, units=2.0),
    ]
