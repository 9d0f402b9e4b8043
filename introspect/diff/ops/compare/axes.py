"""Which axes of a reference value are the batch and the token axes, followed op by op.

``TokenAxes`` labels every value of the reference graph as it runs (``B``, ``S``, or
``BS`` for the two flattened together), so that ``padding`` can put the padding mask on
the right axes even where the sizes alone are ambiguous.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

BATCH, TOKENS, ROWS = "B", "S", "BS"  # ROWS: batch and tokens flattened together (B*S)
Labels = tuple  # one label (or None) per dimension  # noqa: UP006

_PERMUTES = {"transpose", "swapaxes", "permute", "t", "movedim"}
_RESHAPES = {"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "squeeze",
             "unsqueeze", "contiguous", "clone"}


class TokenAxes:
    """Follows the batch and token axes of every reference value through the graph.

    The padding mask of a value is found from where its token axis went (a head split,
    a transpose, rows flattened to ``(B*S, F)``), never from which axis has the sequence
    length: with as many heads as tokens, ``(B, nh, S, hd)`` has two such axes.
    """

    def __init__(self, input_shape: tuple[int, ...] | None) -> None:
        self.input_shape = input_shape
        self.labels: dict[str, Any] = {}  # node name -> Labels, or a list of them (a tuple)
        self.shapes: dict[str, tuple[int, ...]] = {}

    def follow(self, node: torch.fx.Node, value: Any) -> None:
        if self.input_shape is None:
            return
        if isinstance(value, torch.Tensor):
            self.shapes[node.name] = tuple(value.shape)
        try:
            labels = self._infer(node, value)
        except Exception:  # an op this cannot follow: the value's axes stay unknown
            labels = None
        if labels is not None:
            self.labels[node.name] = labels

    def of(self, name: str) -> Labels | None:
        found = self.labels.get(name)
        return found if isinstance(found, tuple) else None

    def known(self, name: str) -> Labels | None:
        """The value's labels where they name a batch axis at least (else: not followed)."""
        found = self.of(name)
        return found if found is not None and any(found) else None

    def _arg(self, node: torch.fx.Node, i: int) -> Labels | None:
        arg = node.args[i] if i < len(node.args) else None
        return self.of(arg.name) if isinstance(arg, torch.fx.Node) else None

    def _infer(self, node: torch.fx.Node, value: Any) -> Any:
        if node.op == "get_attr":
            return _none(value)
        if node.op == "placeholder":
            if not isinstance(value, torch.Tensor):
                return None
            shape = tuple(value.shape)
            if shape == self.input_shape:
                return (None,) * (len(shape) - 2) + (BATCH, TOKENS) if len(shape) >= 2 else None
            return None
        name = _op_name(node)
        if isinstance(value, (tuple, list)):
            source = self._arg(node, 0)
            if source is None or name not in ("split", "chunk", "unbind", "split_with_sizes"):
                return None
            dim = _dim_arg(node, 2 if name != "unbind" else 1, 0 if name == "unbind" else -1)
            dim %= len(source)
            if name == "unbind":
                item = source[:dim] + source[dim + 1:]
            else:
                item = tuple(None if d == dim else label for d, label in enumerate(source))
            return [item for _ in value]
        if not isinstance(value, torch.Tensor):
            return None
        shape = tuple(value.shape)
        if name == "getitem":
            item_of = node.args[0]
            found = self.labels.get(item_of.name) if isinstance(item_of, torch.fx.Node) else None
            if isinstance(found, list) and isinstance(node.args[1], int):
                return found[node.args[1]]
            indexed = _indexed(self._arg(node, 0), node.args[1])
            if indexed is not None and len(indexed) == len(shape):
                return indexed
            return self._broadcast(node, shape, same_rank_only=True)
        if name in _PERMUTES:
            source = self._arg(node, 0)
            if source is None:
                return None
            ndim = len(source)
            if name == "t":
                return source[::-1]
            if name in ("transpose", "swapaxes"):
                a, b = (int(x) % ndim for x in _int_args(node, 1, 3))
                out = list(source)
                out[a], out[b] = out[b], out[a]
                return tuple(out)
            if name == "permute":
                dims = _int_args(node, 1, None)
                if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                    dims = list(dims[0])
                return tuple(source[int(d) % ndim] for d in dims)
            return None
        if name in _RESHAPES or (node.op == "call_method" and name == "expand"):
            source_node = node.args[0] if node.args else None
            source = self._arg(node, 0)
            if source is None or not isinstance(source_node, torch.fx.Node):
                return None
            source_shape = self.shapes.get(source_node.name)
            if source_shape is None:
                return None
            if name == "expand":
                return _right_aligned([(source, source_shape)], shape)
            return _regroup(source, source_shape, shape)
        if name in ("linear", "Linear", "addmm", "matmul", "bmm", "baddbmm", "einsum"):
            if name == "addmm":
                data = self._arg(node, 1)
                return data[:-1] + (None,) if data is not None and len(data) == 2 else None
            if name in ("matmul", "bmm", "baddbmm"):
                first, second = (self._arg(node, 0), self._arg(node, 1)) if name != "baddbmm" \
                    else (self._arg(node, 1), self._arg(node, 2))
                if first is None or second is None or len(first) != len(shape):
                    return None
                return first[:-1] + (second[-1] if len(second) >= 2 else None,)
            if name == "einsum":
                return None
            data = self._arg(node, 0)
            return data[:-1] + (None,) if data is not None and len(data) == len(shape) else None
        if name in ("Embedding", "embedding"):  # the ids' axes, then the features
            ids = self._arg(node, 0)
            return ids + (None,) if ids is not None and len(ids) + 1 == len(shape) else None
        if name == "scaled_dot_product_attention":
            query = self._arg(node, 0)
            return query if query is not None and len(query) == len(shape) else None
        return self._broadcast(node, shape)

    def _broadcast(self, node: torch.fx.Node, shape: tuple[int, ...], *,
                   same_rank_only: bool = False) -> Labels | None:
        """Elementwise ops and the like: each axis keeps the label of an input axis of the
        same size at the same place from the right (broadcast axes of size 1 bring none)."""
        sources = []
        for n in node.all_input_nodes:
            labels, n_shape = self.of(n.name), self.shapes.get(n.name)
            if labels is None or n_shape is None or len(labels) != len(n_shape):
                continue
            if same_rank_only and len(n_shape) != len(shape):
                continue
            sources.append((labels, n_shape))
        if not sources:
            return None
        return _right_aligned(sources, shape)


