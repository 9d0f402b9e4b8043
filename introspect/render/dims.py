"""Named dimensions: read B, S, H, nh, hd, I, V from the records and name shapes with them.

Shapes are named by matching them against the layouts BERT and its cousins use, never
value by value: in bert-tiny B = nh = 2, and ``(2, 8, 2, 64)`` must read
``[B, S, nh, hd]``, not ``[B, S, B, hd]``. A shape no layout fits gets no names rather
than wrong ones.

The sizes are read from what every family shares, not from BERT's module names alone:
H is the width the first layer's values mostly have (ALBERT and ELECTRA embed in a
smaller E and project it up), the embedding and feed-forward modules go by each family's
names (``wte``, ``embed_tokens``, ``mlp.c_fc``, ``ffn.lin1``...), Llama's key/value
heads (nkv) by its key projection, and GPT-2's fused query-key-value width (3H) where a
layer computes one.

Example::

    >>> dims = infer_dims(graph.records)
    >>> dims.legend()
    'B=2 batch · S=9 tokens · H=768 hidden · nh=12 heads · hd=64 head size · I=3072 intermediate'
    >>> dims.name((2, 12, 9, 64))
    '[B, nh, S, hd]'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from introspect.tracing.records import KIND_TENSOR, NodeRecord

# What each symbol means, in legend order.
MEANINGS = {
    "B": "batch",
    "C": "choices",
    "S": "tokens",
    "E": "embedding size",
    "H": "hidden",
    "nh": "heads",
    "nkv": "key/value heads",
    "hd": "head size",
    "I": "intermediate",
    "3H": "query, key and value side by side",
    "V": "vocab",
    "P": "positions",
    "L": "labels",
}

# The layouts the tensors take; the first that fits a shape names it. "N" is the batch
# the encoder sees: B, or B·C for the multiple-choice head; "N·S" its rows of tokens
# flattened (GPT-2's Conv1D); "1" matches a literal 1.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("N", "S"),
    ("1", "S"),
    ("B", "C", "S"),
    ("B", "C"),
    ("N", "S", "H"),
    ("1", "S", "H"),
    ("N", "S", "E"),
    ("1", "S", "E"),
    ("N", "S", "I"),
    ("N", "S", "3H"),
    ("N·S", "H"),
    ("N·S", "I"),
    ("N·S", "3H"),
    ("N", "S", "V"),
    ("N", "S", "L"),
    ("N", "H"),
    ("N", "L"),
    ("N", "nh", "S", "hd"),
    ("N", "S", "nh", "hd"),
    ("N", "nkv", "S", "hd"),
    ("N", "S", "nkv", "hd"),
    ("N", "nh", "hd", "S"),
    ("N", "nh", "S", "S"),
    ("N", "1", "S", "S"),
    ("N", "1", "1", "S"),
    ("1", "1", "S", "S"),
    ("1", "1", "S", "1"),
    ("1", "1", "1", "S"),
    ("N", "1", "1", "1"),
    ("N", "S", "1"),
    ("1", "S", "hd"),
    ("N", "S", "hd"),
    ("1", "P"),
    ("N", "P"),  # RoBERTa's segment ids, expanded from its buffer
    ("H", "H"),  # GPT-2's Conv1D weights, read as get_attr values: (in, out)
    ("H", "3H"),
    ("H", "I"),
    ("I", "H"),
    ("N",),
    ("S",),
    ("H",),
    ("3H",),
    ("I",),
)


@dataclass(frozen=True)
class Dims:
    """The sizes found in a graph, by symbol (``{"B": 2, "S": 9, ...}``), in legend order."""

    sizes: dict[str, int] = field(default_factory=dict)

    def legend(self) -> str:
        """``B=2 batch · S=9 tokens · ...``: the line that explains the symbols."""
        return " · ".join(f"{k}={v} {MEANINGS[k]}" for k, v in self.sizes.items())

    def name(self, shape: Sequence[int] | None) -> str:
        """``[B, S, H]`` for a shape that fits a known layout, else ``""``."""
        symbols = self.symbols(shape)
        return "[" + ", ".join(symbols) + "]" if symbols else ""

    def symbols(self, shape: Sequence[int] | None) -> tuple[str, ...]:
        """The symbols of the first layout that fits ``shape``; ``()`` when none does."""
        if not shape:
            return ()
        batches = [("B", self.sizes.get("B"))]
        if "C" in self.sizes and "B" in self.sizes:
            batches.append(("B·C", self.sizes["B"] * self.sizes["C"]))
        for layout in LAYOUTS:
            if len(layout) != len(shape):
                continue
            for batch_symbol, batch_size in batches:
                named = self._fit(layout, shape, batch_symbol, batch_size)
                if named:
                    return named
        return ()

    def _fit(
        self,
        layout: tuple[str, ...],
        shape: Sequence[int],
        batch_symbol: str,
        batch_size: int | None,
    ) -> tuple[str, ...]:
        named = []
        for symbol, size in zip(layout, shape, strict=True):
            expected: int | None
            if symbol == "1":
                expected, shown = 1, "1"
            elif symbol == "N":
                expected, shown = batch_size, batch_symbol
            elif symbol == "N·S":
                seq = self.sizes.get("S")
                expected = batch_size * seq if batch_size and seq else None
                shown = f"{batch_symbol}·S"
            else:
                expected, shown = self.sizes.get(symbol), symbol
            if expected is None or expected != size:
                return ()
            named.append(shown)
        return tuple(named)


def infer_dims(records: Sequence[NodeRecord]) -> Dims:
    """Read the sizes of a BERT graph from its records (input, embeddings, attention, FFN).

    Returns:
        ``Dims`` with the symbols it could establish; an unknown model gives fewer.
    """
    sizes: dict[str, int] = {}
    tensors = [r for r in records if r.kind == KIND_TENSOR and r.shape is not None]
    ids = next((r for r in tensors if r.op == "placeholder" and r.name == "input_ids"), None)
    ids = ids or next((r for r in tensors if r.op == "placeholder"), None)
    if ids is not None and len(ids.shape or ()) in (2, 3):
        shape = ids.shape or ()
        sizes["B"] = shape[0]
        if len(shape) == 3:
            sizes["C"] = shape[1]
        sizes["S"] = shape[-1]
    words = _module_output(tensors, "Embedding", _WORD_EMBEDDINGS)
    embedded = words.shape[-1] if words is not None and words.shape else None
    hidden = _hidden(tensors, sizes.get("B"), sizes.get("S")) or embedded
    if embedded and hidden and embedded != hidden:
        sizes["E"] = embedded  # ALBERT, ELECTRA: embedded small, projected up to H
    if hidden:
        sizes["H"] = hidden
    attention = next((r for r in tensors if r.op_type == "scaled_dot_product_attention"), None)
    split = attention or _first_split(tensors, sizes.get("H"))
    if split is not None and split.shape and len(split.shape) == 4:
        heads, head_size = _heads(split.shape, sizes.get("S"))
        if heads and head_size:
            sizes["nh"], sizes["hd"] = heads, head_size
    keys = _module_output(tensors, "Linear", ("k_proj",))
    if keys is not None and keys.shape and sizes.get("hd") and sizes.get("nh"):
        kv_heads = keys.shape[-1] // sizes["hd"]
        if kv_heads != sizes["nh"]:
            sizes["nkv"] = kv_heads  # grouped-query attention (Llama)
    ffn = _feed_forward_in(tensors)
    if ffn is not None and ffn.shape:
        sizes["I"] = ffn.shape[-1]
    if hidden and any((r.shape or ())[-1:] == (3 * hidden,) for r in tensors
                      if r.module.endswith(_FUSED_QKV)):
        sizes["3H"] = 3 * hidden
    if words is not None and words.params and embedded:
        sizes["V"] = words.params // embedded
    positions = next((r for r in records if r.op_type == "Embedding"
                      and r.module.endswith(_POSITION_EMBEDDINGS)), None)
    if positions is not None and positions.params and embedded:
        sizes["P"] = positions.params // embedded
    labels = _labels(records, sizes)
    if labels:
        sizes["L"] = labels
    return Dims({k: sizes[k] for k in MEANINGS if k in sizes})


# Module names of the parts whose widths name the dims, across the families.
_WORD_EMBEDDINGS = ("word_embeddings", "wte", "embed_tokens")
_POSITION_EMBEDDINGS = ("position_embeddings", "wpe")
_FEED_FORWARD_IN = ("intermediate.dense", "ffn.lin1", ".ffn", "mlp.c_fc", "mlp.up_proj")
_FUSED_QKV = ("c_attn",)


def _module_output(tensors: Sequence[NodeRecord], op_type: str,
                   suffixes: tuple[str, ...]) -> NodeRecord | None:
    """The first ``op_type`` node run by a module whose path ends with one of ``suffixes``."""
    return next((r for r in tensors if r.op_type == op_type and r.module.endswith(suffixes)),
                None)


def _feed_forward_in(tensors: Sequence[NodeRecord]) -> NodeRecord | None:
    """The output of the first layer's feed-forward input projection (width I).

    The module names are tried in order (DistilBERT's ``ffn.lin1`` before ALBERT's
    ``ffn``); the module's last value is its output (GPT-2's Conv1D flattens the rows,
    multiplies, and shapes them back).
    """
    for suffix in _FEED_FORWARD_IN:
        first = next((r for r in tensors if r.module.endswith(suffix)), None)
        if first is not None:
            return [r for r in tensors if r.module == first.module][-1]
    return None


def _hidden(tensors: Sequence[NodeRecord], batch: int | None, seq: int | None) -> int | None:
    """The width most (B, S, x) values of the first layer have: the hidden size H.

    Every family keeps its residual stream at H (queries, attention output, norms, sums)
    and leaves it only for a few feed-forward and key/value values.
    """
    first_layer = next((r.layer for r in tensors if _is_layer(r.layer)), None)
    widths = Counter(r.shape[-1] for r in tensors if r.layer == first_layer and r.shape
                     and len(r.shape) == 3 and r.shape[:2] == (batch, seq))
    return widths.most_common(1)[0][0] if first_layer is not None and widths else None


def _is_layer(label: str) -> bool:
    return label.rsplit(".", 1)[-1].isdigit()


def _first_split(tensors: Sequence[NodeRecord], hidden: int | None) -> NodeRecord | None:
    """The first rank-4 tensor of an attention block whose last two dims make H (eager)."""
    for r in tensors:
        shape = r.shape or ()
        if (
            len(shape) == 4
            and ".attention." in f".{r.module}."
            and hidden
            and shape[-1] * shape[-2] == hidden
        ):
            return r
    return None


def _heads(shape: tuple[int, ...], seq: int | None) -> tuple[int | None, int | None]:
    """(nh, hd) from (B, nh, S, hd) or (B, S, nh, hd)."""
    if shape[2] == seq:
        return shape[1], shape[3]
    if shape[1] == seq:
        return shape[2], shape[3]
    return None, None


def _labels(records: Sequence[NodeRecord], sizes: dict[str, int]) -> int | None:
    """The class count of a classifier head: its output's last dim, when it is not H or V."""
    heads = [r for r in records if r.layer == "head" and r.op_type == "Linear" and r.shape]
    for r in heads:
        last = (r.shape or ())[-1]
        if last not in (sizes.get("H"), sizes.get("V")):
            return last
    return None
