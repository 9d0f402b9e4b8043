"""Shapes on every node: run ShapeProp, then turn each fx node into a ``NodeRecord``.

``torch.fx.passes.shape_prop.ShapeProp`` runs the GraphModule on real inputs and writes
``node.meta["tensor_meta"]`` for tensor outputs. ``ValueShapeProp`` keeps, in addition,
the small non-tensor values (ints, ``torch.Size``) so that shape-bookkeeping nodes are
recorded as such, with their value, instead of being dropped.

Example::

    >>> records = annotate_shapes(gm, [input_ids, token_type_ids, attention_mask])
    >>> [r.shape for r in records if r.op_type == "scaled_dot_product_attention"][0]
    (2, 12, 9, 64)
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_aggregate
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata, _extract_tensor_metadata

from introspect.tracing.calls import label_repeated_calls
from introspect.tracing.records import (
    KIND_MULTI,
    KIND_OTHER,
    KIND_OUTPUT,
    KIND_SHAPE,
    KIND_TENSOR,
    NodeRecord,
)

_LAYER_INDEX = re.compile(r"(?:^|\.)(?:encoder\.)?(?:layer|layers|h|blocks)\.(\d+)(?:\.|$)")


class ValueShapeProp(ShapeProp):
    """ShapeProp that also keeps int / ``torch.Size`` results in ``node.meta["value"]``.

    A node that raises raises as it is, unprinted: ShapeProp's own ``run_node`` prints the
    traceback before raising, and a replay that fails (a recording whose calls two worker
    threads interleaved) falls back to what the plain calls prove, with a traceback on the
    terminal beside a one-line error (probe round o). It is ShapeProp's bookkeeping
    without that print, for the real values these run (no fake mode)."""

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super(ShapeProp, self).run_node(n)  # (the next after ShapeProp: its run)
        found = False

        def metadata(value: Any) -> Any:
            nonlocal found
            if isinstance(value, torch.Tensor):
                found = True
                return _extract_tensor_metadata(value)
            return value

        meta = map_aggregate(result, metadata)
        if found:
            n.meta["tensor_meta"] = meta
        n.meta["type"] = type(result)
        if _is_shape_value(result):
            n.meta["value"] = result
        return result


class _TraceTimeValues(torch.fx.Interpreter):
    """An Interpreter whose nodes "run" by returning the value computed while tracing."""

    values: dict[torch.fx.Node, Any]

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "output":  # the graph's dict of outputs, from the values it returns
            return torch.fx.node.map_arg(n.args[0], self.values.__getitem__)
        return self.values[n]


class TraceTimeShapeProp(ValueShapeProp, _TraceTimeValues):
    """``ShapeProp`` on the values a trace already computed (FakeTensors, ints, sizes).

    ShapeProp writes ``tensor_meta`` (and ``ValueShapeProp`` the ``value`` of shape
    bookkeeping) as it always does; only running each node is replaced by looking up its
    trace-time value, so no forward pass is spent for shapes.
    """

    def __init__(self, gm: torch.fx.GraphModule, values: dict[torch.fx.Node, Any]) -> None:
        self.values = values
        super().__init__(gm)


def propagate_trace_values(gm: torch.fx.GraphModule, values: dict[torch.fx.Node, Any]) -> None:
    """Write ShapeProp's metadata on every node of ``gm`` from its trace-time ``values``.

    Raises:
        RuntimeError: ShapeProp's own error, naming the node that failed.
    """
    placeholders = [values[n] for n in gm.graph.nodes if n.op == "placeholder"]
    TraceTimeShapeProp(gm, values).propagate(*placeholders)


def _is_shape_value(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, (tuple, list)) and value:  # torch.Size is a tuple
        return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return False


def annotate_shapes(gm: torch.fx.GraphModule, args: Sequence[torch.Tensor]) -> list[NodeRecord]:
    """Run ShapeProp on ``gm`` with ``args`` (in placeholder order) and record every node.

    Raises:
        RuntimeError: ShapeProp's own error, naming the node that failed.
    """
    with torch.no_grad():
        ValueShapeProp(gm).propagate(*args)
    return node_records(gm)


def node_records(gm: torch.fx.GraphModule) -> list[NodeRecord]:
    """One record per node, from the shapes a ``ValueShapeProp`` run left in ``node.meta``."""
    modules = dict(gm.named_modules())
    backbone = backbone_path(gm)
    prefix = (layer_prefix(modules[backbone]) if backbone is not None else None) \
        or DEFAULT_LAYER_PREFIX
    records = [_record(index, node, gm, modules, backbone, prefix)
               for index, node in enumerate(gm.graph.nodes)]
    if prefix == "h":
        records = _embeddings_summed_in_backbone(records)
    # ALBERT runs one shared layer N times: its nodes are labelled by call (encoder.layer.N)
    return label_repeated_calls(records, gm)


def refresh_records(records: Sequence[NodeRecord], gm: torch.fx.GraphModule,
                    ) -> list[NodeRecord]:
    """``records`` after a real run's ShapeProp: rebuilt only where the shapes differ.

    A trace is specialised on its example inputs, so a run on those inputs sees the
    shapes the trace saw and nothing is rebuilt; a record whose shapes, dtype or
    bookkeeping value did change is built again from the node's new metadata.
    """
    nodes = list(gm.graph.nodes)
    changed = [i for i, (record, node) in enumerate(zip(records, nodes, strict=True))
               if _seen(node) != (record.shapes, record.dtype, record.value)]
    if not changed:
        return list(records)
    fresh = node_records(gm)  # layer labels may hang on shapes: label the graph as a whole
    changed_at = set(changed)
    return [fresh[i] if i in changed_at else record for i, record in enumerate(records)]


def _seen(node: torch.fx.Node) -> tuple[str, str, str]:
    """What a record says of a node's outputs: shapes text, dtype and bookkeeping value."""
    meta = node.meta.get("tensor_meta")
    metas = _tensor_metas(meta)
    value = node.meta.get("value")
    dtype = str(metas[0][1].dtype).removeprefix("torch.") if metas else ""
    return (_shapes_text(meta, metas), dtype,
            _value_text(value) if value is not None and not metas else "")


