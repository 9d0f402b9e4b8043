"""What the inputs never exercised: a diff that passes says nothing about those paths.

A port that ignores ``token_type_ids`` agrees with HF on single-segment texts; a port
that never applies the attention mask agrees on a batch without padding. These notes say
so, and say which input the reference reads but no recorded op of the candidate reads (or
reads only for its shape).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.diff.ops.outside import handed_from_outside
from introspect.graph import IntrospectGraph
from introspect.tracing.records import KIND_MULTI, KIND_TENSOR


def unexercised_notes(tensors: Mapping[str, torch.Tensor], reference: IntrospectGraph,
                      candidate: IntrospectGraph) -> list[str]:
    """Notes on inputs the candidate never reads, and on paths these inputs leave untested.

    Args:
        tensors: the inputs of the diff, by name.
        reference, candidate: the two traced graphs.

    Returns:
        One sentence per finding, in input order.
    """
    notes = []
    ref_reads, cand_reads = values_read(reference), values_read(candidate)
    # a recording handed values computed where it does not reach (a worker thread, NumPy,
    # vmap) cannot tell which inputs those read: it says nothing of them
    blind = handed_from_outside(candidate)
    for name in tensors if not blind else ():
        if name in ref_reads and name not in cand_reads and name in _placeholders(candidate):
            # (values taken into Python, ``mask.tolist()``, are read by no recorded op:
            # the note says what the recording shows, not that the port ignores them)
            notes.append(f"no recorded op of the candidate reads the values of {name} (at "
                         "most its shape; values taken into Python by tolist() or item() "
                         f"leave no op), while the reference's do: the {name} path is not "
                         "compared op by op")
    token_types = tensors.get("token_type_ids")
    if token_types is not None and token_types.numel() and \
            bool((token_types == token_types.reshape(-1)[0]).all()):
        notes.append(f"every token_type_id is {int(token_types.reshape(-1)[0])}: the "
                     "token-type (segment) path was never exercised; a port that ignores "
                     "token_type_ids would pass; add a text pair to test it")
    mask = tensors.get("attention_mask")
    if mask is not None and mask.numel() and bool((mask != 0).all()):
        notes.append("no padding in the batch: the attention mask was never exercised; "
                     "add texts of different lengths to test it")
    return notes


def values_read(graph: IntrospectGraph) -> set[str]:
    """Inputs whose values reach a tensor the graph computes (not only their shape)."""
    records = {r.name: r for r in graph.records}
    read = set()
    for node in graph.gm.graph.nodes:
        if node.op == "placeholder" and any(
                user.op == "output" or records.get(user.name) is not None
                and records[user.name].kind in (KIND_TENSOR, KIND_MULTI) for user in node.users):
            read.add(str(node.target))  # a user that only takes its size reads no value
    return read


def _placeholders(graph: IntrospectGraph) -> set[str]:
    return {str(n.target) for n in graph.gm.graph.nodes if n.op == "placeholder"}


__all__ = ["unexercised_notes", "values_read"]
