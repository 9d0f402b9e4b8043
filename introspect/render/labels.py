"""Label text for drawings: escaping, shapes as text, friendly titles for ops.

Every label in a drawing is a Graphviz HTML-like label built here, and every piece of
text that reaches one goes through ``escape`` first: a token such as ``<script>``, a
quote or a backslash sequence (``\\N``) in the input text shows as text and can break
neither the DOT nor the SVG.

Example::

    >>> escape("<script>alert('x')</script>")
    '&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;'
    >>> shape_text((2, 9, 768))
    '(2, 9, 768)'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Characters XML 1.0 does not allow (SVG is XML); they are dropped from labels.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff]")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "\\": "\\\\"}

# Ops whose meaning is better said in words than by the function's name.
_OP_TITLES = {
    "scaled_dot_product_attention": "scaled dot-product attention",
    "add": "add",
    "iadd": "add",
    "matmul": "matmul",
    "softmax": "softmax",
    "truediv": "divide",
    "mul": "multiply",
    "getitem": "select",
}

# Ops that only rearrange a tensor's layout; chains of them fold into one node.
LAYOUT_OPS = frozenset(
    {
        "view",
        "reshape",
        "transpose",
        "permute",
        "contiguous",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "t",
    }
)


def escape(text: str) -> str:
    """Text made safe for a Graphviz HTML-like label (and hence for the SVG).

    Backslashes are doubled: Graphviz expands ``\\N`` (node name), ``\\G`` (graph name),
    ``\\E``, ``\\L``, ``\\T``, ``\\H`` in labels, HTML-like ones and ``&#92;`` included,
    and shows ``\\\\`` as one backslash; so a token ``\\N`` is drawn as typed.
    """
    text = _NOT_XML.sub("", str(text))
    return "".join(_ENTITIES.get(c, c) for c in text)


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def shape_text(shape: Sequence[int] | None) -> str:
    """A shape as PyTorch users read it: ``(2, 9, 768)``; ``()`` for a scalar."""
    if shape is None:
        return ""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def compact_count(count: int) -> str:
    """Parameter counts people can read at a glance: 590, 16.5K, 23.8M."""
    for size, suffix in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "K")):
        if count >= size:
            return f"{count / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(count)


def op_title(
    op_type: str,
    module: str,
    input_shapes: Sequence[tuple[int, ...] | None],
    shape: tuple[int, ...] | None,
    input_names: Sequence[str] = (),
) -> str:
    """A short title for an op node: what it does, in words where the op is known.

    ``getitem`` is named after what it does in BERT when that is clear from the shapes:
    the pooler selecting the [CLS] token, and the position ids cut to the sequence.
    """
    first = input_shapes[0] if input_shapes else None
    decoder_title = _decoder_title(op_type, module, input_shapes, shape, input_names)
    if decoder_title:
        return decoder_title
    if op_type == "getitem" and first and shape:
        if module.endswith("pooler") and len(first) == 3 and len(shape) == 2:
            return "select [CLS] (token 0)"
        if input_names and input_names[0].endswith("position_ids"):
            return "position_ids[:, :S]"
    return _OP_TITLES.get(op_type, op_type)


# Comparisons that build a causal mask from position indices (HF's masking_utils).
_CAUSAL_COMPARISONS = {"le": "≤", "lt": "<", "ge": "≥", "gt": ">"}


def _decoder_title(
    op_type: str,
    module: str,
    input_shapes: Sequence[tuple[int, ...] | None],
    shape: tuple[int, ...] | None,
    input_names: Sequence[str],
) -> str:
    """Titles for the parts of decoders (Llama, GPT-2) that their bare op names hide.

    Causal mask, RMSNorm, rotary embeddings, SwiGLU and grouped-query attention, each
    recognised by its op and shapes (the module path only says where it runs).
    """
    first = input_shapes[0] if input_shapes else None
    if op_type in _CAUSAL_COMPARISONS and shape and len(shape) == 4 and shape[-1] == shape[-2] \
            and len(input_shapes) == 2 and all(s and len(s) == 4 for s in input_shapes):
        return f"causal mask (key {_CAUSAL_COMPARISONS[op_type]} query)"
    if op_type == "rsqrt" and shape and shape[-1] == 1:
        return "RMSNorm: 1/√(mean x² + eps)"
    if op_type in ("cos", "sin") and module.endswith("rotary_emb"):
        return f"rotary {op_type}(position × freq)"
    if op_type == "neg" and shape and len(shape) == 4:
        return "rotary: −(second half)"
    if op_type == "cat" and input_names and input_names[0].startswith("neg"):
        return "rotary: rotate half [−x₂, x₁]"
    if op_type == "expand" and shape and first and len(shape) == 5 and first[2] == 1:
        return f"repeat kv heads ×{shape[2]} (grouped-query)"
    if op_type == "mul" and module.endswith("mlp") and any("act" in n for n in input_names):
        return "SwiGLU: act(gate) × up"
    return ""


def mask_title(layers_and_ops: Sequence[tuple[str, str, tuple[int, ...] | None]]) -> str:
    """``causal attention mask`` when the mask compares positions, else ``attention mask``.

    Args:
        layers_and_ops: (layer, op type, shape) of the drawn records.
    """
    causal = any(layer == "mask" and op in _CAUSAL_COMPARISONS and shape and len(shape) >= 2
                 and shape[-1] == shape[-2] for layer, op, shape in layers_and_ops)
    return "causal attention mask" if causal else "attention mask"


def layout_title(
    ops: Sequence[str], before: tuple[int, ...] | None, after: tuple[int, ...] | None
) -> str:
    """What a chain of layout ops does, in words: ``split heads``, ``merge heads``, ...

    Args:
        ops: the chain's op names in order (``["view", "transpose"]``).
        before: the shape going in; after: the shape coming out.
    """
    if before and after and before != after:
        if _splits_heads(before, after):
            transposed = after[3] == before[1] and before[1] not in after[1:3]
            return "split heads, transpose" if transposed else "split heads"
        if _splits_heads(after, before):
            return "merge heads"
        if [d for d in before if d != 1] == [d for d in after if d != 1] and len(before) != len(
            after
        ):
            return "squeeze" if len(before) > len(after) else "unsqueeze"
        if sorted(before) == sorted(after) and {"transpose", "permute", "t"} & set(ops):
            return "transpose"
        if len(before) == len(after):
            return "reshape"
        return "flatten" if len(before) > len(after) else "unflatten"
    if before is not None and before == after:
        return "layout (shape unchanged)"
    return " → ".join(ops)


def _splits_heads(hidden: tuple[int, ...], heads: tuple[int, ...]) -> bool:
    """(B, S, H) against (B, nh, S, hd), (B, S, nh, hd) or (B, nh, hd, S), nh * hd = H."""
    if len(hidden) != 3 or len(heads) != 4 or hidden[0] != heads[0]:
        return False
    _, s, h = hidden
    rest = list(heads[1:])
    if s not in rest:
        return False
    rest.remove(s)
    return rest[0] * rest[1] == h
