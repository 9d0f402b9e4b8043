"""DOT: turn a drawing ``Plan`` into a ``graphviz.Digraph`` with labels, styles and clusters.

Node looks, so that a reader tells them apart at a glance:

- inputs and outputs: blue rounded boxes; the tokens: a table at the top;
- modules (``nn.Linear``, ``nn.LayerNorm``, ...): amber boxes; a closed module: a 3-D box;
- ops (add, attention, select): grey ellipses; layout chains: dashed white ellipses;
- parameters and buffers: violet cylinders; the attention mask: a pink box (dashed
  where a later layer refers back to it, instead of an edge down the whole page);
- folded layers (×N): a violet block or cluster with a bold border;
- an overlay's outlined layers (the diff's failing ones): a thick red border.

Every label is an HTML-like label built from escaped text (``labels.escape``). The DOT is
emitted in plan order, with nothing taken from ids or unordered sets, so it is the same
bytes on every run.

Example::

    >>> digraph = to_digraph(build_plan(graph, depth=1))
    >>> print(digraph.source[:40])
    digraph introspect {
"""

from __future__ import annotations

from collections.abc import Sequence

import graphviz

from introspect.render.labels import compact_count, escape, shape_text, shorten
from introspect.render.overlay import Overlay
from introspect.render.plan import ClusterSpec, DrawNode, Plan

FONT = "Helvetica"
MAX_TOKENS = 16  # token cells per row before "… +N"
MAX_ROWS = 4  # texts shown in the tokens table before "… N more"
TITLE_LINE_CHARS = 90  # the dims legend and the overlay caption wrap here

GRAPH_ATTRS = {
    "rankdir": "TB",
    "newrank": "true",
    "nodesep": "0.25",
    "ranksep": "0.35",
    "fontname": FONT,
    "fontsize": "11",
    "labelloc": "t",
    "labeljust": "c",
    "bgcolor": "white",
    "pad": "0.2",
}
NODE_ATTRS = {"fontname": FONT, "fontsize": "10", "margin": "0.12,0.04", "penwidth": "1.2"}
EDGE_ATTRS = {
    "fontname": FONT,
    "fontsize": "8",
    "fontcolor": "#475569",
    "color": "#64748b",
    "arrowsize": "0.6",
}

STYLES: dict[str, dict[str, str]] = {
    "tokens": {"shape": "plain"},
    "input": {
        "shape": "box",
        "style": "rounded,filled",
        "fillcolor": "#dbeafe",
        "color": "#2563eb",
    },
    "output": {
        "shape": "box",
        "style": "rounded,filled,bold",
        "fillcolor": "#dbeafe",
        "color": "#2563eb",
    },
    "module": {"shape": "box", "style": "filled", "fillcolor": "#fff4dd", "color": "#d97706"},
    "box": {"shape": "box3d", "style": "filled", "fillcolor": "#fff4dd", "color": "#d97706"},
    "model": {"shape": "box3d", "style": "filled", "fillcolor": "#fff4dd", "color": "#d97706"},
    "block": {"shape": "box3d", "style": "filled,bold", "fillcolor": "#ede9fe", "color": "#7c3aed"},
    "op": {"shape": "ellipse", "style": "filled", "fillcolor": "#f1f5f9", "color": "#64748b"},
    "layout": {
        "shape": "ellipse",
        "style": "dashed,filled",
        "fillcolor": "#ffffff",
        "color": "#64748b",
    },
    "parameter": {
        "shape": "cylinder",
        "style": "filled",
        "fillcolor": "#f3e8ff",
        "color": "#9333ea",
    },
    "buffer": {"shape": "cylinder", "style": "filled", "fillcolor": "#f3e8ff", "color": "#9333ea"},
    "mask": {"shape": "box", "style": "rounded,filled", "fillcolor": "#fce7f3", "color": "#db2777"},
    "maskref": {
        "shape": "box",
        "style": "rounded,filled,dashed",
        "fillcolor": "#fdf2f8",
        "color": "#db2777",
        "fontsize": "8",
    },
}
OUTLINE_COLOR = "#cf222e"  # an overlay's outlined (failing) layers: thick and red
OUTLINE_ID = "outline_"  # + the layer's name: the SVG id a page links to
CLUSTER_FILLS = ("#f8fafc", "#f1f5f9", "#e8edf3", "#e2e8f0")  # deeper levels, darker
LEGEND = (
    "box: module · 3-D box: closed module · ellipse: op · dashed: layout only · "
    "cylinder: parameter/buffer · blue: inputs and outputs · edges: tensor shapes"
)


