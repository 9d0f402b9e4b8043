"""One traced graph as alignment sees it: op kinds, data-dependent nodes, weights read.

Alignment compares two graphs that may name and lay out everything differently, so
each node is reduced to what does not depend on the implementation: the kind of
computation (``linear``, ``add``, ``layout`` ...), its shape and value kind, the
data-dependent tensors it reads, and the weights (parameters or constants computed from
them) it consumes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from introspect.diff.ops.outside import handed_values
from introspect.diff.quantized import packing, quantized_weights
from introspect.tracing.records import KIND_MULTI, KIND_TENSOR, NodeRecord
from introspect.tracing.shapes import backbone_path

# Op types (NodeRecord.op_type) -> the kind of computation, so HF and a port compare.
OP_KINDS = {
    "Linear": "linear", "linear": "linear", "addmm": "linear",
    "LayerNorm": "layer_norm", "layer_norm": "layer_norm",
    "Embedding": "embedding", "embedding": "embedding",
    "Dropout": "dropout", "dropout": "dropout",
    "GELU": "gelu", "GELUActivation": "gelu", "gelu": "gelu", "NewGELUActivation": "gelu",
    "GELUTanh": "gelu", "PytorchGELUTanh": "gelu", "FastGELUActivation": "gelu",
    "QuickGELUActivation": "gelu", "NewGELU": "gelu",
    "ReLU": "relu", "relu": "relu", "SiLU": "silu", "silu": "silu", "SiLUActivation": "silu",
    "Tanh": "tanh", "tanh": "tanh", "Softmax": "softmax", "softmax": "softmax",
    "matmul": "matmul", "bmm": "matmul", "mm": "matmul", "einsum": "matmul",
    "add": "add", "iadd": "add", "__add__": "add", "radd": "add",
    "sub": "sub", "rsub": "sub", "__sub__": "sub", "isub": "sub",
    "mul": "mul", "imul": "mul", "__mul__": "mul",
    "truediv": "div", "div": "div", "__truediv__": "div", "itruediv": "div",
    "scaled_dot_product_attention": "attention",
    "cat": "cat", "concat": "cat", "concatenate": "cat", "stack": "stack",
    "split": "split", "chunk": "split", "tensor_split": "split", "unbind": "split",
    "to": "cast", "type": "cast", "float": "cast", "half": "cast", "bfloat16": "cast",
    "double": "cast", "type_as": "cast",
    "masked_fill": "masked_fill", "where": "where",
}
# Ops that move or reinterpret data without computing anything new.
LAYOUT = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten",
           "squeeze", "unsqueeze", "t", "clone", "expand", "expand_as", "view_as",
           "reshape_as", "movedim", "swapaxes"}
# Kinds looked through when following data back to its source.
TRANSPARENT_KINDS = {"layout", "dropout", "cast", "split", "select"}
COMMUTATIVE = {"add", "mul"}


class GraphView:
    """A graph's nodes, records, consumers, op kinds and the weights each node reads."""

    def __init__(self, gm: torch.fx.GraphModule, records: Sequence[NodeRecord], side: str,
                 name_map: Mapping[str, str] | None = None) -> None:
        self.gm = gm
        self.side = side
        self.nodes: dict[str, torch.fx.Node] = {n.name: n for n in gm.graph.nodes}
        self.records: dict[str, NodeRecord] = {r.name: r for r in records}
        self.order: dict[str, int] = {r.name: r.index for r in records}
        self.modules = dict(gm.named_modules())
        # 1-D Parameters, whatever their names, and 1-D floating buffers: slices of one are
        # the weights a port packed into it (``flat[a:b].view(...)``), not a table cut to
        # the input's length (``position_ids[:, :S]`` is 2-D, and of integers)
        self.packed = {name for name, p in gm.named_parameters() if p.ndim == 1}
        self.packed |= {name for name, b in gm.named_buffers()
                        if b.ndim == 1 and b.is_floating_point()}
        # and a Parameter of any shape cut at two ranges or more: a table cut to a step's
        # length is cut once, at one range (``wpe[start:start + T]``)
        self.packed |= _cut_at_ranges(gm, {name for name, _ in gm.named_parameters()})
        self.users: dict[str, list[str]] = {
            name: [u.name for u in node.users] for name, node in self.nodes.items()}
        backbone = backbone_path(gm)
        self.prefix = f"{backbone}." if backbone else ""
        self.name_map = dict(name_map or {})
        self.data_dependent = self._data_dependent()
        self.constants = self._evaluate_constants()
        # label -> quantization step of an int8 weight, read dequantized (``quantized``)
        self.steps: dict[str, torch.Tensor] = {}
        self.packings: dict[str, str] = {}  # a quantized weight's: "int8" or "float16"
        self.weights = self._weights()  # node -> [(label, tensor)]
        self.kinds = {name: self._kind(name) for name in self.nodes}

    # -- what a node is ----------------------------------------------------------------
    def compared(self, name: str) -> bool:
        """A node whose value is compared: a data-dependent tensor or tuple of tensors."""
        record = self.records.get(name)
        return (record is not None and record.kind in (KIND_TENSOR, KIND_MULTI)
                and name in self.data_dependent)

    def _kind(self, name: str) -> str:
        record = self.records.get(name)
        if record is None:
            return "other"
        node = self.nodes[name]
        if record.op_type == "getitem" and node.args and isinstance(node.args[0], torch.fx.Node) \
                and self.records.get(node.args[0].name, record).kind == KIND_MULTI:
            return "select"  # an item of a tuple (split, chunk)
        if record.op_type in LAYOUT:
            return "layout"
        return OP_KINDS.get(record.op_type, record.op_type)

    def transparent(self, name: str) -> bool:
        return self.kinds[name] in TRANSPARENT_KINDS

    def shape(self, name: str) -> Any:
        record = self.records[name]
        return record.shape if record.kind == KIND_TENSOR else record.shapes

    def value_kind(self, name: str) -> str:
        dtype = self.records[name].dtype
        if dtype.startswith(("float", "bfloat", "complex")):
            return "float"
        return "bool" if dtype == "bool" else "int" if dtype else "none"

    def data_inputs(self, name: str) -> list[str]:
        """Tensor inputs that depend on the model's inputs, in argument order."""
        node = self.nodes[name]
        return [n.name for n in node.all_input_nodes
                if self.compared(n.name)]

    # -- constants and weights ---------------------------------------------------------
    def _data_dependent(self) -> set[str]:
        """Nodes whose values depend on the inputs, their sizes included.

        A recorded graph holds sizes as plain numbers, so what a trace derives from the
        input's length (``arange(S)``, ``position_ids[:, :S]``) seems to depend on nothing:
        tensors made from no tensor, and what is computed from a buffer (not a
        parameter), count as depending on the inputs, as they do in a trace. So does a
        value the recording was handed from a thread or NumPy (``ops.outside``).
        """
        dependent: set[str] = set()
        outside = handed_values(self.gm)
        for node in self.gm.graph.nodes:
            inputs = node.all_input_nodes
            if node.op == "placeholder" or any(n.name in dependent for n in inputs) \
                    or self._made_from_sizes(node, inputs) \
                    or node.op == "get_attr" and node.target in outside:
                dependent.add(node.name)
        return dependent

    def _made_from_sizes(self, node: torch.fx.Node, inputs: list[torch.fx.Node]) -> bool:
        if node.op not in ("call_function", "call_method") \
                or self.records.get(node.name) is None \
                or self.records[node.name].kind not in (KIND_TENSOR, KIND_MULTI):
            return False
        if not inputs:
            return True  # a tensor made from numbers: arange(S), ones(S, S)
        # a buffer cut to a length: position_ids[:, :S] (inv_freq[None, :, None] is not)
        return _cut_to_length(node) and any(
            n.op == "get_attr" and self.records[n.name].op_type != "parameter"
            and str(n.target) not in self.packed for n in inputs)

    def _evaluate_constants(self) -> dict[str, Any]:
        """Values of the nodes that depend on no input (weights, buffers, their slices)."""
        interpreter = torch.fx.Interpreter(self.gm)
        values: dict[str, Any] = {}
        needed = {n.name for node in self.gm.graph.nodes if node.name in self.data_dependent
                  for n in node.all_input_nodes if n.name not in self.data_dependent}
        with torch.no_grad():
            for node in self.gm.graph.nodes:
                if node.name in self.data_dependent or node.op == "output":
                    continue
                if not all(n.name in values for n in node.all_input_nodes):
                    continue
                try:
                    values[node.name] = interpreter.env[node] = interpreter.run_node(node)
                except Exception:  # a constant we cannot evaluate is not a weight
                    continue
        return {k: v for k, v in values.items() if k in needed}

    def _weights(self) -> dict[str, list[tuple[str, torch.Tensor]]]:
        weights: dict[str, list[tuple[str, torch.Tensor]]] = {}
        for name, node in self.nodes.items():
            if name not in self.data_dependent:
                continue
            found: list[tuple[str, torch.Tensor]] = []
            if node.op == "call_module":
                module = self.modules[str(node.target)]
                found += [(f"{node.target}.{p}", t) for p, t in module.named_parameters()]
                for label, unpacked, step in quantized_weights(str(node.target), module):
                    found.append((label, unpacked))
                    if step is not None:
                        self.steps[label] = step
                        self.packings[label] = packing(module)
            for n in node.all_input_nodes:
                value = self.constants.get(n.name)
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    label = str(n.target) if n.op == "get_attr" else f"{n.name}(constant)"
                    found.append((label, value))
            if found:
                weights[name] = found
        return weights

    def normalized(self, label: str) -> str:
        """A weight's name without the backbone prefix, after the user's name map."""
        for old, new in self.name_map.items():
            if label == old or label.startswith(old + "."):
                label = new + label[len(old):]
                break
        return label[len(self.prefix):] if self.prefix and label.startswith(self.prefix) else label



