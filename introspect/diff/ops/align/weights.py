"""Relate the candidate's weights to the reference's, by value first and by name last.

Every weight the candidate reads (a module's parameters, or a constant computed from
``get_attr`` nodes, such as ``torch.cat`` of three projections) is related to the
reference's weights by value: the same tensor, its transpose, a slice of it (one head of
a projection) or a concatenation holding it (a fused QKV projection, its fused bias).
Values are compared after casting both to the lower precision of the two, so a bfloat16
copy relates too. A weight with no relation by value falls back to its name (a
fine-tune, an unloaded weight). An int8 weight (``quantize_dynamic``), read back
dequantized, relates to the float weight it was quantized from when every element lies
within one quantization step of it: a relation of its own kind ("quantized"), so that no
other relation loosens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

import torch

from introspect.diff.ops.align.view import GraphView
from introspect.diff.quantized import within_one_step
from introspect.diff.records import Region, WeightRelation

# A row key shared by more rows than this says nothing (zero rows, constant rows).
_MAX_ROWS_PER_KEY = 64


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
    return sorted(c for c in {0, 1, width // 3, width // 2, width - 1} if 0 <= c < width)


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

    def add(self, label: str, rows: torch.Tensor, hashes: torch.Tensor | None = None) -> None:
        """Index ``rows`` (``hashes``: their ``_row_hashes``, where known already)."""
        self.tensors[label] = rows
        width = rows.shape[1]
        self._parts.setdefault(width, []).append(
            (label, hashes if hashes is not None else _row_hashes(rows)))
        self._tables.pop(width, None)

    def _table(self, width: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]] | None:
        if width not in self._tables and width in self._parts:
            parts = self._parts[width]
            owners = [(label, i) for label, hashes in parts for i in range(hashes.shape[0])]
            hashes, order = torch.sort(torch.cat([h for _, h in parts]))
            self._tables[width] = (hashes, order, owners)
        return self._tables.get(width)

    def find(self, rows: torch.Tensor, equal: Callable[..., bool] | None = None,
             ) -> list[tuple[str, int]]:
        """(label, offset) of every indexed weight that holds ``rows`` as consecutive rows.

        ``equal(label, start, big, rows)``: the check of a hit (default ``torch.equal``).
        """
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
            if equal(label, start, big, rows) if equal is not None \
                    else torch.equal(big[start:start + count], rows):
                found.append((label, start))
        return found


_HASH_MULTIPLIERS = torch.tensor([0x9E3779B97F4A7C15 - (1 << 64), 0x632BE59BD9B4E019,
                                  0x4CF5AD432745937F, 0x2545F4914F6CDD1D, 0x1B873593],
                                 dtype=torch.int64)


def _row_hashes(rows: torch.Tensor) -> torch.Tensor:
    """One int64 per row, from the bits of a few of its values (equal rows, equal hashes)."""
    if rows.is_complex():  # (a rotary table held as complex numbers: their two parts)
        rows = torch.view_as_real(rows).reshape(rows.shape[0], -1)
    columns = _key_columns(rows.shape[1])
    bits = (rows[:, columns].double() + 0.0).view(torch.int64)  # exact; -0.0 becomes 0.0
    return (bits * _HASH_MULTIPLIERS[: len(columns)]).sum(dim=1)  # wraps around: a hash


# The last call's equality checks and row hashes, keyed by the tensors' states, with the
# tensors held (no id or storage is reused while they are remembered):
# ``relations_remembered``.
_REMEMBERED: ContextVar[dict[str, Any] | None] = ContextVar("weight_relations", default=None)


@contextlib.contextmanager
def relations_remembered() -> Iterator[None]:
    """Within the block, two weights compared once are not read again while unchanged.

    Most ports keep the reference's names, and relating them reads every byte of both
    models' weights (GPT-2 124M: a gigabyte); generation relates them more than once (the
    prefill, the first one-token step, a step after a change). A pair compared in the
    previous call is answered from memory where both tensors are the same objects, with
    the same storage, version counter, shape, stride and dtype (the proof
    ``generation.quick`` takes before reusing an alignment). A weight edited in place
    through ``.data`` keeps its storage and version: its relation is kept, and the values
    the step computes with it are still measured, pair by pair.
    """
    token = _REMEMBERED.set({"equal": {}, "held": []})
    try:
        yield
    finally:
        _REMEMBERED.reset(token)


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype, t.device)


class _Equalities:
    """Equality checks of weights, answered from the last call's memory where the tensors
    compared are proven the same (``relations_remembered``); computed otherwise."""

    def __init__(self) -> None:
        self.memory = _REMEMBERED.get()
        self.fresh: dict[tuple[Any, ...], Any] = {}
        self.held: list[torch.Tensor] = []

    def remembered(self, key: tuple[Any, ...], tensors: tuple[torch.Tensor, ...],
                   compute: Callable[[], Any]) -> Any:
        if self.memory is None:
            return compute()
        full = (*key, *(_state(t) for t in tensors))
        known = self.memory["equal"].get(full)
        self.fresh[full] = known if known is not None else compute()
        self.held += tensors
        return self.fresh[full]

    def by_name(self, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
        """``a`` and ``b`` hold the same values as rows (after the cast to ``dtype``)."""
        return bool(self.remembered(("by name", dtype), (a, b), lambda: bool(
            torch.equal(_as_rows(a, dtype), _as_rows(b, dtype)))))

    def transposed(self, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
        """``a`` holds the values of ``b`` transposed (after the cast to ``dtype``)."""
        return bool(self.remembered(("transposed", dtype), (a, b), lambda: bool(
            torch.equal(_as_rows(a, dtype), _as_rows(b.t(), dtype)))))

    def hashes(self, tensor: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype,
               ) -> torch.Tensor:
        """``_row_hashes`` of a weight's rows (cast to ``dtype``)."""
        return self.remembered(("hashes", dtype), (tensor,),  # type: ignore[no-any-return]
                               lambda: _row_hashes(rows))

    def rows(self, candidate: torch.Tensor, transposed: bool, dtype: torch.dtype,
             ref_weights: Mapping[str, torch.Tensor]) -> Callable[..., bool]:
        """The check ``_RowIndex.find`` makes of a hit: the candidate's rows (transposed or
        not) equal to rows ``start`` on of the reference weight ``label``."""
        def equal(label: str, start: int, big: torch.Tensor, rows: torch.Tensor) -> bool:
            def compute() -> bool:
                return bool(torch.equal(big[start:start + rows.shape[0]], rows))

            return bool(self.remembered(("rows", transposed, dtype, label, start),
                                        (candidate, ref_weights[label]), compute))
        return equal

    def done(self) -> None:
        """The memory now holds this call's checks only (older ones are let go)."""
        if self.memory is not None:
            self.memory.update(equal=self.fresh, held=self.held)


