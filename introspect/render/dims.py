"""Named dimensions: read B, S, H, nh, hd, I, V from the records and name shapes with them.

Shapes are named by matching them against the layouts BERT uses, never value by value:
in bert-tiny B = nh = 2, and ``(2, 8, 2, 64)`` must read ``[B, S, nh, hd]``, not
``[B, S, B, hd]``. A shape no layout fits gets no names rather than wrong ones.

Example::

    >>> dims = infer_dims(graph.records)
    >>> dims.legend()
    'B=2 batch · S=9 tokens · H=768 hidden · nh=12 heads · hd=64 head size · I=3072 intermediate'
    >>> dims.name((2, 12, 9, 64))
    '[B, nh, S, hd]'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from introspect.records import KIND_TENSOR, NodeRecord

# What each symbol means, in legend order.
MEANINGS = {
    "B": "batch",
    "C": "choices",
    "S": "tokens",
    "H": "hidden",
    "nh": "heads",
    "hd": "head size",
    "I": "intermediate",
    "V": "vocab",
    "P": "positions",
    "L": "labels",
}

# The layouts BERT's tensors take; the first that fits a shape names it. "N" is the batch
# the encoder sees: B, or B·C for the multiple-choice head; "1" matches a literal 1.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("N", "S"),
    ("1", "S"),
    ("B", "C", "S"),
    ("B", "C"),
    ("N", "S", "H"),
    ("1", "S", "H"),
    ("N", "S", "I"),
    ("N", "S", "V"),
    ("N", "S", "L"),
    ("N", "H"),
    ("N", "L"),
    ("N", "nh", "S", "hd"),
    ("N", "S", "nh", "hd"),
    ("N", "nh", "hd", "S"),
    ("N", "nh", "S", "S"),
    ("N", "1", "S", "S"),
    ("N", "1", "1", "S"),
    ("1", "1", "S", "S"),
    ("1", "1", "S", "1"),
    ("1", "1", "1", "S"),
    ("N", "1", "1", "1"),
    ("N", "S", "1"),
    ("1", "P"),
    ("N",),
    ("S",),
    ("H",),
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
    words = next(
        (r for r in tensors if r.op_type == "Embedding" and r.module.endswith("word_embeddings")),
        None,
    )
    if words is not None and words.shape:
        sizes["H"] = words.shape[-1]
    attention = next((r for r in tensors if r.op_type == "scaled_dot_product_attention"), None)
    split = attention or _first_split(tensors, sizes.get("H"))
    if split is not None and split.shape and len(split.shape) == 4:
        heads, head_size = _heads(split.shape, sizes.get("S"))
        if heads and head_size:
            sizes["nh"], sizes["hd"] = heads, head_size
    ffn = next((r for r in tensors if r.module.endswith("intermediate.dense")), None)
    if ffn is not None and ffn.shape:
        sizes["I"] = ffn.shape[-1]
    if words is not None and words.params and sizes.get("H"):
        sizes["V"] = words.params // sizes["H"]
    positions = next(
        (
            r
            for r in records
            if r.op_type == "Embedding" and r.module.endswith("position_embeddings")
        ),
        None,
    )
    if positions is not None and positions.params and sizes.get("H"):
        sizes["P"] = positions.params // sizes["H"]
    labels = _labels(records, sizes)
    if labels:
        sizes["L"] = labels
    return Dims({k: sizes[k] for k in MEANINGS if k in sizes})


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
