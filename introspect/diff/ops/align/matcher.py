"""The matcher's state and step 2 of alignment: anchors on inputs, weights and outputs.

Nodes that read related weights are paired; a slice or a fusion becomes a pair on a
region of the output's last dimension, and the candidate's nodes that cut a fused output
apart (``split``, ``chunk``, ``[..., a:b]``) are paired with the parts. The graphs'
inputs pair by name and their outputs by key.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from introspect.diff.modules.folds import folded_onward
from introspect.diff.ops.align.cuts import parts_cut
from introspect.diff.ops.align.view import GraphView, graph_outputs
from introspect.diff.ops.align.weights import describe_order
from introspect.diff.ops.eager import mutates_in_place
from introspect.diff.ops.outside import handed_values
from introspect.diff.records import (
    BY_CONSUMER,
    BY_INPUT,
    BY_OUTPUT,
    BY_STRUCTURE,
    BY_WEIGHTS,
    PROVEN_STRUCTURE,
    Pair,
    Region,
    WeightRelation,
)
from introspect.errors import InputError

# a pair whose weights are related by their names alone, holding other values (a weight
# left unloaded, or a norm's gain folded into the Linear after it)
BY_NAME_NOTE = "weights related by name only"
POSITION_NOTE = ("several of the reference's nodes read these weights alike; paired by "
                 "graph position")
OPAQUE_NOTE = ("the candidate's op is its own library's (opaque): which value it returns "
               "is not proven by the weights it reads")
SCALING_NOTE = ("a gain multiplied in: it may be applied before or after the values it "
                "scales are normalized (``g * x * rsqrt(ms)``), so the weight does not prove "
                "which value the node holds")
_TORCH_NAMESPACES = ("aten", "prims", "quantized", "_quantized", "torchvision")
# How far a vector's reader looks upstream for paired nodes, and downstream from them.
_SETTLE_DEPTH = 10


class Matcher:
    """The pairs found so far and the indexes that steps 2 to 5 read and extend."""

    def __init__(self, reference: GraphView, candidate: GraphView,
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
        # Pairs whose arguments hold different quantities: an offset embedding table is
        # read at other indices (position + 2 in the reference, position in the candidate).
        self.own_arguments: set[tuple[str, str]] = set()
        # (reference, candidate) anchors on a vector several reference nodes read alike
        # (LayerNorms at (1, 0)), settled by graph position: a guess, not a proof
        self.by_position: set[tuple[str, str]] = set()
        self._edited: dict[str, str] = {}  # candidate node -> what writes into it later

    # -- bookkeeping ---------------------------------------------------------------------
    def add(self, pair: Pair) -> None:
        if pair.matched_by in (BY_STRUCTURE, BY_CONSUMER, BY_OUTPUT) \
                and self.edited_after(pair.candidate):  # (its recorded value is not the
            return  # one it stands for later: a buffer filled in place)
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

    def edited_after(self, candidate: str) -> str:
        """``_edited_after`` of the candidate's node, found once."""
        if candidate not in self._edited:
            self._edited[candidate] = _edited_after(self.cand, candidate)
        return self._edited[candidate]

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
        self._repeated_calls([c for c in weighted if reads_matrix[c]])
        self._claim([c for c in weighted if reads_matrix[c]])
        self._claim([c for c in weighted if not reads_matrix[c]])  # biases, LayerNorms
        self._cut_parts()

    def _repeated_calls(self, nodes: list[str]) -> None:
        """A shared module called N times on each side (ALBERT): call k pairs with call k.

        Every call reads the same weights, so the weights alone cannot tell the calls
        apart; their order can, when both sides call the module equally often.
        """
        readers: dict[str, list[str]] = {}
        for c in nodes:
            readers.setdefault(self._primary(c)[0], []).append(c)
        for label, calls in readers.items():
            if len(calls) < 2:
                continue
            for relation in self.relations.get(label, []):
                refs = sorted((r for r, weights in self.ref.weights.items()
                               if self.ref.compared(r)
                               and any(w == relation.reference for w, _ in weights)),
                              key=self.ref.order.__getitem__)
                if len(refs) != len(calls) or not all(
                        self._fits(r, c, relation) for r, c in zip(refs, calls, strict=True)):
                    continue
                for r, c in zip(refs, calls, strict=True):
                    if (c, _cand_region(relation)) in self.taken:
                        continue
                    self.taken.add((c, _cand_region(relation)))
                    self.add(Pair(r, c, BY_WEIGHTS, _relation_note(relation), _ref_region(relation),
                                  _cand_region(relation), relation.order))

    def _primary(self, c: str) -> tuple[str, torch.Tensor]:
        """The weight that identifies what ``c`` computes: its largest matrix."""
        found = self.cand.weights[c]
        matrices = [w for w in found if w[1].ndim >= 2]
        return max(matrices or found, key=lambda w: (w[1].ndim >= 2, w[1].numel()))

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
            if earlier:  # a bias added onto the matmul: the later node holds the result
                if self.cand.order[c] < self.cand.order[earlier[0].candidate] or \
                        earlier[0].candidate_region != _cand_region(relation) or \
                        not self._adds_onto(c, earlier[0].candidate):
                    continue  # (added elsewhere: ``biases_apart`` compares the product)
                self.remove(earlier[0])
                options.append((earlier[0].candidate, relation))
            for other, _ in options:
                if other != c:
                    self.superseded.setdefault(other, c)
            self.taken.add((c, _cand_region(relation)))
            note = _relation_note(relation)
            guess = (r, c) in self.by_position
            if guess:
                note = "; ".join(n for n in (note, POSITION_NOTE) if n)
            elif self._opaque(r, c):
                guess = True
                note = "; ".join(n for n in (note, OPAQUE_NOTE) if n)
            elif self._scaling(c) and not relation.kind.startswith("by-name"):
                # (a gain held with other values is paired by its name: that is the fault)
                guess = True
                note = "; ".join(n for n in (note, SCALING_NOTE) if n)
            self.add(Pair(r, c, BY_WEIGHTS, note, ref_region, _cand_region(relation),
                          relation.order, PROVEN_STRUCTURE if guess else ""))
            if relation.kind == "row block" or "folded" in relation.kind:
                # (a folded Linear reads the norm's output before its gain: not the
                # reference Linear's input)
                self.own_arguments.add((r, c))

    def _scaling(self, c: str) -> bool:
        """Whether ``c`` multiplies (or divides) by a vector, no matrix: a norm's gain,
        which commutes with the row's normalization, so where it is applied is the port's
        choice."""
        return self.cand.kinds[c] in ("mul", "div") and \
            all(t.ndim < 2 for _, t in self.cand.weights.get(c, []))

    def _opaque(self, r: str, c: str) -> bool:
        """Whether ``c`` is an op of the port's own library (``torch.library``, a C++ or
        CUDA kernel) that reads the weights of ``r``, an op of another kind: what it does
        with them is not seen, so its output may hold a later quantity (a Linear and its
        activation fused in one kernel)."""
        target = self.cand.nodes[c].target
        namespace = getattr(target, "namespace", None)
        return isinstance(target, torch._ops.OpOverload) and namespace not in _TORCH_NAMESPACES \
            and self.ref.kinds[r] != self.cand.kinds[c]

    def _anchor_options(self, c: str) -> list[tuple[WeightRelation, str]]:
        """(relation, reference node) for the weights ``c`` reads, primary weight first."""
        primary = self._primary(c)
        options = []
        for relation in self.relations.get(primary[0], []):
            if relation.kind == "slice" and self.cand.kinds[c] == "embedding":
                relation = dataclasses.replace(relation, kind="row block")  # an offset table
            consumers = [r for r, weights in self.ref.weights.items()
                         if any(label == relation.reference for label, _ in weights)
                         and self.ref.compared(r)]
            fitting = [r for r in consumers if self._fits(r, c, relation)]
            same_kind = [r for r in fitting if self.ref.kinds[r] == self.cand.kinds[c]]
            options += [(relation, r) for r in (same_kind or fitting)]
        if primary[1].ndim >= 2:
            return options
        by_region: dict[Region | None, list[tuple[WeightRelation, str]]] = {}
        for option in options:  # a fused bias: one reference vector per region
            by_region.setdefault(option[0].region, []).append(option)
        settled: list[tuple[WeightRelation, str]] = []
        for group in by_region.values():
            if len({r for _, r in group}) == 1:
                settled += group
                continue
            chosen = self._settle_vector(c, group)
            self.by_position |= {(r, c) for _, r in chosen}
            settled += chosen
        return settled

    def _settle_vector(self, c: str, options: list[tuple[WeightRelation, str]],
                       ) -> list[tuple[WeightRelation, str]]:
        """A vector (bias, LayerNorm) read by many nodes: keep the one at ``c``'s place.

        Graph order brackets it: ``c`` sits between the two nearest nodes anchored on
        matrices, so its partner sits between theirs in the reference. Where the
        candidate runs blocks in another order than the reference (layers out of order),
        the bracket is upside down: the partner is then the first option after the
        anchor before ``c``. A bias added right after its matmul belongs to the matmul's
        own partner; anything else (a hand-written LayerNorm's shift) to the first
        option after it.
        """
        anchored = sorted((self.cand.order[p.candidate], p.reference) for p in self.pairs
                          if p.matched_by == BY_WEIGHTS)
        position = self.cand.order[c]
        before = [r for o, r in anchored if o < position]
        after = [r for o, r in anchored if o > position]
        end = len(self.ref.order) + 1
        low = self.ref.order[before[-1]] if before else -1
        high = self.ref.order[after[0]] if after else end
        if high <= low:
            high = end
        inside = [(rel, r) for rel, r in options if low <= self.ref.order[r] < high]
        ancestors, steps = self._paired_ancestors(c)
        own = {p.reference for p in self.pairs if p.candidate in ancestors}
        if steps == 1:
            inside = [(rel, r) for rel, r in inside if r in own] or inside
        else:
            inside = [(rel, r) for rel, r in inside if self.ref.order[r] > low]
        if not inside:
            return []
        first = min(self.ref.order[r] for _, r in inside)
        return [(rel, r) for rel, r in inside if self.ref.order[r] == first]

    def _paired_ancestors(self, c: str) -> tuple[set[str], int]:
        """The paired nodes nearest upstream of ``c``, and how many steps up they are."""
        found: set[str] = set()
        seen, frontier = {c}, [c]
        for step in range(1, _SETTLE_DEPTH + 1):
            nxt = []
            for name in frontier:
                for i in self.cand.data_inputs(name):
                    if i in seen:
                        continue
                    seen.add(i)
                    (found.add(i) if i in self.cand_paired else nxt.append(i))
            if found:  # the nearest level only: farther ones lead everywhere
                return found, step
            frontier = nxt
        return found, 0

    def _fits(self, r: str, c: str, relation: WeightRelation) -> bool:
        """Whether ``c``'s output can hold ``r``'s (or a region of it) up to a reshape.

        The rows may be laid out differently (a port that flattens the batch before an
        ``addmm``: (B*S, H) against (B, S, H); a position lookup (S, H) against (1, S, H)),
        but the feature dimension and the number of rows must agree.
        """
        ref_shape, cand_shape = self.ref.records[r].shape, self.cand.records[c].shape
        if not ref_shape or not cand_shape or not self.same_value_kind(r, c):
            return False
        region = None if relation.kind == "row block" else relation.region
        ref_last, cand_last = ref_shape[-1], cand_shape[-1]
        if relation.kind.endswith("reshaped"):  # the layout is found by value when compared
            return math.prod(ref_shape) == math.prod(cand_shape)
        if region is not None and relation.kind.startswith("fused"):
            ref_last = region.stop - region.start  # the candidate's output holds the reference's
            if ref_shape[-1] != ref_last:
                return False
        elif region is not None:
            cand_last = region.stop - region.start
            if cand_shape[-1] != cand_last:
                return False
            cand_last = ref_shape[-1]
        elif ref_last != cand_last:
            return False
        return math.prod(ref_shape[:-1]) == math.prod(cand_shape[:-1])

    def _adds_onto(self, c: str, product: str) -> bool:
        """Whether ``c`` takes ``product`` itself as an input: ``x @ W.T + b``, not
        ``(x @ W.T + r) + b``, which holds a residual too."""
        return any(n.name == product for n in self.cand.nodes[c].all_input_nodes)

    def biases_apart(self) -> None:
        """A pair proven by a Linear's weight matrix whose candidate node reads none of the
        Linear's bias, while the candidate holds that bias elsewhere (added before the
        product, ``(x + b) + x @ W.T``, or after it through other ops, per head): the node
        holds the product alone, so it is compared with the reference's output less the
        bias (``Pair.reference_bias``). A bias the candidate holds nowhere is left in: its
        absence is the fault."""
        held = {rel.reference for found in self.relations.values() for rel in found}
        for pair in list(self.pairs):
            if pair.matched_by != BY_WEIGHTS or pair.reference_bias:
                continue
            bias = self._linear_bias(pair.reference)
            if bias is None:
                continue
            fold = self._folded_bias(pair, bias)
            unseen = fold is None and bias not in held and self._handed_on_unseen(pair.candidate)
            onward = None if fold is not None or bias in held else self._folded_onward(bias)
            if fold is None and bias not in held and not self._read_reshaped(bias) \
                    and not unseen and onward is None:
                continue
            if fold is None and bias in self._read_through_moves(pair.candidate):
                continue
            if fold is not None and fold[2] in self._cand_vectors_read(pair.candidate):
                continue  # its folded bias is added in the node itself
            what = bias if fold is None else f"{bias} + {fold[0]} @ {fold[1]}"
            where = ("adds that bias, if at all, where the recording does not reach (the "
                     "outputs and module evidence judge it)") if unseen \
                else "adds that bias elsewhere"
            if onward is not None:
                where = f"holds it folded into a later bias ({onward})"
            note = "; ".join(n for n in (pair.note, f"compared less {what}: the candidate "
                                         f"{where}") if n)
            self.remove(pair)
            self.add(dataclasses.replace(
                pair, reference_bias=bias, note=note,
                reference_shift=(fold[0], fold[1]) if fold is not None else None))

    def _folded_onward(self, bias: str) -> str | None:
        """Where the candidate holds the reference's ``bias`` folded into a later Linear's
        bias (``modules.folds``: a value bias added to the output projection's through
        ``W_o``): "candidate vector = later bias + its weight @ bias", or None."""
        values = {label: t for found in self.ref.weights.values() for label, t in found}
        if bias not in values:
            return None
        linears = []
        for r, weights in self.ref.weights.items():
            later = self._linear_bias(r)
            matrix = next((t for _, t in weights if t.ndim == 2), None)
            if later is not None and later != bias and matrix is not None:
                linears.append((later, matrix, values[later]))
        vectors = [(label, t) for found in self.cand.weights.values() for label, t in found]
        fold = folded_onward(values[bias], linears, vectors)
        if fold is None:
            return None
        label, later = fold
        return f"{label} = {later} + {later.rpartition('.')[0]}.weight @ {bias}"

    def _handed_on_unseen(self, c: str) -> bool:
        """The candidate's node ``c`` is used by no recorded node, in a recording handed
        values computed where it does not reach: what ``c`` holds went there (a product
        handed to a TorchScript helper that adds the bias and the GELU), and whether the
        bias was added is not the recording's to say."""
        return bool(handed_values(self.cand.gm)) and not self.cand.nodes[c].users

    def _folded_bias(self, pair: Pair, bias: str) -> tuple[str, str, str] | None:
        """For a pair proven by a folded weight (``W * g``, a norm's gain folded in), the
        reference matrix, the norm's shift, and the candidate's vector that holds
        ``bias + W @ shift`` (the shift folded into the bias too), within float32's
        rounding of that sum; None where the pair is not folded or no such vector is
        held."""
        relation = next((rel for label, _ in self.cand.weights.get(pair.candidate, [])
                         for rel in self.relations.get(label, []) if "folded" in rel.kind
                         and rel.reference in {w for w, _ in self.ref.weights[pair.reference]}),
                        None)
        if relation is None:
            return None
        shift = relation.scaled_by.rpartition(".")[0] + ".bias"
        wanted = {shift, bias, relation.reference}
        values = {label: t.detach().double() for found in self.ref.weights.values()
                  for label, t in found if label in wanted}
        if wanted - values.keys():
            return None
        matrix, offset = values[relation.reference], values[shift]
        folded = values[bias] + matrix @ offset
        # a float32 sum of n products rounds by at most n units of its terms' magnitude
        slack = matrix.shape[1] * 2.0 ** -23 * (values[bias].abs() + matrix.abs() @ offset.abs())
        for found in self.cand.weights.values():
            for label, t in found:
                if t.ndim == 1 and t.shape == folded.shape and t.is_floating_point() \
                        and bool(((t.detach().double().to(folded.device) - folded).abs()
                                   <= slack).all()):
                    return relation.reference, shift, label
        return None

    def _cand_vectors_read(self, c: str) -> set[str]:
        """The candidate's vectors ``c`` reads itself (an ``nn.Linear``'s bias)."""
        return {label for label, t in self.cand.weights.get(c, []) if t.ndim == 1}

    def _read_through_moves(self, c: str) -> set[str]:
        """The reference weights related to what ``c`` reads, or what the node it only
        cuts, lays out or casts reads (a fused projection's chunk: the fused Linear adds
        all three biases)."""
        read: set[str] = set()
        frontier, seen = [c], {c}
        while frontier:
            name = frontier.pop()
            read |= {rel.reference for label, _ in self.cand.weights.get(name, [])
                     for rel in self.relations.get(label, [])}
            node = self.cand.nodes[name]
            if self.cand.transparent(name) or self.cand.kinds[name] in _CUTS:
                for source in node.all_input_nodes:
                    if source.name not in seen and source.op != "get_attr":
                        seen.add(source.name)
                        frontier.append(source.name)
        return read

    def _read_reshaped(self, label: str) -> bool:
        """Whether some candidate node reads the reference's weight ``label`` reshaped
        (``b.view(heads, 1, head_size)``, which no relation names), bit for bit."""
        value = next((t for found in self.ref.weights.values() for name, t in found
                      if name == label), None)
        if value is None:
            return False
        flat = value.detach().reshape(-1)
        return any(t.numel() == flat.numel() and t.dtype == flat.dtype
                   and torch.equal(t.detach().reshape(-1), flat)
                   for found in self.cand.weights.values() for _, t in found)

    def _linear_bias(self, r: str) -> str | None:
        """The bias of the reference's Linear-like node ``r`` (one matrix, one vector as
        long as one of its sides), or None."""
        weights = self.ref.weights.get(r, [])
        matrices = [t for _, t in weights if t.ndim == 2]
        vectors = [(label, t) for label, t in weights if t.ndim == 1]
        if len(matrices) != 1 or len(vectors) != 1 or len(weights) != 2:
            return None
        label, vector = vectors[0]
        if vector.shape[0] not in matrices[0].shape or label.endswith("(constant)"):
            return None
        return label

    def _cut_parts(self) -> None:
        """Nodes that cut a fused output into the parts the other graph computes apart."""
        for pair in list(self.pairs):
            if pair.candidate_region is not None:
                for part in parts_cut(self.cand, pair.candidate, pair.candidate_region):
                    if part not in self.cand_paired:
                        self.add(Pair(pair.reference, part, BY_WEIGHTS,
                                      f"{pair.candidate}{pair.candidate_region}: "
                                      f"part of a fused output"))
            if pair.reference_region is not None:
                for part in parts_cut(self.ref, pair.reference, pair.reference_region):
                    if part not in self.ref_paired:
                        self.add(Pair(part, pair.candidate, BY_WEIGHTS,
                                      f"{pair.reference}{pair.reference_region}: "
                                      f"part of a fused output"))

    def outputs(self) -> list[str]:
        notes = []
        ref_out, cand_out = graph_outputs(self.ref), graph_outputs(self.cand)
        cand_returned = graph_outputs(self.cand, every=True)  # (made outside torch too)
        unpaired_cand = dict(cand_out)
        found = 0
        for key, r in ref_out.items():
            c = cand_out.get(key)
            if c is None or self.ref.shape(r) != self.cand.shape(c):
                c = next((n for k, n in unpaired_cand.items() if k not in ref_out
                          and self.ref.shape(r) == self.cand.shape(n)), None)
            if c is None and key in cand_returned:
                notes.append(f"the candidate's output {key!r} comes from no op its recording saw "
                             "on the inputs (made outside torch: NumPy, another thread?): "
                             "only its plain calls compare it")
                continue
            if c is None:
                notes.append(f"the reference's output {key!r} has no counterpart in the candidate")
                continue
            unpaired_cand = {k: n for k, n in unpaired_cand.items() if n != c}
            found += 1
            if c in self.ref_partners.get(r, set()):
                continue
            edited = self.edited_after(c)
            if edited:
                notes.append(f"the candidate's output {key!r} is written in place after "
                             f"{c} made it ({edited}): only its plain calls compare it")
                continue
            if self.same_value_kind(r, c):  # outputs are always compared, even if either
                self.add(Pair(r, c, BY_OUTPUT, f"output {key!r}"))  # side is paired already
        if not found:
            ref_shapes = ", ".join(f"{k}={self.ref.records[n].shapes}" for k, n in ref_out.items())
            cand_shapes = ", ".join(f"{k}={self.cand.records[n].shapes}"
                                    for k, n in cand_out.items())
            raise InputError(
                f"the two models return different outputs: reference ({ref_shapes}), "
                f"candidate ({cand_shapes}); diff compares two implementations of one model "
                "and head"
            )
        return notes