def relate_weights(reference: GraphView,
                   candidate: GraphView) -> dict[str, list[WeightRelation]]:
    """For every weight the candidate reads, the reference weights it relates to."""
    equalities = _Equalities()
    relations = _relate_weights(reference, candidate, equalities)
    equalities.done()
    return relations


def _relate_weights(reference: GraphView, candidate: GraphView,
                    equalities: _Equalities) -> dict[str, list[WeightRelation]]:
    ref_weights = unique_weights(reference)
    cand_weights = unique_weights(candidate)
    dtype = _lowest_float([*ref_weights.values(), *cand_weights.values()])
    relations: dict[str, list[WeightRelation]] = {label: [] for label in cand_weights}

    # Most ports keep the reference's names: one comparison settles those weights, kept as
    # they are or transposed (GPT-2's Conv1D weights in a port's Linear). Where all are
    # settled so, no row of the reference is read for the search below.
    ref_by_name = {reference.normalized(label): label for label in ref_weights}
    unsettled: dict[str, torch.Tensor] = {}
    for label, tensor in cand_weights.items():
        ref = ref_by_name.get(candidate.normalized(label))
        kind = None if ref is None else _by_name(tensor, ref_weights[ref], dtype, equalities)
        if ref is not None and kind is not None:
            relations[label].append(WeightRelation(label, ref, kind, None, 0.0))
        else:
            unsettled[label] = tensor

    index = _RowIndex()
    by_bytes: dict[tuple[Any, ...], list[str]] = {}
    matrices = any(t.ndim >= 2 for t in unsettled.values())
    vectors = any(t.ndim < 2 for t in unsettled.values())
    for label, tensor in ref_weights.items():
        if tensor.ndim >= 2 and matrices:
            rows = _as_rows(tensor, dtype)
            index.add(label, rows, equalities.hashes(tensor, rows, dtype))
        elif tensor.ndim < 2 and vectors:
            by_bytes.setdefault(_vector_key(_as_rows(tensor, dtype)), []).append(label)

    for label, tensor in unsettled.items():
        rows = _as_rows(tensor, dtype)
        if tensor.ndim >= 2:
            relations[label] += _matrix_relations(
                label, rows, index, ref_weights, transposed=False,
                equal=equalities.rows(tensor, False, dtype, ref_weights))
            if tensor.ndim == 2:
                # a view: the search reads a few rows, a copy would cost the whole matrix
                relations[label] += _matrix_relations(
                    label, rows.t(), index, ref_weights, transposed=True,
                    equal=equalities.rows(tensor, True, dtype, ref_weights))
        else:
            relations[label] += [WeightRelation(label, ref, "same", None, 0.0)
                                 for ref in by_bytes.get(_vector_key(rows), [])]

    _relate_fused(reference, candidate, ref_weights, cand_weights, dtype, relations)
    _relate_fused_vectors(by_bytes if vectors else {}, ref_weights, cand_weights, dtype,
                          relations)
    _relate_permuted(reference, candidate, ref_weights, cand_weights, dtype, relations)
    _relate_reshaped(ref_weights, cand_weights, dtype, relations)
    _relate_quantized(reference, candidate, ref_weights, cand_weights, relations)
    _relate_folded(ref_weights, cand_weights, relations)
    _relate_by_name(reference, candidate, ref_weights, cand_weights, relations)
    _biases_placed_by_their_weights(ref_weights, cand_weights, dtype, relations)
    return relations


