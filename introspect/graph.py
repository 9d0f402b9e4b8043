"""``IntrospectGraph``: a traced model with shapes on every node, as tables and a graph.

Example::

    >>> import introspect
    >>> loaded = introspect.load_model("minilm", head="sequence-classification")
    >>> inputs = introspect.tokenize(loaded.tokenizer)  # the tutorial's two sentences
    >>> graph = introspect.trace(loaded.model, inputs)
    >>> graph.layers[["layer", "nodes", "output_shape"]].head(3)
             layer  nodes output_shape
    0       inputs      3       (2, 9)
    1   embeddings     12  (2, 9, 384)
    2         mask     22  (2, 1, 9, 9)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from introspect.errors import InputError
from introspect.models.load import TokenizedInputs
from introspect.run.modes import set_mode
from introspect.tracing.records import KIND_SHAPE, KIND_TENSOR, NodeRecord
from introspect.tracing.tracer import (
    CACHE_OFF_NOTE,
    Decision,
    cache_off,
    holds_trace_lock,
    trace_module,
)

if TYPE_CHECKING:
    import networkx
    import pandas

# HF skips the attention mask at run time when it is all ones (sdpa); while tracing it
# always builds one, so a single graph serves padded and unpadded batches alike.
MASK_NOTE = (
    "the attention mask is always built in the graph; HF skips it at run time when no "
    "token is padded, with identical outputs"
)


@dataclass
class IntrospectGraph:
    """A traced model: the GraphModule, one record per node, and the tokens it saw.

    Attributes:
        gm: the ``torch.fx.GraphModule``; call it with the inputs by name.
        records: one ``NodeRecord`` per node, in graph order.
        input_names: the placeholders, in order (tokenizer output first in the flow).
        output_names: the keys of the dict the graph returns (``logits``, ...).
        tokens: WordPiece tokens per input row, when the inputs came from the tokenizer.
        texts: the texts behind the tokens.
        decisions: Python branches taken on traced values while tracing.
        notes: what a user should know about this graph (specialisations, init).
    """

    gm: torch.fx.GraphModule
    records: list[NodeRecord]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    tokens: tuple[tuple[str, ...], ...] = ()
    texts: tuple[str, ...] = ()
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    title: str = ""

    @property
    def nodes(self) -> pandas.DataFrame:
        """One row per node, in graph order (every field of ``NodeRecord``)."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.records])

    @property
    def layers(self) -> pandas.DataFrame:
        """One row per layer in order of first appearance: nodes, params, FLOPs, output."""
        import pandas as pd

        return pd.DataFrame([asdict(row) for row in summarise_layers(self.records)])

    def record(self, name: str) -> NodeRecord:
        """The record of the node called ``name``."""
        for r in self.records:
            if r.name == name:
                return r
        raise KeyError(f"no node named {name!r} in this graph")

    def to_networkx(self) -> networkx.DiGraph:
        """A DiGraph: nodes carry the record fields, edges the shape that flows along them."""
        import networkx as nx

        graph = nx.DiGraph(title=self.title)
        by_name = {r.name: r for r in self.records}
        for r in self.records:
            attributes = asdict(r)
            attributes["shape"] = r.shapes  # GraphML takes scalars, not tuples
            attributes["inputs"] = ",".join(r.inputs)
            graph.add_node(r.name, **attributes)
        for r in self.records:
            for source in r.inputs:
                flowing = by_name[source].shapes or by_name[source].value
                graph.add_edge(source, r.name, shape=flowing)
        return graph

    def draw(self, **options: Any) -> Any:
        """A Graphviz drawing of the flow (see ``introspect.render``), at most a notebook
        cell wide unless ``max_width`` says otherwise (``None``: as wide as it lays out)."""
        from introspect.render import NOTEBOOK_WIDTH, draw_graph

        options.setdefault("max_width", NOTEBOOK_WIDTH)
        return draw_graph(self, **options)

    def _repr_html_(self) -> str:
        tensors = sum(r.kind == KIND_TENSOR for r in self.records)
        shapes = sum(r.kind == KIND_SHAPE for r in self.records)
        head = (f"<p><b>{_html(self.title or 'IntrospectGraph')}</b>: {len(self.records)} nodes "
                f"({tensors} tensors, {shapes} shape bookkeeping); outputs: "
                f"{_html(', '.join(self.output_names))}</p>")
        return head + self.layers.to_html(index=False)

    @property
    def total_params(self) -> int:
        """Parameters of the traced module (each tensor once), as torchinfo's ``total_params``."""
        return sum(p.numel() for p in self.gm.parameters())

    @property
    def total_flops(self) -> int:
        """FLOPs of every linear, matmul and attention (2 x M x N x K), for these inputs."""
        return sum(r.flops for r in self.records)

    def summary(self, depth: int | None = 2, width: int = 100, *, fold: bool = True) -> str:
        """A torchinfo-like summary: one row per module down to ``depth`` levels (None: every
        level), identical encoder layers folded ×N, then the totals (parameters, bytes,
        FLOPs, nodes); at most ``width`` characters a line."""
        from introspect.summary import summary_text

        return summary_text(self, depth, width, fold=fold)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        shapes = sum(r.kind == KIND_SHAPE for r in self.records)
        return (f"IntrospectGraph({self.title or 'model'}: {len(self.records)} nodes "
                f"({shapes} shape bookkeeping), {self.total_params:,} parameters, "
                f"{self.total_flops:,} FLOPs, inputs={list(self.input_names)}, "
                f"outputs={list(self.output_names)})")