def _edited_after(graph: GraphView, name: str) -> str:
    """The op that writes into ``name``'s value in place, or into a view of it, after
    ``name`` made it ("" where none does): ``out[b, :n] = row`` fills a buffer
    ``new_zeros`` made, and the value stands for that node still. Its recorded value is
    the buffer as it was made, not what the model returns (probe round p: a correct port
    padding its rows back into zeros FAILED by 5.47 at its output). (An op whose result
    is the value itself, ``out.copy_(x)`` or ``out += x``, stands for it from then on.)"""
    views, frontier = {name}, [name]
    while frontier:
        node = graph.nodes[frontier.pop()]
        for user in node.users:
            if mutates_in_place(user) and user.args and user.args[0] is node:
                return user.name
            if user.name not in views and _op_name(user) in _VIEWS \
                    and user.args and user.args[0] is node:
                views.add(user.name)
                frontier.append(user.name)
    return ""


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


# Ops whose result is a view of their first argument: what is written into it is written
# into the argument.
_VIEWS = frozenset({"view", "getitem", "select", "narrow", "transpose", "permute", "unsqueeze",
                    "squeeze", "expand", "t", "view_as", "unflatten", "movedim", "swapaxes",
                    "as_strided", "diagonal", "unfold", "split", "chunk"})