def _sibling(label: str) -> str | None:
    """The weight beside bias ``label`` ("kqv.bias" -> "kqv.weight", "in_proj_bias" ->
    "in_proj_weight"); None for a name that is no bias."""
    head, found, tail = label.rpartition("bias")
    return f"{head}weight{tail}" if found and "." not in tail else None


def _biases_placed_by_their_weights(ref_weights: Mapping[str, torch.Tensor],
                                    cand_weights: Mapping[str, torch.Tensor],
                                    dtype: torch.dtype,
                                    relations: dict[str, list[WeightRelation]]) -> None:
    """A bias of one value throughout (random init's zeros) equals every such bias, at
    every place of a fused one: which reference bias each of its rows is, is proven by the
    weight beside it (a Linear's bias rows are its weight's rows). Its relations keep the
    reference biases beside the reference weights its weight relates to, at their rows
    and in their order; a bias whose weight proves nothing keeps what its values found.
    A fused QKV's zero bias related its first block to the query's bias: the query's
    gradient was read from the key's rows and a correct port FAILED under --backward."""
    for label, found in relations.items():
        tensor = cand_weights.get(label)
        weight = _sibling(label)
        if not found or tensor is None or tensor.ndim != 1 or weight not in relations \
                or not bool((tensor == tensor.reshape(-1)[0]).all()):
            continue
        placed = []
        for proof in relations[weight]:
            ref_bias = _sibling_reference(proof.reference, ref_weights)
            if ref_bias is None or proof.kind not in ("same", "transposed", "fused",
                                                      "fused transposed", "permuted"):
                continue
            values = _as_rows(ref_weights[ref_bias], dtype).reshape(-1)
            mine = _as_rows(tensor, dtype).reshape(-1)
            if proof.region is not None:
                mine = mine[proof.region.start:proof.region.stop]
            if mine.shape != values.shape or not torch.equal(mine, values):
                continue
            kind = "fused" if proof.kind.startswith("fused") else \
                "permuted" if proof.kind == "permuted" else "same"
            placed.append(WeightRelation(label, ref_bias, kind, proof.region, 0.0,
                                         proof.order if kind == "permuted" else None))
        if placed:
            relations[label] = placed


def _sibling_reference(weight: str, ref_weights: Mapping[str, torch.Tensor]) -> str | None:
    """The reference's bias beside its weight ``weight``, where it has one."""
    head, found, tail = weight.rpartition("weight")
    if not found or "." in tail:
        return None
    bias = f"{head}bias{tail}"
    return bias if bias in ref_weights and ref_weights[bias].ndim == 1 else None


