"""The drawing plan: which boxes, nodes, clusters and edges a drawing has, before any DOT.

``build_plan`` reads an ``IntrospectGraph``'s records and decides, for the options
given, what every drawn record becomes: a node of its own, part of a closed module box
(depth), part of a folded ×N layer block (fold), part of a layout chain ("split heads"),
or part of the one "attention mask" node. Shape bookkeeping (ints, sizes) and "other"
nodes are never drawn. ``introspect.render.dot`` turns the plan into Graphviz.

Depth counts module levels below the model: 0 is the model as one box; 1 the big blocks
(embeddings, attention mask, each encoder layer, pooler, head modules); 2 opens those
(attention, intermediate, output); 3 opens attention (self, output); None opens every
module; ``"full"`` draws every node, layout ops and mask building included.

Example::

    >>> plan = build_plan(graph, depth=1)
    >>> [n.title for n in plan.nodes][:5]
    ['tokens', 'input_ids', 'token_type_ids', 'attention_mask', 'embeddings']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, Union

from introspect.errors import InputError
from introspect.render.dims import Dims, infer_dims
from introspect.render.fold import (
    LayerGroup,
    layer_groups,
    layer_index,
    layer_members,
    layout_chains,
    module_components,
)
from introspect.render.labels import layout_title, mask_title, op_title
from introspect.tracing.records import KIND_OTHER, KIND_SHAPE, KIND_TENSOR, NodeRecord


class TracedGraph(Protocol):
    """What a drawing reads of a traced graph (``introspect.graph.IntrospectGraph`` is one).

    A protocol, so that the drawing never imports the graph module that draws with it.
    """

    @property
    def records(self) -> Sequence[NodeRecord]: ...
    @property
    def title(self) -> str: ...
    @property
    def texts(self) -> tuple[str, ...]: ...
    @property
    def tokens(self) -> tuple[tuple[str, ...], ...]: ...
    @property
    def output_names(self) -> tuple[str, ...]: ...


FULL = "full"
Depth = Union[int, Literal["full"], None]  # noqa: UP007 (a runtime alias on 3.10)

ENCODER = "encoder"  # the cluster around the encoder layers
# Ids of nodes that stand for no single record; "/" cannot occur in an fx node name, and
# ":" is avoided because DOT reads it as a port.
MASK_ID, MODEL_ID, TOKENS_ID = "mask/attention", "box/model", "tokens/text"
_OUTPUT_SHAPES = re.compile(r"([A-Za-z_][\w.]*)=(\([^)]*\))")


@dataclass(frozen=True)
class DrawNode:
    """One node of the drawing: a record, a closed module, a chain, the mask, an output."""

    id: str  # DOT id, stable across runs: a record name or "box/<module path>"
    style: str  # tokens, input, output, module, box, block, op, layout, parameter, mask
    title: str  # first line: "query", "split heads", "encoder.layer.0–11 ×12"
    subtitle: str  # second line: "Linear", "view → transpose", "26 ops"
    shape: tuple[int, ...] | None  # the output shape (the last one of a box)
    shape_text: str  # the output shape(s) as text
    before: tuple[int, ...] | None  # the input shape of a layout chain
    params: int  # parameters of the module or box (one layer of a folded block)
    cluster: tuple[str, ...]  # keys of the nested clusters it sits in, outermost first
    members: tuple[str, ...]  # names of every record drawn as this node (folded copies too)


@dataclass(frozen=True)
class DrawEdge:
    """An edge of the drawing; ``label`` is the shape of the tensor it carries."""

    source: str
    target: str
    label: str


@dataclass(frozen=True)
class ClusterSpec:
    """A module drawn open, as a cluster around its nodes."""

    key: tuple[str, ...]
    label: str
    folded: bool  # a block of folded layers: drawn so it stands out


@dataclass
class Plan:
    """Everything the DOT writer needs, in a stable order."""

    title: str
    dims: Dims
    texts: tuple[str, ...]
    tokens: tuple[tuple[str, ...], ...]
    nodes: list[DrawNode]
    edges: list[DrawEdge]
    clusters: dict[tuple[str, ...], ClusterSpec]
    groups: list[LayerGroup] = field(default_factory=list)


def check_depth(depth: object) -> Depth:
    """``depth`` if it is None, ``"full"`` or an int >= 0.

    Raises:
        InputError: anything else, quoting the value.
    """
    if depth is None or depth == FULL:
        return depth  # type: ignore[return-value]
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise InputError(f"depth must be a whole number >= 0 or 'full'; got {depth!r}")
    return depth


def build_plan(
    graph: TracedGraph,
    *,
    depth: Depth = None,
    fold: bool | None = None,
    expand: Iterable[int] = (),
) -> Plan:
    """Decide the nodes, clusters and edges of a drawing of ``graph``.

    Args:
        graph: a traced ``IntrospectGraph`` (its records are read, nothing is run).
        depth: module levels to open (see the module docstring); None opens all modules.
        fold: fold identical consecutive encoder layers into one ×N block; None means
            yes, except for ``depth="full"``.
        expand: layers to keep open when folding (``(0, -1)``: first and last).

    Raises:
        InputError: a bad depth or an expand index outside the model's layers.
    """
    depth = check_depth(depth)
    full = depth == FULL
    limit = depth if isinstance(depth, int) else None
    drawn = [r for r in graph.records if r.kind not in (KIND_SHAPE, KIND_OTHER)]
    builder = _Builder(
        drawn,
        title=graph.title or "model",
        full=full,
        limit=limit,
        fold=(not full) if fold is None else fold,
        expand=tuple(expand),
    )
    builder.add_tokens(graph.tokens)
    for r in drawn:
        builder.add(r)
    builder.add_outputs(graph.output_names)
    return Plan(
        title=graph.title,
        dims=infer_dims(graph.records),
        texts=graph.texts,
        tokens=graph.tokens,
        nodes=builder.finish_nodes(),
        edges=builder.edges,
        clusters=builder.clusters,
        groups=builder.groups,
    )


class _Builder:
    """Maps each drawn record to a node id, collecting nodes, clusters and edges."""

    def __init__(
        self,
        drawn: Sequence[NodeRecord],
        *,
        title: str,
        full: bool,
        limit: int | None,
        fold: bool,
        expand: tuple[int, ...],
    ) -> None:
        self.title = title
        self.by_name = {r.name: r for r in drawn}
        self.mask_title = mask_title([(r.layer, r.op_type, r.shape) for r in drawn])
        self.full, self.limit = full, limit
        members = layer_members(drawn)
        self.groups = layer_groups(members, fold=fold, expand=expand)
        self.group_of: dict[int, LayerGroup] = {}
        self.canonical: dict[str, str] = {}
        for group in self.groups:
            for index in range(group.first, group.last + 1):
                self.group_of[index] = group
                for copy, original in zip(members[index], members[group.first], strict=True):
                    self.canonical[copy.name] = original.name
        self.chains = {} if full else layout_chains(drawn)
        self.chain_end = {m.name: end for end, chain in self.chains.items() for m in chain}
        self.nodes: dict[str, dict[str, object]] = {}
        self.edges: list[DrawEdge] = []
        self.edge_keys: set[tuple[str, str]] = set()
        self.clusters: dict[tuple[str, ...], ClusterSpec] = {}
        self.node_of: dict[str, str] = {}
        self.mask_first: dict[str, LayerGroup] = {}

    # -- records to nodes ------------------------------------------------------------------

    def add_tokens(self, tokens: tuple[tuple[str, ...], ...]) -> None:
        if tokens:
            self._node(
                TOKENS_ID,
                style="tokens",
                title="tokens",
                subtitle="WordPiece",
                shape=None,
                shape_text="",
                cluster=(),
            )

    def add(self, r: NodeRecord) -> None:
        if r.op == "output":
            return
        node_id = self._place(r)
        self.node_of[r.name] = node_id
        self.nodes[node_id]["members"].append(r.name)  # type: ignore[attr-defined]
        if r.op == "placeholder" and TOKENS_ID in self.nodes:
            self._edge(TOKENS_ID, node_id, "")
        for source in dict.fromkeys(r.inputs):
            if source in self.by_name and not self._inside_fold(source, r):
                origin = self._mask_reference(source, r, node_id) or self.node_of[source]
                self._edge(origin, node_id, self._shape_label(source))

    def _mask_reference(self, source: str, r: NodeRecord, node_id: str) -> str | None:
        """A small "attention mask" node inside the second and later layer blocks.

        The mask feeds every layer; drawn as edges, twelve or twenty-four lines would run
        down the whole page (and slow Graphviz down a lot). The first layer block gets
        the edge; later ones get a reference node, labelled as such.
        """
        index = layer_index(r.layer)
        if self.by_name[source].layer != "mask" or index is None:
            return None
        group = self.group_of[index]
        first = self.mask_first.setdefault(source, group)
        if group is first:
            return None
        reference = f"mask/ref/{group.key}/{node_id}"
        record = self.by_name[source]
        return self._node(
            reference,
            style="maskref",
            title=self.mask_title,
            subtitle="the same mask as above",
            shape=record.shape,
            shape_text=record.shapes,
            cluster=self.nodes[node_id]["cluster"],  # type: ignore[arg-type]
        )

    def add_outputs(self, output_names: Sequence[str]) -> None:
        output = next((r for r in self.by_name.values() if r.op == "output"), None)
        if output is None:
            return
        shapes = dict(_OUTPUT_SHAPES.findall(output.shapes))
        names = list(output_names) or list(shapes)
        for name in names:
            text = shapes.get(name, "")
            self._node(
                f"output/{name}",
                style="output",
                title=name,
                subtitle="output",
                shape=_parse_shape(text),
                shape_text=text,
                cluster=(),
            )
            self.nodes[f"output/{name}"]["members"].append(output.name)  # type: ignore[attr-defined]
        sources = [s for s in output.inputs if s in self.by_name]
        for i, source in enumerate(sources):
            if len(sources) == len(names):
                targets = [names[i]]
            else:
                matching = [n for n in names if shapes.get(n) == self.by_name[source].shapes]
                targets = matching or names
            for name in targets:
                self._edge(self.node_of[source], f"output/{name}", self._shape_label(source))

    def _place(self, r: NodeRecord) -> str:
        """The id of the node ``r`` is drawn as, creating that node when it is new."""
        if r.op == "placeholder":
            return self._node(
                r.name,
                style="input",
                title=r.name,
                subtitle="input",
                shape=r.shape,
                shape_text=r.shapes,
                cluster=(),
            )
        c = self.by_name[self.canonical.get(r.name, r.name)]
        path = self._path(c)
        if self.limit == 0:
            return self._box(
                MODEL_ID, c, title=self.title, subtitle="whole model", cluster=(), style="model"
            )
        if c.layer == "mask" and not self.full:
            return self._box(
                MASK_ID,
                c,
                title=self.mask_title,
                subtitle="mask building",
                cluster=(),
                style="mask",
            )
        is_module = c.op == "call_module"
        level = len(path) if is_module else len(path) + 1
        if self.limit is not None and level > self.limit:
            shown = path[: self.limit]
            group = self._group(c)
            folded = group is not None and group.count > 1 and len(shown) == 1
            if group is not None and len(shown) == 1:
                title = group.label
            else:
                title = ".".join(shown[1:]) if len(shown) > 1 else shown[0]
            return self._box(
                "box/" + ".".join(self._keys(shown)),
                c,
                title=title,
                subtitle="each layer" if folded else "module",
                cluster=self._clusters(path, self.limit - 1),
                style="block" if folded else "box",
            )
        cluster = self._clusters(path, len(path) - 1 if is_module else len(path))
        if c.name in self.chain_end:
            return self._chain(self.chains[self.chain_end[c.name]], cluster)
        return self._node(
            c.name,
            style=_style(c),
            title=self._title(c),
            subtitle=_subtitle(c),
            shape=c.shape,
            shape_text=c.shapes,
            cluster=cluster,
            params=c.params,
        )

    def _chain(self, chain: list[NodeRecord], cluster: tuple[str, ...]) -> str:
        first, last = chain[0], chain[-1]
        tensor_inputs = [n for n in first.inputs if n in self.by_name]
        before = self.by_name[tensor_inputs[0]].shape if tensor_inputs else None
        ops = [m.op_type for m in chain]
        return self._node(
            last.name,
            style="layout",
            title=layout_title(ops, before, last.shape),
            subtitle=" → ".join(ops),
            shape=last.shape,
            shape_text=last.shapes,
            cluster=cluster,
            before=before,
        )

    def _box(
        self,
        node_id: str,
        c: NodeRecord,
        *,
        title: str,
        subtitle: str,
        cluster: tuple[str, ...],
        style: str = "box",
    ) -> str:
        """A node standing for many records; its shape is that of the last tensor in it."""
        if node_id not in self.nodes:
            self._node(
                node_id,
                style=style,
                title=title,
                subtitle=subtitle,
                shape=None,
                shape_text="",
                cluster=cluster,
            )
            self.nodes[node_id]["ops"] = 0
        node = self.nodes[node_id]
        if c.name not in node.setdefault("seen", set()):  # type: ignore[operator]
            node["seen"].add(c.name)  # type: ignore[attr-defined]
            node["params"] = int(node["params"]) + c.params  # type: ignore[call-overload]
            node["ops"] = int(node["ops"]) + 1  # type: ignore[call-overload]
            if c.kind == KIND_TENSOR:
                node["shape"], node["shape_text"] = c.shape, c.shapes
        return node_id

    def _node(
        self,
        node_id: str,
        *,
        style: str,
        title: str,
        subtitle: str,
        shape: tuple[int, ...] | None,
        shape_text: str,
        cluster: tuple[str, ...],
        params: int = 0,
        before: tuple[int, ...] | None = None,
    ) -> str:
        if node_id not in self.nodes:
            self.nodes[node_id] = dict(
                id=node_id,
                style=style,
                title=title,
                subtitle=subtitle,
                shape=shape,
                shape_text=shape_text,
                before=before,
                params=params,
                cluster=cluster,
                members=[],
            )
        return node_id

    def finish_nodes(self) -> list[DrawNode]:
        nodes = []
        for node in self.nodes.values():
            fields = {k: v for k, v in node.items() if k not in ("ops", "seen")}
            if "ops" in node:
                fields["subtitle"] = f"{node['subtitle']}, {node['ops']} ops"
            fields["members"] = tuple(fields["members"])  # type: ignore[arg-type]
            nodes.append(DrawNode(**fields))  # type: ignore[arg-type]
        return nodes

    # -- paths and clusters ----------------------------------------------------------------

    def _path(self, r: NodeRecord) -> tuple[str, ...]:
        """Module levels of ``r``: the block (``embeddings``, ``encoder.layer.3``, a head
        module) first, then the modules inside it: ``("encoder.layer.3", "attention", "self")``.
        """
        if r.layer == "mask":
            return ("mask",)
        if r.layer in ("embeddings", "pooler") or layer_index(r.layer) is not None:
            head, found, rest = f".{r.module}.".partition(f".{r.layer}.")
            return (r.layer, *module_components(rest)) if found else (r.layer,)
        return module_components(r.module)

    def _group(self, r: NodeRecord) -> LayerGroup | None:
        index = layer_index(r.layer)
        return self.group_of.get(index) if index is not None else None

    def _keys(self, path: tuple[str, ...]) -> tuple[str, ...]:
        """``path`` with a folded layer's name replaced by its block's (``encoder.layer.1-10``)."""
        index = layer_index(path[0]) if path else None
        if index is None:
            return path
        return (self.group_of[index].key, *path[1:])

    def _clusters(self, path: tuple[str, ...], open_levels: int) -> tuple[str, ...]:
        """Register the clusters around a node whose first ``open_levels`` modules are open."""
        keys = self._keys(path)
        index = layer_index(path[0]) if path else None
        chain: list[str] = []
        if index is not None and open_levels >= 0:
            chain.append(ENCODER)
            self._cluster((ENCODER,), "encoder", folded=False)
        for level in range(1, open_levels + 1):
            key = tuple(chain[:1]) + keys[:level] if index is not None else keys[:level]
            if level == 1 and index is not None:
                group = self.group_of[index]
                label, folded = group.label, group.count > 1
            elif level == 1:
                label, folded = (self.mask_title if path[0] == "mask" else path[0]), False
            else:
                label, folded = ".".join(path[1:level]), False
            self._cluster(key, label, folded=folded)
        if index is not None:
            return (ENCODER,) + tuple(keys[:open_levels])
        return tuple(keys[:open_levels])

    def _cluster(self, key: tuple[str, ...], label: str, *, folded: bool) -> None:
        if key not in self.clusters:
            self.clusters[key] = ClusterSpec(key, label, folded)

    # -- edges -----------------------------------------------------------------------------

    def _inside_fold(self, source: str, r: NodeRecord) -> bool:
        """An edge from one folded layer to the next: drawn once, as the block itself."""
        a, b = layer_index(self.by_name[source].layer), layer_index(r.layer)
        if a is None or b is None or a == b:
            return False
        return self.group_of[a] is self.group_of[b]

    def _shape_label(self, source: str) -> str:
        record = self.by_name[source]
        return record.shapes if record.kind == KIND_TENSOR else ""

    def _edge(self, source: str, target: str, label: str) -> None:
        if source != target and (source, target) not in self.edge_keys:
            self.edge_keys.add((source, target))
            self.edges.append(DrawEdge(source, target, label))

    def _title(self, r: NodeRecord) -> str:
        if r.op == "call_module":
            return r.module.rpartition(".")[2] or r.module
        if r.op == "get_attr":
            return r.target.rpartition(".")[2]
        inputs = [self.by_name[n] for n in r.inputs if n in self.by_name]
        return op_title(
            r.op_type, r.module, [i.shape for i in inputs], r.shape, [i.name for i in inputs]
        )


def _style(r: NodeRecord) -> str:
    if r.op == "call_module":
        return "module"
    if r.op == "get_attr":
        return "parameter" if r.op_type == "parameter" else "buffer"
    return "op"


def _subtitle(r: NodeRecord) -> str:
    if r.op == "call_module":
        return r.op_type
    if r.op == "get_attr":
        return r.op_type
    return ""


def _parse_shape(text: str) -> tuple[int, ...] | None:
    numbers = re.findall(r"\d+", text)
    return tuple(int(n) for n in numbers) if text.startswith("(") else None