def _cut_to_length(node: torch.fx.Node) -> bool:
    """``x[:, :S]``, ``x[..., 2:S]``, ``x.narrow(1, 0, S)``: a slice with a bound."""
    if node.target == "narrow":
        return True
    if node.target is not operator.getitem or len(node.args) < 2:
        return False
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    return any(isinstance(i, slice) and (i.start is not None or i.stop is not None)
               for i in index)


def _cut_at_ranges(gm: torch.fx.GraphModule, parameters: set[str]) -> set[str]:
    """The ``parameters`` that the graph slices at two different ranges or more."""
    ranges: dict[str, set[str]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) in parameters:
            for user in node.users:
                if _cut_to_length(user) and user.args and user.args[0] is node:
                    ranges.setdefault(str(node.target), set()).add(repr(user.args[1:]))
    return {name for name, found in ranges.items() if len(found) >= 2}


def numel(shape: Any) -> int | None:
    """Elements of a tensor shape; None for anything else (a tuple of shapes)."""
    return math.prod(shape) if isinstance(shape, tuple) else None


def graph_outputs(graph: GraphView, every: bool = False) -> dict[str, str]:
    """The graph's outputs by key -> node: those computed from the inputs (``every``:
    also those it returns made from none, a value made outside torch)."""
    node = next(n for n in graph.nodes.values() if n.op == "output")
    returned: Any = node.args[0]
    items: Iterable[tuple[Any, Any]]
    if isinstance(returned, dict):
        items = returned.items()
    elif isinstance(returned, (tuple, list)):
        items = ((f"output_{i}", v) for i, v in enumerate(returned))
    else:
        items = [("output", returned)]
    return {str(k): v.name for k, v in items
            if isinstance(v, torch.fx.Node) and (graph.compared(v.name) or every)}



def first_reached(graph: GraphView, name: str, paired: set[str]) -> str | None:
    """The first paired node, in graph order, that ``name``'s value flows into."""
    seen, frontier, found = {name}, [name], list[str]()
    while frontier:
        nxt: list[str] = []
        for n in frontier:
            for user in graph.users[n]:
                if user in seen or not graph.compared(user):
                    continue
                seen.add(user)
                (found if user in paired else nxt).append(user)
        frontier = nxt
    return min(found, key=graph.order.__getitem__) if found else None



__all__ = ["COMMUTATIVE", "LAYOUT", "OP_KINDS", "GraphView", "first_reached", "graph_outputs",
           "numel"]