def _by_name(candidate: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype,
             equalities: _Equalities) -> str | None:
    """"same" or "transposed" where the weight of the same name holds the candidate's
    values as they are or transposed; None otherwise (the search decides). A symmetric
    matrix is "same": "transposed" would say nothing of it."""
    if reference.shape == candidate.shape and equalities.by_name(candidate, reference, dtype):
        return "same"
    if candidate.ndim == 2 and reference.shape == candidate.shape[::-1] \
            and equalities.transposed(candidate, reference, dtype):
        return "transposed"
    return None


def unique_weights(graph: GraphView) -> dict[str, torch.Tensor]:
    """Each weight once, on the CPU: the hashes and byte keys below are CPU work, and a
    candidate on a GPU (``--candidate-device``) is related to a reference on the CPU."""
    unique: dict[str, torch.Tensor] = {}
    for found in graph.weights.values():
        for label, tensor in found:
            if label not in unique:
                unique[label] = tensor if tensor.device.type == "cpu" else tensor.detach().cpu()
    return unique


def _vector_key(rows: torch.Tensor) -> tuple[Any, ...]:
    flat = rows.reshape(-1)
    return (str(flat.dtype), flat.numel(), flat.numpy().tobytes() if flat.dtype != torch.bfloat16
            else flat.view(torch.int16).numpy().tobytes())


def _matrix_relations(label: str, rows: torch.Tensor, index: _RowIndex,
                      ref_weights: Mapping[str, torch.Tensor], *, transposed: bool,
                      equal: Callable[..., bool] | None = None) -> list[WeightRelation]:
    found = []
    for ref, start in index.find(rows, equal):
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