# Kinds of ops that take a part of a value as it is, beside the transparent ones
# (``GraphView.transparent``): a fused projection's output sliced, ``x[..., :H]``.
_CUTS = {"getitem", "narrow"}


def _ref_region(relation: WeightRelation) -> Region | None:
    if relation.region is None or relation.kind.startswith("fused") or \
            relation.kind == "row block":
        return None
    return Region(-1, relation.region.start, relation.region.stop)


def _cand_region(relation: WeightRelation) -> Region | None:
    if relation.region is None or not relation.kind.startswith("fused"):
        return None
    return Region(-1, relation.region.start, relation.region.stop)


def _relation_note(relation: WeightRelation) -> str:
    if relation.kind == "same":
        return ""
    if "folded" in relation.kind:
        how = " (stored transposed)" if relation.kind.endswith("transposed") else \
            f" (rows {relation.region.start}:{relation.region.stop} of it)" \
            if relation.region is not None else ""
        return (f"{relation.candidate}{how} is {relation.reference} with each column scaled "
                f"by {relation.scaled_by} (a norm's gain folded in)")
    if relation.kind.startswith("by-name"):
        return (f"{BY_NAME_NOTE}: {relation.candidate} differs from "
                f"{relation.reference} by up to {relation.max_abs_diff:.3g}")
    if relation.kind.startswith("fused"):
        return (f"{relation.reference} is rows {relation.region} of {relation.candidate} "
                f"({relation.kind})")
    if relation.kind == "transposed":
        return f"{relation.candidate} is {relation.reference} transposed"
    if relation.kind == "permuted" and relation.order is not None:
        return (f"{relation.candidate} is {relation.reference} with its "
                f"{describe_order(relation.order)}; compared with the features put back")
    if relation.kind.endswith("reshaped"):
        return f"{relation.candidate} is {relation.reference} {relation.kind}"
    if relation.kind.startswith("quantized"):
        how = " and transposed" if relation.kind.endswith("transposed") else ""
        to = "float16" if "float16" in relation.kind else "int8"
        return (f"{relation.candidate} is {relation.reference} quantized to {to}{how} "
                f"(every element within one quantization step; up to "
                f"{relation.max_abs_diff:.3g} apart)")
    if relation.kind == "row block" and relation.region is not None:
        return (f"{relation.candidate} is rows {relation.region.start}:{relation.region.stop} "
                f"of {relation.reference}: an offset embedding table (entry i of the "
                f"candidate's is entry i+{relation.region.start} of the reference's)")
    return (f"{relation.candidate} is rows {relation.region} of {relation.reference} "
            f"({relation.kind})")


__all__ = ["Matcher"]