def to_digraph(plan: Plan, overlay: Overlay | None = None) -> graphviz.Digraph:
    """The Graphviz drawing of ``plan``, painted with ``overlay`` when one is given.

    Returns:
        A ``graphviz.Digraph``; it shows itself as SVG in Jupyter, ``.source`` is the DOT.
    """
    digraph = graphviz.Digraph(
        "introspect",
        graph_attr=dict(GRAPH_ATTRS),
        node_attr=dict(NODE_ATTRS),
        edge_attr=dict(EDGE_ATTRS),
    )
    digraph.attr(label=_title_label(plan, overlay))
    _emit(digraph, plan, overlay)
    stacked = _entries_below_mask_references(plan)
    for edge in plan.edges:
        attrs = {"label": f" {edge.label} "} if edge.label else {}
        if (edge.source, edge.target) in stacked:
            attrs["minlen"] = "2"
        digraph.edge(edge.source, edge.target, **attrs)
    return digraph


def _entries_below_mask_references(plan: Plan) -> set[tuple[str, str]]:
    """Edges into a layer block whose first node a mask reference also feeds.

    The reference sits one rank above that node, the rank of the previous block's last
    node; two clusters sharing a rank are put side by side, and a model's layers become
    a diagonal staircase wider than a notebook cell. Two ranks on the edge between the
    blocks leave the reference a rank of its own, and the blocks stack.
    """
    node = {n.id: n for n in plan.nodes}
    fed = {e.target for e in plan.edges if node[e.source].style == "maskref"}
    return {
        (e.source, e.target)
        for e in plan.edges
        if e.target in fed
        and node[e.source].style != "maskref"
        and node[e.source].cluster[:2] != node[e.target].cluster[:2]
    }


def _emit(digraph: graphviz.Digraph, plan: Plan, overlay: Overlay | None) -> None:
    """Nodes and nested clusters, each container's items in order of first appearance."""
    items: dict[tuple[str, ...], list[tuple[str, object]]] = {(): []}
    for node in plan.nodes:
        for level in range(1, len(node.cluster) + 1):
            key = node.cluster[:level]
            if key not in items:
                items[key] = []
                items[key[:-1]].append(("cluster", key))
        items[node.cluster].append(("node", node))
    members = _cluster_members(plan)

    def fill(container: graphviz.Digraph, key: tuple[str, ...]) -> None:
        for kind, item in items[key]:
            if kind == "node":
                assert isinstance(item, DrawNode)
                container.node(
                    item.id, label=node_label(item, plan, overlay), **_node_attrs(item, overlay)
                )
            else:
                assert isinstance(item, tuple)
                spec = plan.clusters[item]
                with container.subgraph(name="cluster_" + "/".join(item)) as sub:
                    sub.attr(**_cluster_attrs(spec, len(item), members.get(item, ()), overlay))
                    fill(sub, item)

    fill(digraph, ())