def _relate_fused(reference: GraphView, candidate: GraphView,
                  ref_weights: Mapping[str, torch.Tensor],
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
            index.add(f"{label}\x00T", rows.t())  # a view, as above
    for ref in missing:
        rows = _as_rows(ref_weights[ref], dtype)
        for cand, start in index.find(rows):
            if cand.endswith("\x00T"):
                cand, kind = cand[:-2], "fused transposed"
            else:
                kind = "fused"
            region = Region(0, start, start + rows.shape[0])
            relations[cand].append(WeightRelation(cand, ref, kind, region, 0.0))


def _relate_fused_vectors(by_bytes: Mapping[tuple[Any, ...], list[str]],
                          ref_weights: Mapping[str, torch.Tensor],
                          cand_weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                          relations: dict[str, list[WeightRelation]]) -> None:
    """A candidate vector that is reference vectors end to end (a fused QKV bias)."""
    lengths = sorted({t.numel() for t in ref_weights.values() if t.ndim < 2}, reverse=True)
    for label, tensor in cand_weights.items():
        if tensor.ndim >= 2 or relations[label]:
            continue
        flat = _as_rows(tensor, dtype).reshape(-1)
        for length in lengths:
            if length >= flat.numel() or flat.numel() % length:
                continue
            parts = [by_bytes.get(_vector_key(flat[start:start + length].reshape(-1, 1)), [])
                     for start in range(0, flat.numel(), length)]
            if all(parts):
                relations[label] = [
                    WeightRelation(label, ref, "fused", Region(0, i * length, (i + 1) * length),
                                   0.0)
                    for i, found in enumerate(parts) for ref in found]
                break


def _relate_permuted(reference: GraphView, candidate: GraphView,
                     ref_weights: Mapping[str, torch.Tensor],
                     cand_weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                     relations: dict[str, list[WeightRelation]]) -> None:
    """A candidate matrix whose rows are a reference matrix's rows in another order.

    llama2.c and Meta's code rotate interleaved pairs of each head, HF half-split ones,
    so the export permutes the rows of ``wq`` and ``wk`` within each head. The order is
    recorded on the relation, so the pair is compared with the rows put back in place.
    """
    unrelated = [label for label, tensor in cand_weights.items()
                 if tensor.ndim == 2 and not relations[label]]
    if not unrelated:  # every matrix related already: no reference row read for signatures
        return
    by_signature: dict[tuple[Any, ...], list[str]] = {}
    for label, tensor in ref_weights.items():
        if tensor.ndim == 2:
            rows = _as_rows(tensor, dtype)
            by_signature.setdefault(_rows_signature(rows), []).append(label)
    if not by_signature:
        return
    ref_by_name = {reference.normalized(label): label for label in ref_weights}
    for label in unrelated:
        tensor = cand_weights[label]
        rows = _as_rows(tensor, dtype)
        found = by_signature.get(_rows_signature(rows), [])
        named = ref_by_name.get(candidate.normalized(label))
        found = sorted(found, key=lambda ref: ref != named)  # the same name first
        for ref in found:
            order = _row_order(rows, _as_rows(ref_weights[ref], dtype))
            if order is not None:
                relations[label].append(WeightRelation(label, ref, "permuted", None, 0.0, order))
                _relate_permuted_bias(label, ref, order, ref_weights, cand_weights, dtype,
                                      relations)


def _relate_permuted_bias(label: str, ref: str, order: tuple[int, ...],
                          ref_weights: Mapping[str, torch.Tensor],
                          cand_weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                          relations: dict[str, list[WeightRelation]]) -> None:
    """The bias of a permuted projection, permuted the same way (a q bias, as in Qwen)."""
    if not (label.endswith(".weight") and ref.endswith(".weight")):
        return
    bias, ref_bias = label[:-len("weight")] + "bias", ref[:-len("weight")] + "bias"
    if bias not in cand_weights or ref_bias not in ref_weights or relations[bias]:
        return
    values = _as_rows(cand_weights[bias], dtype).reshape(-1)
    ref_values = _as_rows(ref_weights[ref_bias], dtype).reshape(-1)
    if values.shape == ref_values.shape == (len(order),) and torch.equal(
            ref_values[list(order)], values):
        relations[bias].append(WeightRelation(bias, ref_bias, "permuted", None, 0.0, order))


def _rows_signature(rows: torch.Tensor) -> tuple[Any, ...]:
    hashes = torch.sort(_row_hashes(rows)).values
    return tuple(rows.shape), hashes.numpy().tobytes()


def _row_order(rows: torch.Tensor, ref_rows: torch.Tensor) -> tuple[int, ...] | None:
    """``order`` with ``rows[j] == ref_rows[order[j]]``, or None (no such permutation)."""
    if rows.shape != ref_rows.shape or rows.shape[0] > 1 << 16:
        return None
    cand_sorted = torch.sort(_row_hashes(rows), stable=True).indices
    ref_sorted = torch.sort(_row_hashes(ref_rows), stable=True).indices
    order = torch.empty_like(cand_sorted)
    order[cand_sorted] = ref_sorted
    if bool((order == torch.arange(order.numel())).all()):
        return None  # the same rows in the same order: related already, or equal by hash only
    if not torch.equal(ref_rows[order], rows):
        return None
    return tuple(int(i) for i in order)


def describe_order(order: tuple[int, ...]) -> str:
    """What a row permutation does, in words ("rows of each head of 8 interleaved ...")."""
    n = len(order)
    for block in range(2, n + 1):
        if n % block or any(order[j] // block != j // block for j in range(n)):
            continue
        inner = [order[j] % block for j in range(block)]
        if any(order[j] % block != inner[j % block] for j in range(n)):
            return f"rows permuted within blocks of {block}"
        half = block // 2
        interleaved = [p * half + i for i in range(half) for p in (0, 1)]
        if block % 2 == 0 and inner == interleaved:
            return (f"rows of each head of {block} interleaved (rotary pairs (i, i+{half}) "
                    "of half-split rotary become (2i, 2i+1): llama2.c / Meta layout)")
        split = sorted(range(block), key=lambda j: (j % 2, j // 2))
        if block % 2 == 0 and inner == split:
            return (f"rows of each head of {block} half-split (rotary pairs (2i, 2i+1) "
                    f"become (i, i+{half}): HF layout)")
        return f"rows permuted within each block of {block} the same way"
    return "rows permuted"


def _relate_reshaped(ref_weights: Mapping[str, torch.Tensor],
                     cand_weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                     relations: dict[str, list[WeightRelation]]) -> None:
    """A candidate weight that holds a reference weight's values in another shape
    ((nh, hd, H) for an einsum where the reference has a (H, H) Linear)."""
    pending = [label for label, t in cand_weights.items()
               if not relations[label] and t.ndim >= 2 and t.numel() > 1]
    if not pending:
        return
    # A reshape keeps the number of values, and the key below holds it: reference weights
    # of another size can relate to no pending weight, so their bytes are never read.
    sizes = {cand_weights[label].numel() for label in pending}
    by_bytes: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
    for label, tensor in ref_weights.items():
        if tensor.ndim != 2 or tensor.numel() not in sizes:
            continue
        rows = _as_rows(tensor, dtype)
        by_bytes.setdefault(_vector_key(rows.reshape(-1, 1)), []).append((label, "reshaped"))
        by_bytes.setdefault(_vector_key(rows.t().contiguous().reshape(-1, 1)), []).append(
            (label, "transposed reshaped"))
    for label in pending:
        flat = _as_rows(cand_weights[label], dtype).reshape(-1, 1)
        for ref, kind in by_bytes.get(_vector_key(flat), []):
            if ref_weights[ref].shape != cand_weights[label].shape:
                relations[label].append(WeightRelation(label, ref, kind, None, 0.0))


def _relate_quantized(reference: GraphView, candidate: GraphView,
                      ref_weights: Mapping[str, torch.Tensor],
                      cand_weights: Mapping[str, torch.Tensor],
                      relations: dict[str, list[WeightRelation]]) -> None:
    """An int8 weight and the float weight of its shape (or transposed) that it quantizes.

    Only weights read from a quantized module's packed params (``GraphView.steps``) are
    tried, each element against its own step: a weight merely close to another's never
    relates this way. The first row is tried first: it rules out almost every candidate.
    """
    pending = [label for label in candidate.steps if label in cand_weights
               and cand_weights[label].ndim == 2 and not relations[label]]
    if not pending:
        return
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for label, tensor in ref_weights.items():
        if tensor.ndim == 2:
            by_shape.setdefault(tuple(tensor.shape), []).append(label)
    ref_by_name = {reference.normalized(label): label for label in ref_weights}
    for label in pending:
        value, step = cand_weights[label], candidate.steps[label]
        first = step if step.ndim == 0 else step[:1]
        named = ref_by_name.get(candidate.normalized(label))
        word = " float16" if candidate.packings.get(label) == "float16" else ""
        for kind, transposed in ((f"quantized{word}", False),
                                 (f"quantized{word} transposed", True)):
            shape = tuple(value.shape[::-1]) if transposed else tuple(value.shape)
            for ref in sorted(by_shape.get(shape, []), key=lambda r: r != named):
                ref_value = ref_weights[ref].t() if transposed else ref_weights[ref]
                if within_one_step(value[:1], ref_value[:1], first) \
                        and within_one_step(value, ref_value, step):
                    relations[label].append(WeightRelation(
                        label, ref, kind, None, _max_abs_diff(value, ref_value)))
            if relations[label]:
                break


def _relate_folded(ref_weights: Mapping[str, torch.Tensor],
                   cand_weights: Mapping[str, torch.Tensor],
                   relations: dict[str, list[WeightRelation]]) -> None:
    """A candidate matrix that is a reference matrix with each column scaled by one of the
    reference's vectors: a norm's gain folded into the Linear that reads the norm
    (``W' = W diag(g)``, as quantization and rotation tools rewrite a model). The Linear
    then computes the reference's output from the norm's output without its gain, which
    the side-by-side run recomputes from the reference's values like any node between
    pairs.

    Proof, not likeness: the gain read off one row must be one of the reference's vectors,
    and every element of ``W * g`` must be the candidate's within one rounding of float32
    (a fold made in float64, then cast). Two rows are read per pair of matrices before
    any whole matrix is.
    """
    pending = [label for label, t in cand_weights.items()
               if not relations[label] and t.ndim == 2 and t.is_floating_point()]
    if not pending:
        return
    for fold in folds_between(ref_weights, {k: cand_weights[k] for k in pending}):
        value = cand_weights[fold.candidate]
        if fold.kind == "folded transposed":
            value = value.t()
        elif fold.region is not None:
            value = value[fold.region.start:fold.region.stop]
        relations[fold.candidate].append(WeightRelation(
            fold.candidate, fold.reference, fold.kind, fold.region,
            _max_abs_diff(value, ref_weights[fold.reference]), scaled_by=fold.gain))


class Fold(NamedTuple):
    """A candidate matrix that is a reference matrix with a norm's gain folded in."""

    candidate: str
    reference: str
    gain: str  # the reference's vector each column is scaled by
    kind: str  # "folded", "folded transposed", or "fused folded" (rows ``region`` of it)
    region: Region | None = None


def folds_between(ref_weights: Mapping[str, torch.Tensor],
                  cand_weights: Mapping[str, torch.Tensor]) -> list[Fold]:
    """Each candidate matrix that is a reference matrix with each column scaled by one of
    the reference's vectors: stored as it is ("folded"), transposed ("folded transposed",
    for ``x @ W``), or as a block of rows of a fused projection ("fused folded": a fused
    QKV) (``_relate_folded``); also read by the backward's own-gradient pairing, which must
    not hold a folded norm's gradient to the candidate's copy of its gain."""
    by_shape: dict[tuple[int, ...], list[str]] = {}
    gains: dict[int, list[str]] = {}
    for label, tensor in ref_weights.items():
        if not tensor.is_floating_point():
            continue
        if tensor.ndim == 2:
            by_shape.setdefault(tuple(tensor.shape), []).append(label)
        elif tensor.ndim == 1:
            gains.setdefault(tensor.numel(), []).append(label)
    found: list[Fold] = []
    for label, tensor in cand_weights.items():
        if tensor.ndim != 2 or not tensor.is_floating_point() or tensor.shape[0] < 2:
            continue
        value = tensor.detach().float()
        mine: list[Fold] = []
        for kind, candidate in (("folded", value), ("folded transposed", value.t())):
            mine = [Fold(label, ref, gain, kind) for ref, gain
                    in _folds_of(candidate, by_shape, gains, ref_weights)]
            if mine:
                break
        found += mine or _fused_folds(label, value, by_shape, gains, ref_weights)
    return found


def _folds_of(value: torch.Tensor, by_shape: Mapping[tuple[int, ...], list[str]],
              gains: Mapping[int, list[str]], ref_weights: Mapping[str, torch.Tensor],
              ) -> list[tuple[str, str]]:
    """(reference matrix, gain) for each reference matrix ``value`` is a fold of."""
    found = []
    for ref in by_shape.get(tuple(value.shape), []):
        gain = _gain_between(ref_weights[ref].detach().float(), value,
                             [(g, ref_weights[g]) for g in gains.get(value.shape[1], [])])
        if gain is not None:
            found.append((ref, gain))
    return found


def _fused_folds(label: str, value: torch.Tensor, by_shape: Mapping[tuple[int, ...], list[str]],
                 gains: Mapping[int, list[str]], ref_weights: Mapping[str, torch.Tensor],
                 ) -> list[Fold]:
    """The blocks of rows of a fused projection that are each a fold of a reference matrix
    (a fused QKV with the norm's gain folded in); every block must be one."""
    rows, columns = value.shape
    for shape in sorted({s for s in by_shape if s[1] == columns and s[0] < rows
                         and rows % s[0] == 0}, reverse=True):
        folds = []
        for start in range(0, rows, shape[0]):
            block = _folds_of(value[start:start + shape[0]], by_shape, gains, ref_weights)
            if not block:
                break
            folds += [Fold(label, ref, gain, "fused folded",
                           Region(0, start, start + shape[0])) for ref, gain in block]
        else:
            return folds
    return []


_FOLD_ROUNDING = 2.0 ** -22  # one rounding of float32 (2^-24) each side, and slack


def _gain_between(reference: torch.Tensor, candidate: torch.Tensor,
                  gains: Sequence[tuple[str, torch.Tensor]]) -> str | None:
    """The reference vector ``g`` with ``candidate == reference * g`` column by column, to
    within float32's rounding; None where there is none (or ``g`` is all ones: that is
    "same")."""
    columns = (reference[0].abs() > 0) & (reference[1].abs() > 0)
    if not bool(columns.any()):
        return None
    ratio = candidate[0][columns] / reference[0][columns]
    if not torch.allclose(candidate[1][columns], reference[1][columns] * ratio,
                          rtol=4 * _FOLD_ROUNDING, atol=0.0):
        return None
    for label, gain in gains:
        gain = gain.detach().float()
        if torch.equal(gain, torch.ones_like(gain)) \
                or not torch.allclose(gain[columns], ratio, rtol=4 * _FOLD_ROUNDING, atol=0.0):
            continue
        folded = reference * gain[None, :]
        if bool(((folded - candidate).abs() <= _FOLD_ROUNDING * folded.abs()).all()):
            return label
    return None


def _relate_by_name(reference: GraphView, candidate: GraphView,
                    ref_weights: Mapping[str, torch.Tensor],
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
        return float((a.to(b.device) != b).any())
    # (the candidate may hold its weights on a device of its own)
    return float((a.detach().double().to(b.device) - b.detach().double()).abs().max()) \
        if a.numel() else 0.0



__all__ = ["describe_order", "folds_between", "relate_weights", "relations_remembered",
           "unique_weights"]