def _embeddings_summed_in_backbone(records: list[NodeRecord]) -> list[NodeRecord]:
    """GPT-2 adds token and position embeddings (and reshapes the final norm's output) in
    its backbone's own forward: those (B, S, H) nodes belong to the block that feeds them
    (``embeddings``, ``ln_f``), not to the mask."""
    layers = {r.name: r.layer for r in records}
    relabelled = []
    for r in records:
        feeding = [layers[n] for n in r.inputs if layers.get(n) not in (None, "mask", "inputs")]
        if r.layer == "mask" and r.kind == KIND_TENSOR and r.shape is not None \
                and len(r.shape) == 3 and feeding:
            r = dataclasses.replace(r, layer=feeding[0])
            layers[r.name] = r.layer
        relabelled.append(r)
    return relabelled


def _record(index: int, node: torch.fx.Node, gm: torch.fx.GraphModule,
            modules: dict[str, torch.nn.Module], backbone: str | None,
            prefix: str = "encoder.layer") -> NodeRecord:
    metas = _tensor_metas(node.meta.get("tensor_meta"))
    value = node.meta.get("value")
    first = metas[0][1] if metas else None
    module = _module_path(node)
    return NodeRecord(
        index=index,
        name=node.name,
        op=node.op,
        target=_target_name(node),
        op_type=_op_type(node, modules),
        module=module,
        layer=layer_of(node, module, backbone, prefix),
        kind=_kind(node, metas, value),
        shape=tuple(first.shape) if first is not None else None,
        shapes=_shapes_text(node.meta.get("tensor_meta"), metas),
        dtype=str(first.dtype).removeprefix("torch.") if first is not None else "",
        numel=sum(math.prod(m.shape) for _, m in metas),
        nbytes=sum(math.prod(m.shape) * _itemsize(m.dtype) for _, m in metas),
        params=_params(node, gm, modules),
        flops=estimate_flops(node, modules),
        inputs=tuple(n.name for n in node.all_input_nodes),
        value=_value_text(value) if value is not None and not metas else "",
    )


