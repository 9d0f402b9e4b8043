"""Align two traced graphs node by node, without trusting names or positions.

shared/DESIGN.md, "Aligning two graphs": a node that reads weights corresponds to the
node of the other graph that reads the same weights, and the nodes between such anchors
correspond when they do the same kind of thing to corresponding inputs. In order:

1. **Weights.** Every weight a node reads (a module's parameters, or a constant computed
   from ``get_attr`` nodes, such as ``torch.cat`` of three projections) is related to the
   reference's weights by value: the same tensor, its transpose, a slice of it (one head
   of a projection) or a concatenation holding it (a fused QKV projection). Values are
   compared after casting both to the lower precision of the two, so a bfloat16 copy
   relates too. A weight with no relation by value falls back to its name (a fine-tune,
   an unloaded weight). Equal values read by several nodes (LayerNorm weights at
   initialisation) are left to the next steps unless the names settle them.
2. **Anchors.** Nodes that read related weights are paired; a slice or a fusion becomes a
   pair on a region of the output's last dimension, and the candidate's nodes that cut a
   fused output apart (``split``, ``chunk``, ``[..., a:b]``) are paired with the parts.
3. **Structure**, forward in the reference's graph order: a node pairs with the first
   unpaired candidate node of the same kind and shape whose inputs are the partners of
   its own inputs (looking through layout ops, dropout and casts).
4. **Consumers**, backward: the arguments of a paired node pair with the same arguments of
   its partner; where one side reaches the argument through more layout ops than the
   other, the chains are aligned by shape, and the sources of two chains pair when they
   hold the same number of elements (compared by value after a reshape or permute).
   Steps 3 and 4 repeat until nothing changes.
5. Every node left over gets a reason, naming the compared node its effect reaches.

No step pairs two nodes by position alone: weights, inputs or consumers always decide.

Example::

    >>> alignment = align_graphs(reference_graph, candidate_graph)
    >>> alignment.pairs[0]
    Pair(reference='input_ids', candidate='input_ids', matched_by='input', ...)
    >>> alignment.coverage
    1.0
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from introspect.diff_records import (
    BY_CONSUMER,
    BY_INPUT,
    BY_OUTPUT,
    BY_STRUCTURE,
    BY_WEIGHTS,
    STATUS_SKIPPED,
    Pair,
    Region,
    Unmatched,
    WeightRelation,
)
from introspect.errors import InputError
from introspect.records import KIND_MULTI, KIND_OTHER, KIND_SHAPE, KIND_TENSOR, NodeRecord
from introspect.shapes import backbone_path

# Op types (NodeRecord.op_type) -> the kind of computation, so HF and a port compare.
_OP_KINDS = {
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
_LAYOUT = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten",
           "squeeze", "unsqueeze", "t", "clone", "expand", "expand_as", "view_as",
           "reshape_as", "movedim", "swapaxes"}
# Kinds looked through when following data back to its source.
_TRANSPARENT_KINDS = {"layout", "dropout", "cast", "split", "select"}
_COMMUTATIVE = {"add", "mul"}
# A row key shared by more rows than this says nothing (zero rows, constant rows).
_MAX_ROWS_PER_KEY = 64
# Below this share of weighted reference nodes paired, the models are not the same kind.
_MIN_WEIGHT_COVERAGE = 0.5


@dataclass
class Alignment:
    """Which node of the candidate computes what node of the reference, and what is left.

    Attributes:
        pairs: aligned pairs, in the reference's graph order (several pairs may share a
            reference node: one per head of a per-head candidate).
        unmatched: tensor nodes of either graph with no counterpart, with the reason.
        skipped: nodes not compared at all (shape bookkeeping, constants), with the reason.
        relations: how each of the candidate's weights relates to the reference's.
        notes: what a user should know (an output with no counterpart, name fallbacks).
    """

    pairs: list[Pair]
    unmatched: list[Unmatched]
    skipped: list[Unmatched]
    relations: list[WeightRelation]
    notes: list[str] = field(default_factory=list)
    reference_tensor_nodes: int = 0

    @property
    def coverage(self) -> float:
        """Share of the reference's tensor nodes that are paired."""
        paired = {p.reference for p in self.pairs}
        return len(paired) / self.reference_tensor_nodes if self.reference_tensor_nodes else 1.0

    def pairs_of(self, side: str, name: str) -> list[Pair]:
        """The pairs that hold node ``name`` of ``side`` ("reference" or "candidate")."""
        return [p for p in self.pairs if getattr(p, side) == name]


# ---------------------------------------------------------------------------------------
# One graph, as alignment sees it


