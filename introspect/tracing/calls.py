"""Layers of a shared block called several times (ALBERT): call N is ``encoder.layer.N``.

The layer labels of a graph come from module paths (``introspect.tracing.shapes``); a block whose
modules run several times (ALBERT's one layer, called once per layer of depth) has one
path for every call, so its nodes would all share one label. The diff labels them by
call instead, so that a divergence in the third call reads ``encoder.layer.2``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import torch.fx

from introspect.tracing.records import NodeRecord


def label_repeated_calls(records: Sequence[NodeRecord],
                         gm: torch.fx.GraphModule) -> list[NodeRecord]:
    """``records`` with the nodes of each call of a shared block labelled by call.

    Args:
        records: the graph's node records, in graph order.
        gm: the traced graph (its ``call_module`` nodes say which modules run twice).

    Returns:
        The records, relabelled where a block runs more than once; the same list
        otherwise.
    """
    calls = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_module")
    repeated = {m for m, k in calls.items() if k > 1}
    if not repeated:
        return list(records)
    block = _shared_block(repeated, calls)
    if not block:
        return list(records)
    # A call ends with the block's last module: what follows belongs to the next call
    # (its shape bookkeeping comes before its first module).
    last_leaf = [r.target for r in records
                 if r.op == "call_module" and _inside(r.target, block)][-1]
    count = calls[last_leaf]
    call, labelled = 0, []
    for r in records:
        if _inside(r.module, block):
            r = dataclasses.replace(r, layer=f"encoder.layer.{min(call, count - 1)}")
        if r.op == "call_module" and r.target == last_leaf:
            call += 1
        labelled.append(r)
    return labelled


def _shared_block(repeated: set[str], calls: Counter[str]) -> str:
    """The longest module path holding every repeatedly called module, all called alike.

    One module called many times (a dropout shared by every layer of a port) is no
    block: it says nothing about layers.
    """
    if len(repeated) < 2:
        return ""
    paths = [m.split(".") for m in repeated]
    common: list[str] = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    block = ".".join(common)
    counts = {k for m, k in calls.items() if _inside(m, block)}
    return block if block and len(counts) == 1 else ""


def _inside(path: str, block: str) -> bool:
    return path == block or path.startswith(block + ".")


__all__ = ["label_repeated_calls"]