def _tensor_metas(meta: Any, prefix: str = "") -> list[tuple[str, TensorMetadata]]:
    """Flatten a (possibly nested) tensor_meta into (path, TensorMetadata) pairs."""
    if meta is None:
        return []
    if isinstance(meta, TensorMetadata):
        return [(prefix, meta)]
    if isinstance(meta, dict):
        items: Any = meta.items()
    elif isinstance(meta, (tuple, list)):
        items = enumerate(meta)
    else:
        return []
    flat = []
    for key, sub in items:
        flat += _tensor_metas(sub, f"{prefix}.{key}" if prefix else str(key))
    return flat


def _shapes_text(meta: Any, metas: list[tuple[str, TensorMetadata]]) -> str:
    if isinstance(meta, TensorMetadata):
        return _shape_text(meta.shape)
    return ", ".join(f"{path}={_shape_text(m.shape)}" for path, m in metas)


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _value_text(value: Any) -> str:
    return _shape_text(value) if isinstance(value, (tuple, list)) else str(value)


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _kind(node: torch.fx.Node, metas: list[Any], value: Any) -> str:
    if node.op == "output":
        return KIND_OUTPUT
    if isinstance(node.meta.get("tensor_meta"), TensorMetadata):
        return KIND_TENSOR
    if metas:
        return KIND_MULTI
    if value is not None:
        return KIND_SHAPE
    return KIND_OTHER


def _module_path(node: torch.fx.Node) -> str:
    if node.op == "get_attr" and str(node.target).startswith("_tensor_constant") and node.users:
        # fx keeps tensor constants on the root module; they belong where they are used
        return _module_path(next(iter(node.users)))
    if node.op in ("call_module", "get_attr"):
        owner = str(node.target)
        return owner if node.op == "call_module" else owner.rpartition(".")[0]
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return str(path)


DEFAULT_LAYER_PREFIX = "encoder.layer"
# The children that make a module a backbone, and its layers' label (introspect.models.families):
# BERT, RoBERTa, ELECTRA, ALBERT; DistilBERT; GPT-2; Llama.
_BACKBONES = ((("embeddings", "encoder"), "encoder.layer"),
              (("embeddings", "transformer"), "transformer.layer"),
              (("wte", "h"), "h"),
              (("embed_tokens", "layers"), "layers"))
# Children of a decoder backbone that embed tokens and positions (GPT-2 drops out after).
_EMBEDDING_CHILDREN = {"wte", "wpe", "drop", "embed_tokens", "rotary_emb"}


def backbone_path(model: torch.nn.Module) -> str | None:
    """Path of the backbone (the module holding embeddings and layers), if any.

    BERT, RoBERTa, ELECTRA, ALBERT (``embeddings``, ``encoder``), DistilBERT
    (``embeddings``, ``transformer``), GPT-2 (``wte``, ``h``), Llama (``embed_tokens``,
    ``layers``).
    """
    for path, module in model.named_modules():
        if layer_prefix(module) is not None:
            return path
    return None


def layer_prefix(backbone: torch.nn.Module) -> str | None:
    """The label of ``backbone``'s layers before their index, None if it is no backbone."""
    for children, prefix in _BACKBONES:
        if all(hasattr(backbone, child) for child in children):
            return prefix
    return None


def layer_of(node: torch.fx.Node, module: str, backbone: str | None,
             prefix: str = DEFAULT_LAYER_PREFIX) -> str:
    """The block a node belongs to: embeddings, encoder.layer.N, pooler, mask, head, ...

    Layers are labelled as the family names them (``prefix``: ``encoder.layer``,
    ``transformer.layer``, ``h``, ``layers``). Nodes run by the backbone itself (outside
    its children) build the attention mask; other children of the backbone (the pooler,
    a decoder's final norm) are labelled by their own name; only what lies outside the
    backbone is the head.
    """
    if node.op == "placeholder":
        return "inputs"
    if node.op == "output":
        return "outputs"
    return module_layer(module, backbone, prefix)


