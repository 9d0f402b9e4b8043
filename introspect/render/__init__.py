"""Drawings of a traced BERT: its tensor flow from the tokens to the logits, in Graphviz.

``draw_graph`` reads an ``IntrospectGraph``'s records (it never runs the model) and
returns a ``graphviz.Digraph``: in Jupyter it shows itself; ``.source`` is the DOT; and
``write_drawing`` saves SVG, PNG, PDF or DOT. The modules, one job each:

- ``plan``: which nodes, boxes, clusters and edges, for a depth, folding and expansion;
- ``fold``: identical encoder layers folded into one ×N block; layout-op chains;
- ``dims``: named dimensions (B, S, H, nh, hd, I) read from the graph;
- ``labels``: escaping and label text; ``dot``: the Digraph; ``overlay``: colours and
  notes per node (the diff paints errors with it); ``output``: rendering and writing.

Example::

    >>> import introspect
    >>> loaded = introspect.load_model("bert-base", head="sequence-classification")
    >>> graph = introspect.trace(loaded.model, introspect.tokenize(loaded.tokenizer))
    >>> digraph = draw_graph(graph)                     # folded: encoder.layer.0–11 ×12
    >>> digraph = draw_graph(graph, depth=1, expand=[0, -1])
    >>> write_drawing(digraph, "bert.svg")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from introspect.render.output import (
    FORMATS,
    GraphvizMissingError,
    format_for,
    render_bytes,
    require_dot,
    write_drawing,
)
from introspect.render.overlay import ERROR_SCALE, Overlay, as_overlay
from introspect.render.plan import FULL, Depth, Plan, TracedGraph, build_plan

NOTEBOOK_WIDTH = 9.4  # inches: about 900 px, the width of a Jupyter output cell

if TYPE_CHECKING:
    import graphviz

__all__ = [
    "draw_graph",
    "Overlay",
    "ERROR_SCALE",
    "write_drawing",
    "render_bytes",
    "format_for",
    "require_dot",
    "build_plan",
    "Plan",
    "TracedGraph",
    "FORMATS",
    "FULL",
    "GraphvizMissingError",
    "NOTEBOOK_WIDTH",
]


def draw_graph(
    graph: TracedGraph,
    depth: Depth = None,
    *,
    fold: bool | None = None,
    expand: Iterable[int] = (),
    overlay: Overlay | Mapping[str, str] | Any = None,
    title: str | None = None,
    max_width: float | None = None,
) -> graphviz.Digraph:
    """Draw the tensor flow of ``graph``, from the tokens at the top to the logits.

    Args:
        graph: a traced ``IntrospectGraph``.
        depth: module levels to open: 0 the model as one box, 1 the big blocks
            (embeddings, attention mask, encoder layers, pooler, head), 2 and 3 open
            them further, None (default) every module, ``"full"`` every node (layout
            ops and mask building included).
        fold: draw identical consecutive encoder layers once, marked ×N. Default: yes,
            except at ``depth="full"``.
        expand: encoder layers to keep open when folding; negative counts from the end,
            so ``[0, -1]`` opens the first and the last.
        overlay: colours and notes per node name: an ``Overlay``, a mapping of node
            name to colour, or a DataFrame with columns name, color, note (and score).
        title: the drawing's title (default: the graph's).
        max_width: the most inches wide the picture may be; Graphviz scales a wider one
            down to it (``NOTEBOOK_WIDTH`` fits a notebook cell). Default: natural size.

    Returns:
        A ``graphviz.Digraph``; the same graph and options give the same DOT bytes.

    Raises:
        InputError: a bad depth, an expand index outside the layers, or an overlay that
            names nodes the graph does not have.

    Example::

        >>> digraph = draw_graph(graph, depth=1)
        >>> "×12" in digraph.source    # BERT-base: twelve identical layers, drawn once
        True
    """
    from introspect.errors import InputError
    from introspect.render.dot import to_digraph

    painted = as_overlay(overlay)
    if painted is not None:
        known = {r.name for r in graph.records}
        unknown = sorted(painted.names - known)
        if unknown:
            raise InputError(
                f"overlay names {len(unknown)} node(s) this graph does not have, "
                f"e.g. {unknown[:3]}; use names from graph.nodes['name']"
            )
    plan = build_plan(graph, depth=depth, fold=fold, expand=expand)
    if title is not None:
        plan.title = title
    digraph = to_digraph(plan, painted)
    if max_width is not None:
        if not max_width > 0:
            raise InputError(f"max_width must be a positive number of inches, not {max_width!r}")
        digraph.attr(size=f"{max_width:g},1000")  # height free: only the width is bounded
    return digraph