def node_label(node: DrawNode, plan: Plan, overlay: Overlay | None = None) -> str:
    """The HTML-like label of one node: title, what it is, shape with named dims, params."""
    if node.style == "tokens":
        return tokens_label(plan.texts, plan.tokens)
    lines = [f"<B>{escape(node.title)}</B>"]
    if node.subtitle:
        lines.append(_small(node.subtitle))
    if node.style == "layout" and node.before is not None:
        lines.append(escape(f"{shape_text(node.before)} → {shape_text(node.shape)}"))
        names = (plan.dims.name(node.before), plan.dims.name(node.shape))
        if all(names):
            lines.append(_small(f"{names[0]} → {names[1]}"))
    elif node.shape_text:
        named = plan.dims.name(node.shape) if node.shape_text.startswith("(") else ""
        lines.append(escape(node.shape_text) + (" " + _small(named) if named else ""))
    if node.params:
        lines.append(_small(f"{compact_count(node.params)} params"))
    note = _overlay_note(node.members, overlay)
    if note:
        lines.append(f'<FONT POINT-SIZE="9" COLOR="#991b1b">{escape(note)}</FONT>')
    return "<" + "<BR/>".join(lines) + ">"


def tokens_label(texts: Sequence[str], tokens: Sequence[Sequence[str]]) -> str:
    """A table: each text, then its WordPiece tokens one per cell ([PAD] greyed)."""
    width = min(max((len(row) for row in tokens), default=0), MAX_TOKENS + 1)
    rows = [
        f'<TR><TD COLSPAN="{max(width, 1)}" BORDER="0" ALIGN="LEFT"><B>tokenizer</B> '
        '<FONT POINT-SIZE="8" COLOR="#64748b">text → WordPiece tokens → input_ids, '
        "token_type_ids, attention_mask</FONT></TD></TR>"
    ]
    for i, row in enumerate(tokens[:MAX_ROWS]):
        text = escape(shorten(" ".join((texts[i] if i < len(texts) else "").split()), 90))
        rows.append(  # an empty <I></I> is a Graphviz syntax error (a text of control chars)
            f'<TR><TD COLSPAN="{max(width, 1)}" BORDER="0" ALIGN="LEFT">'
            + (f"<I>{text}</I>" if text else " ") + "</TD></TR>"
        )
        cells = [_token_cell(token) for token in row[:MAX_TOKENS]]
        if len(row) > MAX_TOKENS:
            cells.append(
                f'<TD BORDER="0"><FONT COLOR="#64748b">… +{len(row) - MAX_TOKENS}</FONT></TD>'
            )
        cells += ['<TD BORDER="0"></TD>'] * (width - len(cells))
        rows.append("<TR>" + "".join(cells) + "</TR>")
    if len(tokens) > MAX_ROWS:
        rows.append(
            f'<TR><TD COLSPAN="{max(width, 1)}" BORDER="0" ALIGN="LEFT">'
            f"… {len(tokens) - MAX_ROWS} more</TD></TR>"
        )
    return (
        '<<TABLE BORDER="1" COLOR="#2563eb" BGCOLOR="#eff6ff" CELLBORDER="1" '
        'CELLSPACING="2" CELLPADDING="3" STYLE="ROUNDED">' + "".join(rows) + "</TABLE>>"
    )


def _token_cell(token: str) -> str:
    if token == "[PAD]":
        return f'<TD BGCOLOR="#e2e8f0"><FONT COLOR="#64748b">{escape(token)}</FONT></TD>'
    if token.startswith("[") and token.endswith("]"):
        return f'<TD BGCOLOR="#dbeafe"><B>{escape(token)}</B></TD>'
    return f'<TD BGCOLOR="white">{escape(token)}</TD>'


def _title_label(plan: Plan, overlay: Overlay | None) -> str:
    lines = [f'<FONT POINT-SIZE="16"><B>{escape(plan.title or "model")}</B></FONT>']
    if plan.dims.sizes:
        lines += [escape(line) for line in _wrap(plan.dims.legend().split(" · "), " · ")]
    lines += [_small(line) for line in _wrap(LEGEND.split(" · "), " · ")]
    if overlay is not None and overlay.caption:
        lines += [escape(line) for line in _wrap(overlay.caption.split("; "), "; ")]
    return "<" + "<BR/>".join(lines) + "<BR/> >"


