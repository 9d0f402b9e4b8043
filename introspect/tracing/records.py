"""Records: the small frozen rows every other module reads and writes.

Tables (pandas), drawings and reports are built from these records, never from a model
run of their own. This module imports nothing internal, so any part of the package can
use it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a node's output is; drawing and diff skip "shape" (bookkeeping) nodes by default.
KIND_TENSOR = "tensor"  # one tensor
KIND_MULTI = "multi"  # a tuple, list or dict holding tensors
KIND_SHAPE = "shape"  # an int, a torch.Size or a tuple of ints: shape bookkeeping
KIND_OTHER = "other"  # None, a dtype, a slice: neither tensor nor shape
KIND_OUTPUT = "output"  # the graph's output node


@dataclass(frozen=True)
class NodeRecord:
    """One node of a traced graph with the shapes ShapeProp saw flow through it."""

    index: int  # position in graph (execution) order
    name: str  # fx node name, unique in the graph: "bert_encoder_layer_0_attention_self_query"
    op: str  # fx opcode: placeholder, get_attr, call_module, call_function, call_method, output
    target: str  # module path, function name or method name the node calls
    op_type: str  # short human label: "Linear", "scaled_dot_product_attention", "view"
    module: str  # path of the innermost module it runs in: "bert.encoder.layer.3.attention.self"
    layer: str  # "inputs", "embeddings", "mask", "encoder.layer.N", "pooler", "head", "outputs"
    kind: str  # one of the KIND_* constants above
    shape: tuple[int, ...] | None  # shape of the (first) tensor output
    shapes: str  # every output shape as text: "(2, 9, 768)" or "start_logits=(2, 9), ..."
    dtype: str  # "float32", "int64", "" when no tensor
    numel: int  # elements over all tensor outputs
    nbytes: int  # bytes over all tensor outputs
    params: int  # parameters of the called module, or of the fetched parameter
    flops: int  # estimated floating-point operations (matmul, linear, attention only)
    inputs: tuple[str, ...]  # names of the nodes this one reads, in argument order
    value: str  # the value of a shape-bookkeeping node ("9", "(2, 9)"), else ""