@dataclass(frozen=True)
class LayerSummary:
    """One row of ``IntrospectGraph.layers``."""

    layer: str
    nodes: int  # every node in the layer
    tensor_nodes: int  # nodes whose output is a tensor
    params: int  # parameters used by the layer's nodes (a tied weight counts at each use)
    flops: int  # estimated FLOPs of the layer's matmuls, linears and attention
    output_shape: str  # shape of the last tensor the layer produces
    first_node: str
    last_node: str


def summarise_layers(records: list[NodeRecord]) -> list[LayerSummary]:
    """Group records by layer, keeping the order in which layers first appear."""
    groups: dict[str, list[NodeRecord]] = {}
    for r in records:
        groups.setdefault(r.layer, []).append(r)
    rows = []
    for layer, members in groups.items():
        tensors = [r for r in members if r.kind == KIND_TENSOR]
        rows.append(LayerSummary(
            layer=layer,
            nodes=len(members),
            tensor_nodes=len(tensors),
            params=sum(r.params for r in members),
            flops=sum(r.flops for r in members),
            output_shape=tensors[-1].shapes if tensors else "",
            first_node=members[0].name,
            last_node=members[-1].name,
        ))
    return rows


@holds_trace_lock  # thread safety: fx patches process-wide state (tracer.py)
def trace(model: torch.nn.Module, inputs: TokenizedInputs | Mapping[str, torch.Tensor],
          *, title: str = "", cache: bool = True) -> IntrospectGraph:
    """Trace ``model`` with torch.fx and annotate every node with its shapes.

    Args:
        model: an HF ``BertFor*`` or any module whose ``forward`` takes the inputs by name.
        inputs: ``introspect.tokenize(...)`` output (keeps the tokens for drawings) or a
            mapping of tensors by input name.
        title: a name for tables and drawings (default: the model's class).
        cache: reuse a graph traced before for the same model class, configuration and
            input shapes (``introspect.tracing.cache``), bound to this model's weights.

    Returns:
        An ``IntrospectGraph``.

    Raises:
        TraceError: the model cannot be traced (names the node and the cause).
        InputError: the inputs are empty or not tensors.
    """
    tokens: tuple[tuple[str, ...], ...] = ()
    texts: tuple[str, ...] = ()
    notes: list[str] = []
    if isinstance(inputs, TokenizedInputs):
        tokens, texts, notes = inputs.tokens, inputs.texts, list(inputs.notes)
        tensors = dict(inputs.tensors)
    else:
        tensors = dict(inputs)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise InputError("trace needs a non-empty mapping of input names to tensors")
    was_training = model.training
    set_mode(model, False)  # train/eval is fixed at trace time; trace what people run
    try:
        result = trace_module(model, tensors, cache=cache)  # ShapeProp ran on trace values
    finally:
        set_mode(model, was_training)
    records = result.records
    if any(r.layer == "mask" for r in records):
        notes.append(MASK_NOTE)
    if cache_off(model, tensors):
        notes.append(CACHE_OFF_NOTE)
    return IntrospectGraph(result.gm, records, result.input_names, result.output_names,
                           tokens, texts, result.decisions, notes + result.notes,
                           title or type(model).__name__)


def _html(text: str) -> str:
    import html

    return html.escape(text)