class _Graph:
    """A graph's nodes, records, consumers, op kinds and the weights each node reads."""

    def __init__(self, gm: torch.fx.GraphModule, records: Sequence[NodeRecord], side: str,
                 name_map: Mapping[str, str] | None = None) -> None:
        self.gm = gm
        self.side = side
        self.nodes: dict[str, torch.fx.Node] = {n.name: n for n in gm.graph.nodes}
        self.records: dict[str, NodeRecord] = {r.name: r for r in records}
        self.order: dict[str, int] = {r.name: r.index for r in records}
        self.modules = dict(gm.named_modules())
        self.users: dict[str, list[str]] = {
            name: [u.name for u in node.users] for name, node in self.nodes.items()}
        backbone = backbone_path(gm)
        self.prefix = f"{backbone}." if backbone else ""
        self.name_map = dict(name_map or {})
        self.data_dependent = self._data_dependent()
        self.constants = self._evaluate_constants()
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
        if record.op_type in _LAYOUT:
            return "layout"
        return _OP_KINDS.get(record.op_type, record.op_type)

    def transparent(self, name: str) -> bool:
        return self.kinds[name] in _TRANSPARENT_KINDS

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
        dependent: set[str] = set()
        for node in self.gm.graph.nodes:
            if node.op == "placeholder" or any(n.name in dependent for n in node.all_input_nodes):
                dependent.add(node.name)
        return dependent

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


# ---------------------------------------------------------------------------------------
# Step 1: relate the candidate's weights to the reference's


def _lowest_float(tensors: Iterable[torch.Tensor]) -> torch.dtype:
    order = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
    dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    return next((d for d in order if d in dtypes), torch.float32)


