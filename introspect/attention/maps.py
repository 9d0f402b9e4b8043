"""Attention probabilities of every layer and head, read from a model's own traced graph.

HF's ``output_attentions`` needs eager attention; under ``sdpa`` (the default) the
probabilities never exist as a tensor. Here the model is traced once with torch.fx and
the graph is rewritten so that it returns them instead of its outputs:

- at each ``scaled_dot_product_attention`` node, a node computing
  ``softmax(q·kᵀ·scale + mask)`` from that node's own query, key, mask and scale;
- at each softmax over the last axis of a 4-D tensor (eager attention), that softmax.

So sdpa and eager models, HF and the from-scratch BERT alike, give the probabilities from
one run of the traced graph; the layers after the last attention are dropped as dead code.

Example::

    >>> loaded = introspect.load_model("bert-tiny")
    >>> maps = introspect.attention(loaded.model, introspect.tokenize(loaded.tokenizer))
    >>> maps.probs.shape                     # (layers, batch, heads, query, key)
    torch.Size([2, 2, 2, 9, 9])
    >>> maps.frame().columns.tolist()
    ['layer', 'head', 'batch', 'query', 'query_token', 'key', 'key_token', 'weight']
"""

from __future__ import annotations

import copy
import inspect
import keyword
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.nn.functional as F

from introspect.attention.neurons import head_vectors, query_key_of
from introspect.attention.page import html_page
from introspect.attention.records import AttentionRecord
from introspect.attention.stats import head_stats
from introspect.attention.views import render_view
from introspect.errors import InputError, TraceError
from introspect.models.load import TokenizedInputs
from introspect.run.modes import set_mode
from introspect.tracing.tracer import holds_trace_lock

if TYPE_CHECKING:
    import pandas

_SOFTMAX_FUNCTIONS = (F.softmax, torch.softmax, torch.Tensor.softmax)


class AttentionMaps(AttentionRecord):
    """The attention record with its pictures: ``stats()``, ``svg()`` and ``html()``."""

    def stats(self) -> pandas.DataFrame:
        """Per-head statistics (entropy, attention to [CLS]/[SEP]/self/neighbours, max).

        See ``introspect.attention.stats.head_stats``.
        """
        return head_stats(self)

    def svg(self, view: str = "head", **options: Any) -> str:
        """A static SVG picture: ``head``, ``matrix`` or ``model`` view (see ``views``)."""
        return render_view(self, view, **options)

    def html(self, batch: int = 0) -> str:
        """A self-contained HTML page to pick layer and head (see ``page``)."""
        return html_page(self, batch=batch)

    def _repr_html_(self) -> str:
        return self.svg("model") if self.num_layers * self.num_heads <= 144 else repr(self)


def sdpa_probabilities(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                       is_causal: bool = False, scale: float | None = None,
                       enable_gqa: bool = False) -> torch.Tensor:
    """The probabilities ``F.scaled_dot_product_attention`` weighs ``value`` with.

    Computed as HF's eager attention does (matmul, scale, additive mask, softmax), so an
    sdpa model gives what the same model under eager returns as ``attentions``. Dropout is
    left out: the maps are read in eval mode.
    """
    del value, dropout_p  # same signature as sdpa, so the node's arguments pass unchanged
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention: share key heads
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # (B, nh, S, S)
    S, T = scores.shape[-2], scores.shape[-1]
    if is_causal:
        causal = torch.ones(S, T, dtype=torch.bool, device=scores.device).tril()
        attn_mask = causal if attn_mask is None else attn_mask & causal
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
            attn_mask = torch.where(attn_mask, zero, torch.finfo(scores.dtype).min)
        scores = scores + attn_mask
    return F.softmax(scores, dim=-1)