def _wrap(parts: Sequence[str], separator: str, limit: int = TITLE_LINE_CHARS) -> list[str]:
    """Parts joined into lines of at most ``limit`` characters (a longer part stays whole).

    The title is the widest thing of a small drawing: one long line would make the
    whole picture wider than a notebook cell.
    """
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(separator) + len(part) <= limit:
            lines[-1] += separator + part
        else:
            lines.append(part)
    return lines


def _small(text: str) -> str:
    return f'<FONT POINT-SIZE="8" COLOR="#475569">{escape(text)}</FONT>'


def _node_attrs(node: DrawNode, overlay: Overlay | None) -> dict[str, str]:
    attrs = dict(STYLES.get(node.style, STYLES["op"]))
    if overlay is not None:
        worst = overlay.worst(node.members)
        if worst is not None and worst in overlay.colors:
            attrs["fillcolor"] = overlay.colors[worst]
            if "filled" not in attrs.get("style", ""):
                attrs["style"] = (attrs.get("style", "") + ",filled").strip(",")
    if overlay is not None and node.id.startswith("box/") and node.id[4:] in overlay.outline:
        attrs.update(color=OUTLINE_COLOR, penwidth="4", id=f"{OUTLINE_ID}{node.id[4:]}")
    attrs["tooltip"] = _tooltip(node)
    return attrs


def _tooltip(node: DrawNode) -> str:
    """Plain text: the fx node names drawn here (no user text, so no escaping is needed)."""
    names = list(dict.fromkeys(node.members))
    shown = ", ".join(names[:6]) + (f", … ({len(names)} nodes)" if len(names) > 6 else "")
    return shown or node.id


def _overlay_note(members: Sequence[str], overlay: Overlay | None) -> str:
    if overlay is None:
        return ""
    worst = overlay.worst(members)
    if worst is None or worst not in overlay.notes:
        return ""
    note = overlay.notes[worst]
    return note if len(set(members)) == 1 else f"{note} ({worst})"


def _cluster_members(plan: Plan) -> dict[tuple[str, ...], list[str]]:
    members: dict[tuple[str, ...], list[str]] = {}
    for node in plan.nodes:
        for level in range(1, len(node.cluster) + 1):
            members.setdefault(node.cluster[:level], []).extend(node.members)
    return members


def _cluster_attrs(
    spec: ClusterSpec, level: int, members: Sequence[str], overlay: Overlay | None
) -> dict[str, str]:
    attrs = {
        "label": f"<<B>{escape(spec.label)}</B>>",
        "style": "rounded,filled",
        "fillcolor": CLUSTER_FILLS[min(level - 1, len(CLUSTER_FILLS) - 1)],
        "color": "#94a3b8",
        "fontsize": "10",
        "labeljust": "l",
        "margin": "10",
    }
    outline = overlay.outline if overlay is not None else ()
    if any(key in outline for key in spec.key[:-1]):
        # Graphviz hands a cluster's attributes down to the clusters inside it: reset them
        attrs.update(penwidth="1", fontcolor="black", id="")
    if spec.key[-1] in outline:
        attrs.update(style="rounded,filled,bold", color=OUTLINE_COLOR, penwidth="5",
                     fontsize="12", fontcolor=OUTLINE_COLOR, id=f"{OUTLINE_ID}{spec.key[-1]}")
    elif spec.folded:
        attrs.update(
            style="rounded,filled,bold",
            fillcolor="#f5f3ff",
            color="#7c3aed",
            penwidth="2",
            fontsize="12",
        )
        worst = overlay.worst(members) if overlay is not None else None
        if overlay is not None and worst is not None and worst in overlay.colors:
            attrs.update(color=overlay.colors[worst])  # thinner than an outlined layer
            note = overlay.notes.get(worst, "")
            label = f"<B>{escape(spec.label)}</B>" + (
                f'<BR/><FONT POINT-SIZE="9">worst: {escape(note)} ({escape(worst)})</FONT>'
                if note
                else ""
            )
            attrs["label"] = f"<{label}>"
    return attrs
