"""The reference's drawing with every compared node coloured by its local error.

Colours step with how far a node's local max abs error is over its own budget (within,
up to 10x, up to 1000x, beyond), as ``introspect.render``'s error scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from introspect.errors import InputError, IntrospectError


class _ComparedRow(Protocol):
    @property
    def reference_node(self) -> str: ...
    @property
    def local_max_abs_err(self) -> float | None: ...
    @property
    def atol(self) -> float | None: ...


class _LayerRow(Protocol):
    @property
    def layer(self) -> str: ...
    @property
    def passed(self) -> bool: ...


class ComparedGraph(Protocol):
    """What the overlay reads of a diff (``introspect.diff.result.DiffResult`` is one).

    A protocol, so that the report never imports the result that draws with it.
    """

    @property
    def rows(self) -> Sequence[_ComparedRow]: ...
    @property
    def layer_rows(self) -> Sequence[_LayerRow]: ...
    @property
    def reference(self) -> Any: ...


def overlay_svg(result: ComparedGraph, *, depth: Any = None) -> bytes | None:
    """The SVG, or None when it cannot be drawn (no Graphviz, or no renderer installed)."""
    try:
        from introspect.render import render_bytes

        return bytes(render_bytes(overlay_digraph(result, depth=depth, max_width=None), "svg"))
    except (ImportError, IntrospectError):
        return None


def overlay_digraph(result: ComparedGraph, *, depth: Any = None, **options: Any) -> Any:
    """The reference's drawing (a ``graphviz.Digraph``) coloured by each node's local error.

    Identical layers fold into one box; the failing ones stay open, outlined in red.
    ``options`` go to ``introspect.render.draw_graph`` (``fold``, ``expand``, ``title``,
    ``max_width``: by default the picture is scaled down to fit a notebook cell).

    Raises:
        ImportError: the graphviz package is missing.
    """
    from introspect.render import ERROR_SCALE, NOTEBOOK_WIDTH, Overlay, draw_graph

    colors: dict[str, str] = {}
    notes: dict[str, str] = {}
    scores: dict[str, float] = {}
    for r in result.rows:
        if not r.reference_node or r.local_max_abs_err is None or r.atol is None:
            continue
        error = r.local_max_abs_err
        ratio = error / r.atol if r.atol > 0 else (math.inf if error > 0 else 0.0)
        if r.reference_node in scores and scores[r.reference_node] >= ratio:
            continue  # several pairs per node (one per head): keep the worst
        step = 0 if ratio <= 1 else 1 if ratio <= 10 else 2 if ratio <= 1000 else 3
        colors[r.reference_node] = ERROR_SCALE[step]
        notes[r.reference_node] = f"local err {error:.2g}"
        scores[r.reference_node] = ratio
    failing_layers = failing_layer_names(result)
    caption = ("colour: local max abs error against each node's budget "
               "(green within, yellow <=10x, orange <=1000x, red beyond)")
    if failing_layers:
        caption += "; thick red border: a failing layer"
    overlay = Overlay(colors, notes, scores, ERROR_SCALE, caption, outline=failing_layers)
    options.setdefault("expand", _failing_layer_indices(failing_layers))
    options.setdefault("max_width", NOTEBOOK_WIDTH)
    if result.reference is None:
        raise InputError("this diff's reference is a capture file, which holds no graph to "
                         "draw; diff against the live model to draw it")
    return draw_graph(result.reference, depth, overlay=overlay, **options)


def drawn_members(result: ComparedGraph) -> dict[str, tuple[str, ...]]:
    """Each node of ``overlay_svg``'s drawing that stands for other nodes than itself (a
    folded block, a closed module, a layout chain): its DOT id (the SVG node's ``<title>``)
    -> the reference nodes drawn there. A page finds a drawn node's rows with it."""
    from introspect.render import build_plan

    if result.reference is None:
        return {}
    plan = build_plan(result.reference,
                      expand=_failing_layer_indices(failing_layer_names(result)))
    return {node.id: tuple(dict.fromkeys(node.members)) for node in plan.nodes
            if tuple(node.members) != (node.id,)}


def _failing_layer_indices(failing_layers: Sequence[str]) -> list[int]:
    """The encoder layers the drawing keeps open: the failing ones."""
    return sorted(int(layer.rpartition(".")[2]) for layer in failing_layers
                  if layer.startswith("encoder.layer.") and layer.rpartition(".")[2].isdigit())


def failing_layer_names(result: ComparedGraph) -> tuple[str, ...]:
    """The layers that fail, in order (``encoder.layer.3``, ``embeddings``): the drawing
    outlines those it draws as a block, and the page links to them."""
    return tuple(r.layer for r in result.layer_rows if not r.passed)