def module_layer(module: str, backbone: str | None,
                 prefix: str = DEFAULT_LAYER_PREFIX) -> str:
    """The block a module's path belongs to, labelled as ``layer_of`` labels its nodes
    (module evidence names its rows' layers so, and they meet the layer table's rows)."""
    parts = module.split(".") if module else []
    if "embeddings" in parts:
        return "embeddings"
    match = _LAYER_INDEX.search(module)
    if match:
        return f"{prefix}.{match.group(1)}"
    if any(part.startswith("pooler") for part in parts):  # ALBERT: pooler_activation too
        return "pooler"
    if backbone is not None and module == backbone:
        return "mask"
    if backbone is not None and (module + ".").startswith(f"{backbone}." if backbone else ""):
        child = module.removeprefix(f"{backbone}." if backbone else "").split(".")[0]
        return "embeddings" if child in _EMBEDDING_CHILDREN else child
    return "head"


def _target_name(node: torch.fx.Node) -> str:
    if isinstance(node.target, str):
        return node.target
    module = getattr(node.target, "__module__", None) or ""
    name = getattr(node.target, "__name__", repr(node.target))
    return f"{module}.{name}" if module else name


def _op_type(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> str:
    if node.op == "call_module":
        return type(modules[str(node.target)]).__name__
    if node.op in ("placeholder", "output"):
        return node.op
    if node.op == "get_attr":
        is_parameter = str(node.target).rpartition(".")[2] in ("weight", "bias")
        return "parameter" if is_parameter else "buffer"
    if isinstance(node.target, str):
        return node.target
    return getattr(node.target, "__name__", str(node.target))


def _params(node: torch.fx.Node, gm: torch.fx.GraphModule,
            modules: dict[str, torch.nn.Module]) -> int:
    if node.op == "call_module":
        return sum(p.numel() for p in modules[str(node.target)].parameters())
    if node.op == "get_attr":
        try:
            return gm.get_parameter(str(node.target)).numel()
        except AttributeError:
            return 0
    return 0


_MATMULS = {torch.matmul, torch.bmm, torch.mm, operator.matmul, torch.nn.functional.linear}


def estimate_flops(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> int:
    """Multiply-adds x 2 (2 x M x N x K) of linear layers (modules and ``F.linear``),
    matmul, mm, bmm, baddbmm, addmm and attention; 0 for everything else."""
    out = node.meta.get("tensor_meta")
    if not isinstance(out, TensorMetadata):
        return 0
    out_numel = math.prod(out.shape)
    module = modules.get(str(node.target)) if node.op == "call_module" else None
    if isinstance(module, torch.nn.Linear):
        return 2 * out_numel * module.in_features
    first_input = _input_shape(node, 0)
    if node.op == "call_function" and node.target in _MATMULS and first_input:
        return 2 * out_numel * first_input[-1]
    if node.op == "call_method" and node.target in ("matmul", "bmm", "mm") and first_input:
        return 2 * out_numel * first_input[-1]
    if getattr(node.target, "__name__", "") in ("baddbmm", "addmm", "addbmm") or \
            (node.op == "call_method" and node.target in ("baddbmm", "addmm")):
        second = _input_shape(node, 1)  # (bias, mat1, mat2): K is mat1's last axis
        return 2 * out_numel * second[-1] if second else 0
    if getattr(node.target, "__name__", "") == "scaled_dot_product_attention":
        query, key = first_input, _input_shape(node, 1)
        if query and key:  # QK^T and (softmax)V: two matmuls of (S x hd) by (hd x Sk)
            return 4 * math.prod(query[:-1]) * key[-2] * query[-1]
    return 0


def _input_shape(node: torch.fx.Node, position: int) -> tuple[int, ...] | None:
    argument = node.args[position] if len(node.args) > position else None
    if not isinstance(argument, torch.fx.Node):
        return None
    meta = argument.meta.get("tensor_meta")
    return tuple(meta.shape) if isinstance(meta, TensorMetadata) else None