def is_sdpa(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is F.scaled_dot_product_attention


def is_attention_softmax(node: torch.fx.Node) -> bool:
    """A softmax over the last axis of a 4-D tensor: eager attention's probabilities."""
    is_softmax = (node.op == "call_function" and node.target in _SOFTMAX_FUNCTIONS) or \
        (node.op == "call_method" and node.target == "softmax")
    if not is_softmax:
        return False
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    meta = node.meta.get("tensor_meta")
    ndim = len(meta.shape) if meta is not None and hasattr(meta, "shape") else None
    return ndim == 4 and dim in (-1, 3)


def attention_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The sdpa calls and attention softmaxes of a graph, in execution order."""
    return [n for n in graph.nodes if is_sdpa(n) or is_attention_softmax(n)]


def probability_graph(gm: torch.fx.GraphModule) -> tuple[
        torch.fx.GraphModule, tuple[str, ...], tuple[float | None, ...] | None]:
    """A copy of ``gm`` that returns a tuple of attention probabilities, one per layer,
    followed (where every layer shows them) by each layer's queries, then its keys.

    Returns:
        The rewritten GraphModule (sharing ``gm``'s parameters); per layer, the module
        path the attention runs in; per layer, the scale of the scores (None: sdpa's
        default), or None when the outputs hold no queries and keys.

    Raises:
        TraceError: the graph holds no attention (no sdpa call, no 4-D softmax).
    """
    graph = copy.deepcopy(gm.graph)
    found = attention_nodes(graph)
    if not found:
        raise TraceError("found no attention in the traced graph: no "
                         "scaled_dot_product_attention call and no softmax over a 4-D tensor")
    vectors = [query_key_of(n) for n in found]
    outputs = probabilities_of(graph, found)
    scales: tuple[float | None, ...] | None = None
    if all(v is not None for v in vectors):
        outputs += [v.query for v in vectors if v] + [v.key for v in vectors if v]
        scales = tuple(v.scale for v in vectors if v)
    rewritten = returning(gm, graph, outputs, class_name=f"{type(gm).__name__}Attention")
    return rewritten, tuple(_module_of(n) for n in found), scales


def probabilities_of(graph: torch.fx.Graph,
                     found: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The probabilities of each attention node of ``graph``: a softmax's own output, or
    for an sdpa call a node inserted after it that computes them from its arguments."""
    probabilities = []
    for node in found:
        if is_sdpa(node):
            with graph.inserting_after(node):
                node = graph.call_function(sdpa_probabilities, node.args, dict(node.kwargs))
        probabilities.append(node)
    return probabilities


def returning(gm: torch.fx.GraphModule, graph: torch.fx.Graph, nodes: list[torch.fx.Node], *,
              class_name: str = "GraphModule") -> torch.fx.GraphModule:
    """A module of ``graph`` (a copy of ``gm``'s, sharing its parameters) that returns the
    values of ``nodes`` as a tuple, and computes nothing they do not need (the layers after
    the last attention)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    graph.erase_node(output)
    graph.output(tuple(nodes))
    rewritten = torch.fx.GraphModule(_plainly_named(gm, graph), graph, class_name=class_name)
    rewritten.graph.eliminate_dead_code()
    rewritten.recompile()
    return rewritten


def _plainly_named(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.nn.Module:
    """A root holding what ``graph`` reads of ``gm`` under names of our own (``module_0``,
    ``attribute_0``), with ``graph`` rewritten to use them: the code torch.fx generates
    for the module is then made of our names only.

    fx writes a ``call_module``/``get_attr`` target into the ``forward`` it compiles, as
    ``getattr(self, "...")`` where a part is no identifier, unescaped: a model's module
    named with a quote or a backslash (``add_module('act\\N', ...)``) made that code a
    SyntaxError, or code of the name's choosing. A constant argument is written with its
    own ``repr``, so a ``str`` subclass becomes the plain ``str`` it holds; a method name
    that is no identifier is called through ``getattr`` on a plain string.
    """
    root = torch.nn.Module()
    renamed: dict[tuple[str, str], str] = {}
    for node in graph.nodes:
        if node.op in ("call_module", "get_attr"):
            key = (node.op, str(node.target))
            if key not in renamed:
                name = f"{'module' if node.op == 'call_module' else 'attribute'}_{len(renamed)}"
                value = _attribute(gm, key[1])
                if isinstance(value, torch.nn.Module):
                    root.add_module(name, value)
                elif isinstance(value, torch.nn.Parameter):
                    root.register_parameter(name, value)
                elif isinstance(value, torch.Tensor):
                    root.register_buffer(name, value)
                else:
                    setattr(root, name, value)
                renamed[key] = name
            node.target = renamed[key]
        elif node.op == "call_method" and not _plain_identifier(node.target):
            method = _plain(node.target)
            node.op, node.target = "call_function", _call_method
            node.args = (method, *node.args)
        node.args = torch.fx.node.map_aggregate(node.args, _plain)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, _plain)
    return root


def _attribute(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _plain_identifier(name: Any) -> bool:
    return type(name) is str and name.isidentifier() and not keyword.iskeyword(name)


def _plain(value: Any) -> Any:
    """A ``str`` subclass as the plain ``str`` it holds (fx writes constants by ``repr``)."""
    return str.__str__(value) if isinstance(value, str) and type(value) is not str else value


def _call_method(name: str, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.<name>(*args, **kwargs)`` for a method name fx cannot write as source."""
    return getattr(obj, name)(*args, **kwargs)


def _module_of(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return str(path)


@holds_trace_lock  # thread safety: fx patches process-wide state (tracer.py)
def attention(model: torch.nn.Module, inputs: TokenizedInputs | Mapping[str, torch.Tensor],
              *, title: str = "") -> AttentionMaps:
    """The attention probabilities of every layer and head of ``model`` on ``inputs``.

    Args:
        model: an HF ``BertFor*`` or cousin (RoBERTa, DistilBERT, ELECTRA, ALBERT, GPT-2,
            Llama; sdpa or eager), the from-scratch BERT, any module the tracer handles,
            or an already traced ``torch.fx.GraphModule``. A layer is a call (ALBERT's
            shared layer gives one map per call); heads are query heads (grouped-query
            attention shares a key head among several).
        inputs: ``introspect.tokenize(...)`` output (keeps the tokens) or a mapping of
            tensors by input name; the model gets those its ``forward`` takes.
        title: a name for pictures and tables (default: the model's class).

    Returns:
        ``AttentionMaps`` with ``probs`` ``(layers, batch, heads, query, key)``.

    Raises:
        InputError: empty inputs or inputs that are not tensors.
        TraceError: the model cannot be traced, or holds no attention.

    Example::

        >>> maps = introspect.attention(model, inputs)
        >>> maps.head(layer=0, head=8)       # (query, key) of the real tokens of row 0
    """
    from introspect.tracing.tracer import trace_module

    tensors, tokens, texts, notes = _unpack(inputs)
    traced = isinstance(model, torch.fx.GraphModule)
    taken = {n.target: tensors[n.target] for n in model.graph.nodes  # type: ignore[union-attr]
             if n.op == "placeholder" and n.target in tensors} if traced \
        else _accepted(model, tensors)
    was_training = model.training
    set_mode(model, False)  # maps are read in eval mode: no dropout on the probabilities
    try:
        gm = model if traced else trace_module(model, taken).gm
        rewritten, modules, scales = probability_graph(gm)  # type: ignore[arg-type]
        with torch.no_grad():  # the rewritten graph calls the model's own modules
            per_layer = rewritten(**taken)
    finally:
        set_mode(model, was_training)
    queries = keys = None
    if scales is not None:
        L = len(modules)
        per_layer, queries, keys, used = _vectors(per_layer, L, scales)
        scales = used
    shapes = {tuple(p.shape) for p in per_layer}
    if len(shapes) != 1:
        raise TraceError(f"the attention maps of the layers differ in shape: {sorted(shapes)}")
    probs = torch.stack([p.float() for p in per_layer])  # (L, B, nh, S, S)
    B, S = probs.shape[1], probs.shape[-1]
    keep = _keep_mask(tensors, B, S)
    if not tokens:
        ids = tensors.get("input_ids")
        tokens = tuple(tuple(str(i) for i in row) for row in ids.reshape(B, S).tolist()) \
            if ids is not None and ids.numel() == B * S else \
            tuple(tuple(str(i) for i in range(S)) for _ in range(B))
    return AttentionMaps(probs, tokens, keep, modules, texts,
                         title or type(model).__name__, notes, queries, keys,
                         tuple(s for s in scales or () if s is not None))


def _vectors(outputs: Any, layers: int, scales: tuple[float | None, ...]) -> tuple[
        Any, torch.Tensor | None, torch.Tensor | None, tuple[float, ...]]:
    """The probabilities, and the stacked queries and keys of ``outputs`` (None when
    their shapes differ from layer to layer, or from the probabilities')."""
    probs, qs, ks = outputs[:layers], outputs[layers:2 * layers], outputs[2 * layers:]
    paired = [head_vectors(q, k, s) for q, k, s in zip(qs, ks, scales, strict=True)]
    if len({(q.shape, k.shape) for q, k, _ in paired}) != 1 or \
            paired[0][0].shape[:-1] != probs[0].shape[:-1]:
        return probs, None, None, ()
    return (probs, torch.stack([q for q, _, _ in paired]), torch.stack([k for _, k, _ in paired]),
            tuple(s for _, _, s in paired))


def _unpack(inputs: TokenizedInputs | Mapping[str, torch.Tensor]) -> tuple[
        dict[str, torch.Tensor], tuple[tuple[str, ...], ...], tuple[str, ...], list[str]]:
    if isinstance(inputs, TokenizedInputs):
        return dict(inputs.tensors), inputs.tokens, inputs.texts, list(inputs.notes)
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError("attention needs inputs: introspect.tokenize(...) output or a non-empty "
                         f"mapping of input names to tensors, got {type(inputs).__name__}")
    bad = [str(k) for k, v in inputs.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise InputError(f"inputs must be tensors; {', '.join(bad)} is not")
    return dict(inputs), (), (), []


def _accepted(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs ``model.forward`` takes by name (all of them when it takes ``**kwargs``)."""
    parameters = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return tensors
    taken = {name: t for name, t in tensors.items() if name in parameters}
    if not taken:
        raise InputError(f"{type(model).__name__}.forward takes none of the inputs "
                         f"{', '.join(tensors)}")
    return taken


def _keep_mask(tensors: Mapping[str, torch.Tensor], batch: int, seq: int) -> torch.Tensor:
    """``(batch, seq)`` True for real tokens; all True without an attention mask."""
    mask = tensors.get("attention_mask")
    if mask is None or mask.numel() != batch * seq:
        return torch.ones(batch, seq, dtype=torch.bool)
    return mask.reshape(batch, seq).bool()