def _indexed(source: Labels | None, index: Any) -> Labels | None:
    """Labels after ``x[index]`` for slices, None (a new axis), integers and Ellipsis."""
    if source is None:
        return None
    items = index if isinstance(index, tuple) else (index,)
    if any(not (isinstance(i, (slice, int)) or i is None or i is Ellipsis) for i in items):
        return None
    out: list[str | None] = []
    d = 0
    for k, item in enumerate(items):
        if item is Ellipsis:
            rest = sum(1 for i in items[k + 1:] if i is not None)
            keep = len(source) - d - rest
            out += source[d:d + keep]
            d += keep
        elif item is None:
            out.append(None)
        elif isinstance(item, int):
            d += 1
        else:
            out.append(source[d] if d < len(source) else None)
            d += 1
    return tuple(out) + tuple(source[d:])


def _right_aligned(sources: list[tuple[Labels, tuple[int, ...]]],
                   shape: tuple[int, ...]) -> Labels:
    out: list[str | None] = []
    for d in range(len(shape)):
        label = None
        for labels, s_shape in sources:
            k = d - len(shape) + len(s_shape)
            if 0 <= k < len(s_shape) and s_shape[k] == shape[d] and labels[k] is not None:
                label = labels[k]
                break
        out.append(label)
    return tuple(out)


def _regroup(source: Labels, source_shape: tuple[int, ...], shape: tuple[int, ...]) -> Labels:
    """Labels across a reshape: dimensions grouped where the products of sizes agree."""
    out: list[str | None] = [None] * len(shape)
    i = j = 0
    while i < len(source_shape) and j < len(shape):
        i_end, j_end = i + 1, j + 1
        a, b = source_shape[i], shape[j]
        while a != b:
            if a < b and i_end < len(source_shape):
                a *= source_shape[i_end]
                i_end += 1
            elif b < a and j_end < len(shape):
                b *= shape[j_end]
                j_end += 1
            else:
                return tuple(out)
        inside = [(source[k], source_shape[k]) for k in range(i, i_end) if source_shape[k] != 1]
        targets = [k for k in range(j, j_end) if shape[k] != 1]
        if len(inside) == 1 and len(targets) == 1:
            out[targets[0]] = inside[0][0]
        elif len(targets) == 1 and [label for label, _ in inside] == [BATCH, TOKENS]:
            out[targets[0]] = ROWS
        elif len(inside) == 1 and inside[0][0] == ROWS and len(targets) == 2:
            out[targets[0]], out[targets[1]] = BATCH, TOKENS
        i, j = i_end, j_end
    return tuple(out)


def _none(value: Any) -> Labels | None:
    return (None,) * value.ndim if isinstance(value, torch.Tensor) else None


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        owner = node.graph.owning_module
        return type(owner.get_submodule(str(node.target))).__name__ if owner is not None else ""
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _int_args(node: torch.fx.Node, start: int, stop: int | None) -> list[Any]:
    return list(node.args[start:stop])


def _dim_arg(node: torch.fx.Node, position: int, default: int) -> int:
    given: Any = node.kwargs["dim"] if "dim" in node.kwargs else \
        node.args[position] if len(node.args) > position else default
    return int(given)