def _as_rows(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = tensor.detach()
    if t.is_floating_point():
        t = t.to(dtype)
    return t.reshape(t.shape[0], -1)


def _key_columns(width: int) -> list[int]:
    return sorted({0, 1, width // 3, width // 2, width - 1} & set(range(width)))


class _RowIndex:
    """Rows of many 2-D weights, keyed by a few of their values, to find slices fast.

    Each row is reduced to one 64-bit hash of a few of its values; the hashes of every
    indexed weight of one row width are kept sorted, so finding where a row occurs is a
    binary search.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._parts: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self._tables: dict[int, tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]]] = {}

    def add(self, label: str, rows: torch.Tensor) -> None:
        self.tensors[label] = rows
        width = rows.shape[1]
        self._parts.setdefault(width, []).append((label, _row_hashes(rows)))
        self._tables.pop(width, None)

    def _table(self, width: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]] | None:
        if width not in self._tables and width in self._parts:
            parts = self._parts[width]
            owners = [(label, i) for label, hashes in parts for i in range(hashes.shape[0])]
            hashes, order = torch.sort(torch.cat([h for _, h in parts]))
            self._tables[width] = (hashes, order, owners)
        return self._tables.get(width)

    def find(self, rows: torch.Tensor) -> list[tuple[str, int]]:
        """(label, offset) of every indexed weight that holds ``rows`` as consecutive rows."""
        width, count = rows.shape[1], rows.shape[0]
        table = self._table(width)
        if table is None:
            return []
        hashes, order, owners = table
        probe = int(rows[: min(count, 8)].double().abs().sum(dim=1).argmax())
        key = _row_hashes(rows[probe:probe + 1])
        first = int(torch.searchsorted(hashes, key))
        last = int(torch.searchsorted(hashes, key, right=True))
        if last - first > _MAX_ROWS_PER_KEY:
            return []
        found: list[tuple[str, int]] = []
        for hit in order[first:last].tolist():
            label, row = owners[hit]
            start = row - probe
            big = self.tensors[label]
            if start < 0 or start + count > big.shape[0] or (label, start) in found:
                continue
            if torch.equal(big[start:start + count], rows):
                found.append((label, start))
        return found


_HASH_MULTIPLIERS = torch.tensor([0x9E3779B97F4A7C15 - (1 << 64), 0x632BE59BD9B4E019,
                                  0x4CF5AD432745937F, 0x2545F4914F6CDD1D, 0x1B873593],
                                 dtype=torch.int64)


def _row_hashes(rows: torch.Tensor) -> torch.Tensor:
    """One int64 per row, from the bits of a few of its values (equal rows, equal hashes)."""
    columns = _key_columns(rows.shape[1])
    bits = (rows[:, columns].double() + 0.0).view(torch.int64)  # exact; -0.0 becomes 0.0
    return (bits * _HASH_MULTIPLIERS[: len(columns)]).sum(dim=1)  # wraps around: a hash


def relate_weights(reference: _Graph, candidate: _Graph) -> dict[str, list[WeightRelation]]:
    """For every weight the candidate reads, the reference weights it relates to."""
    ref_weights = _unique_weights(reference)
    cand_weights = _unique_weights(candidate)
    dtype = _lowest_float([*ref_weights.values(), *cand_weights.values()])
    relations: dict[str, list[WeightRelation]] = {label: [] for label in cand_weights}

    # Most ports keep the reference's names: one comparison settles those weights.
    ref_by_name = {reference.normalized(label): label for label in ref_weights}
    unsettled: dict[str, torch.Tensor] = {}
    for label, tensor in cand_weights.items():
        ref = ref_by_name.get(candidate.normalized(label))
        if ref is not None and ref_weights[ref].shape == tensor.shape and torch.equal(
                _as_rows(tensor, dtype), _as_rows(ref_weights[ref], dtype)):
            relations[label].append(WeightRelation(label, ref, "same", None, 0.0))
        else:
            unsettled[label] = tensor

    index = _RowIndex()
    by_bytes: dict[tuple[Any, ...], list[str]] = {}
    matrices = any(t.ndim >= 2 for t in unsettled.values())
    vectors = any(t.ndim < 2 for t in unsettled.values())
    for label, tensor in ref_weights.items():
        if tensor.ndim >= 2 and matrices:
            index.add(label, _as_rows(tensor, dtype))
        elif tensor.ndim < 2 and vectors:
            by_bytes.setdefault(_vector_key(_as_rows(tensor, dtype)), []).append(label)

    for label, tensor in unsettled.items():
        rows = _as_rows(tensor, dtype)
        if tensor.ndim >= 2:
            relations[label] += _matrix_relations(label, rows, index, ref_weights, transposed=False)
            if tensor.ndim == 2:
                relations[label] += _matrix_relations(label, rows.t().contiguous(), index,
                                                      ref_weights, transposed=True)
        else:
            relations[label] += [WeightRelation(label, ref, "same", None, 0.0)
                                 for ref in by_bytes.get(_vector_key(rows), [])]

    _relate_fused(reference, candidate, ref_weights, cand_weights, dtype, relations)
    _relate_by_name(reference, candidate, ref_weights, cand_weights, relations)
    return relations


def _unique_weights(graph: _Graph) -> dict[str, torch.Tensor]:
    unique: dict[str, torch.Tensor] = {}
    for found in graph.weights.values():
        for label, tensor in found:
            unique.setdefault(label, tensor)
    return unique


def _vector_key(rows: torch.Tensor) -> tuple[Any, ...]:
    flat = rows.reshape(-1)
    return (str(flat.dtype), flat.numel(), flat.numpy().tobytes() if flat.dtype != torch.bfloat16
            else flat.view(torch.int16).numpy().tobytes())


def _matrix_relations(label: str, rows: torch.Tensor, index: _RowIndex,
                      ref_weights: Mapping[str, torch.Tensor], *, transposed: bool,
                      ) -> list[WeightRelation]:
    found = []
    for ref, start in index.find(rows):
        ref_rows = index.tensors[ref].shape[0]
        whole = start == 0 and rows.shape[0] == ref_rows
        if whole:
            if transposed and ref_weights[ref].ndim == 2 and rows.shape[0] == rows.shape[1] \
                    and torch.equal(rows, rows.t()):
                continue  # a symmetric matrix: "transposed" says nothing
            kind = "transposed" if transposed else "same"
            found.append(WeightRelation(label, ref, kind, None, 0.0))
        else:
            region = Region(0, start, start + rows.shape[0])
            kind = "transposed slice" if transposed else "slice"
            found.append(WeightRelation(label, ref, kind, region, 0.0))
    return found


def _relate_fused(reference: _Graph, candidate: _Graph, ref_weights: Mapping[str, torch.Tensor],
                  cand_weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                  relations: dict[str, list[WeightRelation]]) -> None:
    """Reference weights that are rows of a larger candidate weight (fused projections)."""
    related = {r.reference for found in relations.values() for r in found}
    missing = [label for label, t in ref_weights.items() if label not in related and t.ndim == 2]
    if not missing:
        return
    index = _RowIndex()
    for label, tensor in cand_weights.items():
        if tensor.ndim == 2 and not relations[label]:
            rows = _as_rows(tensor, dtype)
            index.add(label, rows)
            index.add(f"{label}\x00T", rows.t().contiguous())
    for ref in missing:
        rows = _as_rows(ref_weights[ref], dtype)
        for cand, start in index.find(rows):
            if cand.endswith("\x00T"):
                cand, kind = cand[:-2], "fused transposed"
            else:
                kind = "fused"
            region = Region(0, start, start + rows.shape[0])
            relations[cand].append(WeightRelation(cand, ref, kind, region, 0.0))


def _relate_by_name(reference: _Graph, candidate: _Graph, ref_weights: Mapping[str, torch.Tensor],
                    cand_weights: Mapping[str, torch.Tensor],
                    relations: dict[str, list[WeightRelation]]) -> None:
    """Weights with no relation by value, or several: settle them by name where it fits."""
    ref_by_name = {reference.normalized(label): label for label in ref_weights}
    for label, tensor in cand_weights.items():
        ref = ref_by_name.get(candidate.normalized(label))
        found = relations[label]
        if len(found) > 1 and ref is not None:
            named = [r for r in found if r.reference == ref]
            if named:
                relations[label] = named
            continue
        if found or ref is None:
            continue
        ref_tensor = ref_weights[ref]
        if ref_tensor.shape == tensor.shape:
            difference = _max_abs_diff(tensor, ref_tensor)
            relations[label] = [WeightRelation(label, ref, "by-name", None, difference)]
        elif tensor.ndim == 2 and ref_tensor.shape == tensor.t().shape:
            difference = _max_abs_diff(tensor.t(), ref_tensor)
            relations[label] = [WeightRelation(label, ref, "by-name transposed", None, difference)]


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not (a.is_floating_point() and b.is_floating_point()):
        return float((a != b).any())
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


# ---------------------------------------------------------------------------------------
# The matcher: steps 2 to 5


class _Matcher:
    def __init__(self, reference: _Graph, candidate: _Graph,
                 relations: dict[str, list[WeightRelation]]) -> None:
        self.ref = reference
        self.cand = candidate
        self.relations = relations
        self.pairs: list[Pair] = []
        self.ref_partners: dict[str, set[str]] = {}  # identity pairs only
        self.cand_partners: dict[str, set[str]] = {}
        self.ref_paired: set[str] = set()  # in any pair, regions included
        self.cand_paired: set[str] = set()
        self.superseded: dict[str, str] = {}  # candidate node -> the later node of the same anchor
        self.taken: set[tuple[str, Region | None]] = set()  # (candidate node, its region)

    # -- bookkeeping ---------------------------------------------------------------------
    def add(self, pair: Pair) -> None:
        self.pairs.append(pair)
        self.ref_paired.add(pair.reference)
        self.cand_paired.add(pair.candidate)
        if pair.reference_region is None and pair.candidate_region is None:
            self.ref_partners.setdefault(pair.reference, set()).add(pair.candidate)
            self.cand_partners.setdefault(pair.candidate, set()).add(pair.reference)

    def remove(self, pair: Pair) -> None:
        self.pairs.remove(pair)
        self.ref_paired = {p.reference for p in self.pairs}
        self.cand_paired = {p.candidate for p in self.pairs}
        self.ref_partners.get(pair.reference, set()).discard(pair.candidate)
        self.cand_partners.get(pair.candidate, set()).discard(pair.reference)

    def free(self, r: str, c: str) -> bool:
        return r not in self.ref_paired and c not in self.cand_paired

    def same_value_kind(self, r: str, c: str) -> bool:
        return self.ref.value_kind(r) == self.cand.value_kind(c)

    # -- step 2: anchors -------------------------------------------------------------
    def inputs(self) -> None:
        ref_inputs = {n.target: n.name for n in self.ref.nodes.values() if n.op == "placeholder"}
        for node in self.cand.nodes.values():
            if node.op == "placeholder" and node.target in ref_inputs:
                self.add(Pair(ref_inputs[node.target], node.name, BY_INPUT))

    def anchors(self) -> None:
        weighted = sorted((c for c in self.cand.weights if self.cand.compared(c)),
                          key=self.cand.order.__getitem__)
        reads_matrix = {c: any(t.ndim >= 2 for _, t in self.cand.weights[c]) for c in weighted}
        self._claim([c for c in weighted if reads_matrix[c]])
        self._claim([c for c in weighted if not reads_matrix[c]])  # biases, LayerNorms
        self._cut_parts()

    def _claim(self, nodes: list[str]) -> None:
        claims: dict[tuple[str, Region | None], list[tuple[str, WeightRelation]]] = {}
        for c in nodes:
            for relation, r in self._anchor_options(c):
                claims.setdefault((r, _ref_region(relation)), []).append((c, relation))
        for (r, ref_region), options in sorted(
                claims.items(), key=lambda item: self.ref.order[item[0][0]]):
            options = [o for o in options if (o[0], _cand_region(o[1])) not in self.taken]
            if not options:
                continue
            c, relation = max(options, key=lambda o: self.cand.order[o[0]])  # the complete one
            earlier = [p for p in self.pairs if p.reference == r and p.matched_by == BY_WEIGHTS
                       and p.reference_region == ref_region]
            if earlier:  # a bias added after the matmul: the later node holds the result
                if self.cand.order[c] < self.cand.order[earlier[0].candidate] or \
                        earlier[0].candidate_region != _cand_region(relation):
                    continue
                self.remove(earlier[0])
                options.append((earlier[0].candidate, relation))
            for other, _ in options:
                if other != c:
                    self.superseded.setdefault(other, c)
            self.taken.add((c, _cand_region(relation)))
            self.add(Pair(r, c, BY_WEIGHTS, _relation_note(relation), ref_region,
                          _cand_region(relation)))

    def _anchor_options(self, c: str) -> list[tuple[WeightRelation, str]]:
        """(relation, reference node) for the weights ``c`` reads, primary weight first."""
        found = self.cand.weights[c]
        matrices = [w for w in found if w[1].ndim >= 2]
        primary = max(matrices or found, key=lambda w: (w[1].ndim >= 2, w[1].numel()))
        options = []
        for relation in self.relations.get(primary[0], []):
            consumers = [r for r, weights in self.ref.weights.items()
                         if any(label == relation.reference for label, _ in weights)
                         and self.ref.compared(r)]
            fitting = [r for r in consumers if self._fits(r, c, relation)]
            same_kind = [r for r in fitting if self.ref.kinds[r] == self.cand.kinds[c]]
            options += [(relation, r) for r in (same_kind or fitting)]
        if primary[1].ndim < 2 and len({r for _, r in options}) > 1:
            return self._settle_vector(c, options)
        return options

    def _settle_vector(self, c: str, options: list[tuple[WeightRelation, str]],
                       ) -> list[tuple[WeightRelation, str]]:
        """A vector (bias, LayerNorm) read by many nodes: keep the one ``c``'s input leads to."""
        sources = {r for i in self.cand.data_inputs(c) for r in self.cand_partners.get(i, ())}
        continued = [(rel, r) for rel, r in options
                     if any(self.ref.order[s] <= self.ref.order[r] and r in self._reach(s, 2)
                            for s in sources)]
        return continued if len({r for _, r in continued}) == 1 else []

    def _reach(self, name: str, depth: int) -> set[str]:
        seen, frontier = {name}, [name]
        for _ in range(depth):
            frontier = [u for f in frontier for u in self.ref.users[f] if u not in seen]
            seen.update(frontier)
        return seen

    def _fits(self, r: str, c: str, relation: WeightRelation) -> bool:
        ref_shape, cand_shape = self.ref.records[r].shape, self.cand.records[c].shape
        if ref_shape is None or cand_shape is None or not self.same_value_kind(r, c):
            return False
        region = relation.region
        if region is None:
            return ref_shape == cand_shape
        size = region.stop - region.start
        if relation.kind.startswith("fused"):  # the candidate's output holds the reference's
            return ref_shape[:-1] == cand_shape[:-1] and ref_shape[-1] == size
        return ref_shape[:-1] == cand_shape[:-1] and cand_shape[-1] == size

    def _cut_parts(self) -> None:
        """Nodes that cut a fused output into the parts the other graph computes apart."""
        for pair in list(self.pairs):
            if pair.candidate_region is not None:
                for part in _parts(self.cand, pair.candidate, pair.candidate_region):
                    if part not in self.cand_paired:
                        self.add(Pair(pair.reference, part, BY_WEIGHTS,
                                      f"{pair.candidate}{pair.candidate_region}: "
                                      f"part of a fused output"))
            if pair.reference_region is not None:
                for part in _parts(self.ref, pair.reference, pair.reference_region):
                    if part not in self.ref_paired:
                        self.add(Pair(part, pair.candidate, BY_WEIGHTS,
                                      f"{pair.reference}{pair.reference_region}: "
                                      f"part of a fused output"))

    def outputs(self) -> list[str]:
        notes = []
        ref_out, cand_out = _outputs(self.ref), _outputs(self.cand)
        unpaired_cand = dict(cand_out)
        found = 0
        for key, r in ref_out.items():
            c = cand_out.get(key)
            if c is None or self.ref.shape(r) != self.cand.shape(c):
                c = next((n for k, n in unpaired_cand.items() if k not in ref_out
                          and self.ref.shape(r) == self.cand.shape(n)), None)
            if c is None:
                notes.append(f"the reference's output {key!r} has no counterpart in the candidate")
                continue
            unpaired_cand = {k: n for k, n in unpaired_cand.items() if n != c}
            found += 1
            if c in self.ref_partners.get(r, set()):
                continue
            if c not in self.cand_paired and self.same_value_kind(r, c):  # r may pair twice
                self.add(Pair(r, c, BY_OUTPUT, f"output {key!r}"))
        if not found:
            ref_shapes = ", ".join(f"{k}={self.ref.records[n].shapes}" for k, n in ref_out.items())
            cand_shapes = ", ".join(f"{k}={self.cand.records[n].shapes}"
                                    for k, n in cand_out.items())
            raise InputError(
                f"the two models return different outputs: reference ({ref_shapes}), "
                f"candidate ({cand_shapes}); diff compares two implementations of the same "
                "model, head and size"
            )
        return notes

    # -- step 3: structure, forward -------------------------------------------------------
    def forward(self) -> bool:
        changed = False
        by_kind: dict[tuple[str, Any, str], list[str]] = {}
        for c in sorted(self.cand.nodes, key=lambda n: self.cand.order.get(n, -1)):
            if self.cand.compared(c) and c not in self.cand_paired:
                by_kind.setdefault(self._kind_key(self.cand, c), []).append(c)
        for r in sorted(self.ref.nodes, key=lambda n: self.ref.order.get(n, -1)):
            if not self.ref.compared(r) or r in self.ref_paired:
                continue
            options = by_kind.get(self._kind_key(self.ref, r), [])
            for c in options:
                if c not in self.cand_paired and self._consistent(r, c):
                    self.add(Pair(r, c, BY_STRUCTURE))
                    changed = True
                    break
        return changed

    @staticmethod
    def _kind_key(graph: _Graph, name: str) -> tuple[str, Any, str]:
        return graph.kinds[name], graph.shape(name), graph.value_kind(name)

    def _consistent(self, r: str, c: str) -> bool:
        ref_inputs, cand_inputs = self.ref.data_inputs(r), self.cand.data_inputs(c)
        if len(ref_inputs) != len(cand_inputs):
            return False
        if not ref_inputs:  # nothing to anchor it (an arange): left to its consumers
            return False
        orders = [cand_inputs]
        if self.ref.kinds[r] in _COMMUTATIVE and len(cand_inputs) == 2:
            orders.append(cand_inputs[::-1])
        return any(all(self._source(self.cand, ci) in
                       self.ref_partners.get(self._source(self.ref, ri), ())
                       for ri, ci in zip(ref_inputs, order, strict=True)) for order in orders)

    def _source(self, graph: _Graph, name: str) -> str:
        """Follow unpaired layout ops, dropout and casts back to the node that made the data."""
        partners = self.ref_partners if graph is self.ref else self.cand_partners
        while name not in partners and graph.transparent(name):
            inputs = graph.data_inputs(name)
            if len(inputs) != 1:
                break
            name = inputs[0]
        return name

    # -- step 4: consumers, backward -------------------------------------------------------
    def backward(self) -> bool:
        changed = False
        for pair in sorted(self.pairs, key=lambda p: -self.ref.order[p.reference]):
            if pair.reference_region is not None or pair.candidate_region is not None:
                continue
            for ri, ci in self._argument_pairs(pair.reference, pair.candidate):
                changed |= self._pair_chains(ri, ci)
        return changed

    def _argument_pairs(self, r: str, c: str) -> list[tuple[str, str]]:
        ref_inputs, cand_inputs = self.ref.data_inputs(r), self.cand.data_inputs(c)
        if len(ref_inputs) != len(cand_inputs):
            return []
        if self.ref.kinds[r] != self.cand.kinds[c] and len(ref_inputs) != 1:
            return []
        if self.ref.kinds[r] in _COMMUTATIVE and len(ref_inputs) == 2:
            first_partners = self.ref_partners.get(ref_inputs[0], set())
            if cand_inputs[1] in first_partners or (
                    cand_inputs[0] in self.ref_partners.get(ref_inputs[1], set())):
                cand_inputs = cand_inputs[::-1]
        return list(zip(ref_inputs, cand_inputs, strict=True))

    def _chain(self, graph: _Graph, name: str, paired: set[str]) -> list[str]:
        chain = [name]
        while chain[-1] not in paired and graph.transparent(chain[-1]):
            inputs = graph.data_inputs(chain[-1])
            if len(inputs) != 1:
                break
            chain.append(inputs[0])
        return chain

    def _pair_chains(self, ri: str, ci: str) -> bool:
        ref_chain = self._chain(self.ref, ri, self.ref_paired)
        cand_chain = self._chain(self.cand, ci, self.cand_paired)
        changed = False
        for r, c in self._best_chain_pairs(ref_chain, cand_chain):
            self.add(Pair(r, c, BY_CONSUMER))
            changed = True
        r, c = ref_chain[-1], cand_chain[-1]
        if self.free(r, c) and not self.ref.transparent(r) and not self.cand.transparent(c) \
                and self.same_value_kind(r, c) and _numel(self.ref.shape(r)) == \
                _numel(self.cand.shape(c)) and self.ref.records[r].kind == KIND_TENSOR \
                and self.cand.records[c].kind == KIND_TENSOR:
            self.add(Pair(r, c, BY_CONSUMER, "layout: the candidate's value is reshaped or "
                                             "permuted to the reference's shape"))
            changed = True
        return changed

    def _best_chain_pairs(self, ref_chain: list[str],
                          cand_chain: list[str]) -> list[tuple[str, str]]:
        """Pairs along two chains of layout ops, in order, with equal shapes (weighted LCS)."""
        n, m = len(ref_chain), len(cand_chain)
        score = [[0.0] * (m + 1) for _ in range(n + 1)]
        for i in range(n - 1, -1, -1):
            for j in range(m - 1, -1, -1):
                best = max(score[i + 1][j], score[i][j + 1])
                gain = self._chain_gain(ref_chain[i], cand_chain[j])
                if gain > 0:
                    best = max(best, gain + score[i + 1][j + 1])
                score[i][j] = best
        pairs, i, j = [], 0, 0
        while i < n and j < m:
            gain = self._chain_gain(ref_chain[i], cand_chain[j])
            if gain > 0 and score[i][j] == gain + score[i + 1][j + 1]:
                pairs.append((ref_chain[i], cand_chain[j]))
                i, j = i + 1, j + 1
            elif score[i][j] == score[i + 1][j]:
                i += 1
            else:
                j += 1
        return pairs

    def _chain_gain(self, r: str, c: str) -> float:
        if not self.free(r, c) or self.ref.shape(r) != self.cand.shape(c) \
                or not self.same_value_kind(r, c):
            return 0.0
        gain = 1.0
        if self.ref.kinds[r] == self.cand.kinds[c]:
            gain += 0.5
        if self.ref.transparent(r) == self.cand.transparent(c):
            gain += 0.25
        return gain

    # -- step 5: reasons ------------------------------------------------------------------
    def leftovers(self) -> tuple[list[Unmatched], list[Unmatched]]:
        unmatched: list[Unmatched] = []
        skipped: list[Unmatched] = []
        for graph, other, paired in ((self.ref, "candidate", self.ref_paired),
                                     (self.cand, "reference", self.cand_paired)):
            for name in sorted(graph.nodes, key=lambda n: graph.order.get(n, -1)):
                node, record = graph.nodes[name], graph.records.get(name)
                if name in paired or record is None or node.op == "output":
                    continue
                if record.kind in (KIND_SHAPE, KIND_OTHER):
                    skipped.append(Unmatched(graph.side, name, "shape bookkeeping"
                                             if record.kind == KIND_SHAPE else "not a tensor",
                                             STATUS_SKIPPED))
                elif name not in graph.data_dependent:
                    skipped.append(Unmatched(graph.side, name, "constant (weight, buffer or "
                                             "tensor constant): checked through the nodes "
                                             "that read it", STATUS_SKIPPED))
                else:
                    unmatched.append(Unmatched(graph.side, name, self._reason(graph, name, other)))
        return unmatched, skipped

    def _reason(self, graph: _Graph, name: str, other: str) -> str:
        paired = self.ref_paired if graph is self.ref else self.cand_paired
        if name in self.superseded:
            return (f"computes part of a weighted op whose complete result is "
                    f"{self.superseded[name]}; compared there")
        if graph.records[name].kind == KIND_MULTI:
            return "a tuple of tensors; its items are compared"
        reached = _first_reached(graph, name, paired)
        op = graph.records[name].op_type
        if reached is None:
            return f"no counterpart in the {other}, and nothing compared depends on it"
        if graph.kinds[name] == "dropout":
            return f"dropout, the identity in eval mode; its values are compared at {reached}"
        if graph.kinds[name] == "cast":
            return f"a cast ({op}); its values are compared at {reached}"
        if graph.transparent(name):
            return f"layout only ({op}); its values are compared at {reached}"
        side = "candidate" if graph is self.ref else "reference"
        partners = self.pairs_with(side, reached)
        other_graph = self.cand if graph is self.ref else self.ref
        fused = [p for p in partners if other_graph.kinds.get(p) == "attention"]
        if fused:
            return (f"computed inside the {other}'s scaled_dot_product_attention ({fused[0]}); "
                    f"compared at {reached}")
        return (f"the {other} computes this another way ({op} has no counterpart); "
                f"compared at {reached}")

    def pairs_with(self, side: str, name: str) -> list[str]:
        if side == "candidate":
            return [p.candidate for p in self.pairs if p.reference == name]
        return [p.reference for p in self.pairs if p.candidate == name]


def _ref_region(relation: WeightRelation) -> Region | None:
    if relation.region is None or relation.kind.startswith("fused"):
        return None
    return Region(-1, relation.region.start, relation.region.stop)


def _cand_region(relation: WeightRelation) -> Region | None:
    if relation.region is None or not relation.kind.startswith("fused"):
        return None
    return Region(-1, relation.region.start, relation.region.stop)


def _relation_note(relation: WeightRelation) -> str:
    if relation.kind == "same":
        return ""
    if relation.kind.startswith("by-name"):
        return (f"weights related by name only: {relation.candidate} differs from "
                f"{relation.reference} by up to {relation.max_abs_diff:.3g}")
    if relation.kind.startswith("fused"):
        return (f"{relation.reference} is rows {relation.region} of {relation.candidate} "
                f"({relation.kind})")
    if relation.kind == "transposed":
        return f"{relation.candidate} is {relation.reference} transposed"
    return (f"{relation.candidate} is rows {relation.region} of {relation.reference} "
            f"({relation.kind})")


def _numel(shape: Any) -> int | None:
    return math.prod(shape) if isinstance(shape, tuple) else None


def _outputs(graph: _Graph) -> dict[str, str]:
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
            if isinstance(v, torch.fx.Node) and graph.compared(v.name)}


def _parts(graph: _Graph, name: str, region: Region) -> list[str]:
    """Nodes that take exactly ``region`` out of node ``name`` (split, chunk, slicing)."""
    shape = graph.records[name].shape
    if shape is None:
        return []
    ndim = len(shape)
    found = []
    for user in graph.users[name]:
        node = graph.nodes[user]
        cut = _cut_of(node, shape)
        if cut is not None:
            dim, start, stop = cut
            if dim - ndim == region.dim and (start, stop) == (region.start, region.stop):
                found.append(user)
            continue
        sections = _sections_of(node, shape)
        if sections is None:
            continue
        dim, bounds = sections
        for item in graph.users[user]:
            getter = graph.nodes[item]
            if getter.target is operator.getitem and isinstance(getter.args[1], int) \
                    and getter.args[1] < len(bounds):
                start, stop = bounds[getter.args[1]]
                if dim - ndim == region.dim and (start, stop) == (region.start, region.stop):
                    found.append(item)
    return found


def _sections_of(node: torch.fx.Node,
                 shape: tuple[int, ...]) -> tuple[int, list[tuple[int, int]]] | None:
    """(dim, [(start, stop), ...]) of a split or chunk node."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if name not in ("split", "chunk") or len(node.args) < 2:
        return None
    dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
    if not isinstance(dim, int):
        return None
    dim %= len(shape)
    size = shape[dim]
    how: Any = node.args[1]
    if name == "chunk" and isinstance(how, int):
        step = -(-size // how)
        sizes = [min(step, size - s) for s in range(0, size, step)]
    elif isinstance(how, int):
        sizes = [min(how, size - s) for s in range(0, size, how)]
    elif isinstance(how, (list, tuple)) and all(isinstance(s, int) for s in how):
        sizes = list(how)
    else:
        return None
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return dim, bounds


def _cut_of(node: torch.fx.Node, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(dim, start, stop) when ``node`` slices one dimension of its input and nothing else."""
    argument: Any = node.args[1] if len(node.args) > 1 else None
    if node.target is operator.getitem and isinstance(argument, (tuple, slice)):
        index: tuple[Any, ...] = argument if isinstance(argument, tuple) else (argument,)
        if Ellipsis in index:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (len(shape) - len(index) + 1) + index[at + 1:]
        cuts = [(d, s) for d, s in enumerate(index) if s != slice(None)]
        if len(cuts) == 1 and isinstance(cuts[0][1], slice) and cuts[0][1].step in (None, 1):
            dim, s = cuts[0]
            if all(isinstance(v, (int, type(None))) for v in (s.start, s.stop)):
                start, stop, _ = s.indices(shape[dim])
                return dim, start, stop
    if node.target == "narrow" and len(node.args) == 4 and all(
            isinstance(a, int) for a in node.args[1:]):
        dim, start, length = (int(a) for a in node.args[1:])  # type: ignore[arg-type]
        return dim % len(shape), start, start + length
    return None


def _first_reached(graph: _Graph, name: str, paired: set[str]) -> str | None:
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


# ---------------------------------------------------------------------------------------
# Entry point


def align_graphs(reference: Any, candidate: Any, *, name_map: Mapping[str, str] | None = None,
                 ) -> Alignment:
    """Pair the nodes of two traced graphs (``IntrospectGraph``) that compute the same values.

    Args:
        reference: the reference's ``IntrospectGraph`` (its ``gm`` and ``records``).
        candidate: the candidate's ``IntrospectGraph``.
        name_map: optional help: candidate node name -> reference node name (pairs them
            outright), or candidate parameter/module path prefix -> reference prefix
            (settles weights that do not relate by value, or relate to several).

    Returns:
        An ``Alignment``: pairs, nodes without counterpart (with reasons), skipped nodes,
        and how each candidate weight relates to the reference's.

    Raises:
        InputError: the two models do not implement the same model: no output in common,
            or fewer than half of the reference's weighted nodes find a counterpart.

    Example::

        >>> alignment = align_graphs(introspect.trace(hf, inputs), introspect.trace(port, inputs))
        >>> query = "encoder_layer_0_attention_self_query"
        >>> [p.candidate for p in alignment.pairs_of("reference", query)]
        ['encoder_layer_0_attention_self_qkv']
    """
    name_map = dict(name_map or {})
    ref = _Graph(reference.gm, reference.records, "reference")
    node_map = {k: v for k, v in name_map.items() if k in {r.name for r in candidate.records}}
    prefix_map = {k: v for k, v in name_map.items() if k not in node_map}
    cand = _Graph(candidate.gm, candidate.records, "candidate", prefix_map)
    for c_name, r_name in node_map.items():
        if r_name not in ref.nodes:
            raise InputError(f"name_map maps {c_name!r} to {r_name!r}, which is no node of the "
                             "reference; use names from the reference's graph.nodes['name']")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # comparing weights reads memory once: threads only wait
    try:
        relations = relate_weights(ref, cand)
    finally:
        torch.set_num_threads(threads)
    matcher = _Matcher(ref, cand, relations)
    for c_name, r_name in node_map.items():
        matcher.add(Pair(r_name, c_name, "name map"))
    matcher.inputs()
    matcher.anchors()
    _check_same_model(matcher)
    notes = matcher.outputs()
    for _ in range(8):
        if not (matcher.forward() | matcher.backward()):
            break
    unmatched, skipped = matcher.leftovers()
    pairs = sorted(matcher.pairs, key=lambda p: (ref.order[p.reference], cand.order[p.candidate]))
    flat = [r for found in relations.values() for r in found]
    by_name = [r for r in flat if r.kind.startswith("by-name") and r.max_abs_diff > 0]
    if by_name:
        notes.append(f"{len(by_name)} candidate weight(s) relate to the reference's by name only, "
                     f"with other values: {', '.join(r.candidate for r in by_name[:4])}"
                     f"{' ...' if len(by_name) > 4 else ''}")
    tensors = sum(1 for name in ref.nodes if ref.compared(name))
    return Alignment(pairs, unmatched, skipped, flat, notes, tensors)


def _check_same_model(matcher: _Matcher) -> None:
    weighted = [r for r, found in matcher.ref.weights.items()
                if matcher.ref.compared(r) and any(t.ndim >= 2 for _, t in found)]
    if not weighted:
        return
    anchored = sum(1 for r in weighted if r in matcher.ref_paired)
    if anchored / len(weighted) < _MIN_WEIGHT_COVERAGE:
        ref_params = sum(t.numel() for t in _unique_weights(matcher.ref).values())
        cand_params = sum(t.numel() for t in _unique_weights(matcher.cand).values())
        raise InputError(
            f"the candidate shares weights with only {anchored} of the reference's "
            f"{len(weighted)} weighted nodes (reference: {ref_params:,} weights, candidate: "
            f"{cand_params:,}): the two are different architectures or sizes, or the "
            "candidate's weights were not loaded from the reference; pass name_map to help"
        )


__all__ = ["Alignment", "align_graphs", "relate_weights"]
