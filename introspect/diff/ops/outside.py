"""Values a recording was handed from outside it: computed during the call, where the
recorder does not reach (a worker thread, NumPy), and held by nobody once it returned.

A recording names every tensor it did not see made a ``_tensor_constant``. Most are what
the port holds (weights as plain tensors, a dict of them, a table kept as an attribute, a
global), and are constants. One computed in a worker thread or in NumPy is not: it is a
model value, of the inputs, that the recording saw only as it came back (a layer run in a
thread hands its output to the next layer's ops). Nothing holds it once the call returned
but the recorder itself: that is how it is told apart (``gc``'s referrers, which see every
container a port keeps a tensor in: a module's ``__dict__``, a dict, a list, a closure's
cell, a module's globals). The alignment pairs such a value as it pairs an op's
(``align.view``), so that a fault computed where the recording does not reach is named in
the reference's layer whose value it stands for, not in the first compared op after it.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch._C._functorch import is_functorch_wrapped_tensor

COMPUTED_OUTSIDE = "computed_outside"  # the ``GraphModule.meta`` key: their node targets
# how the hint of a divergence named at such a value begins (``ops.divergence``)
OUTSIDE_HINT = "the candidate computes "
OUTSIDE_HINT_END = "where the recording does not reach"


def computed_outside(constants: Mapping[str, torch.Tensor], ours: Iterable[Any]) -> set[str]:
    """The names in ``constants`` whose tensor nothing holds but ``ours`` (the recorder's
    own containers, and ``constants`` itself): values computed during the call. (One scan
    of every object, about 0.2 s with transformers loaded: a tensor once found held, a
    port's weight, is not looked for again, so a port's one-token steps pay it once.)"""
    unknown = {name: t for name, t in constants.items()
               if not _held_before(t) and not is_functorch_wrapped_tensor(t)}
    # (a ``vmap`` level's tensor, seen unwrapped by the recorder, is the mapped call's own)
    if not unknown:
        return set()
    mine = {id(o) for o in ours} | {id(constants), id(unknown)}
    tensors = {id(t) for t in unknown.values()}
    held: set[int] = set()
    for referrer in gc.get_referrers(*unknown.values()):
        if id(referrer) in mine or isinstance(referrer, torch.Tensor):
            continue  # (a tensor's own reference to its base is no holder)
        held |= {id(r) for r in gc.get_referents(referrer)} & tensors
    outside = set()
    for name, t in unknown.items():
        if id(t) in held:
            _HELD[id(t)] = weakref.ref(t, _forget(id(t)))
        else:
            outside.add(name)
    return outside


# tensors found held, by identity (a weak reference each: a tensor born where a dead one
# was, the same ``id``, is not taken for it; ``WeakSet`` would compare tensors by value);
# a dead one's entry goes with it
_HELD: dict[int, weakref.ref[torch.Tensor]] = {}


def _forget(key: int) -> Callable[[weakref.ref[torch.Tensor]], None]:
    def forget(ref: weakref.ref[torch.Tensor]) -> None:
        if _HELD.get(key) is ref:  # (not a later tensor's, born at the same ``id``)
            del _HELD[key]
    return forget


def _held_before(tensor: torch.Tensor) -> bool:
    found = _HELD.get(id(tensor))
    return found is not None and found() is tensor


def merged_outside(graph: torch.fx.Graph, constants: Mapping[str, torch.Tensor],
                   outside: set[str]) -> set[str]:
    """One node for each value computed outside (the recorder made one per use: a
    thread's output read by the next layer's three projections and its residual): every
    use of one tensor reads its first node. The names kept."""
    first: dict[int, torch.fx.Node] = {}
    kept: set[str] = set()
    for node in list(graph.nodes):
        if node.op != "get_attr" or node.target not in outside:
            continue
        tensor = constants[str(node.target)]
        if id(tensor) in first:
            node.replace_all_uses_with(first[id(tensor)])
            graph.erase_node(node)
        else:
            first[id(tensor)] = node
            kept.add(str(node.target))
    return kept


def outside_hint(where: str, node: str) -> str:
    """The hint of a divergence named at ``node``, a value standing for ``where``'s."""
    return (f"{OUTSIDE_HINT}{where}'s value {OUTSIDE_HINT_END} (a worker thread, NumPy, "
            "TorchScript, vmap) and "
            f"is handed it back ({node}): its error is all it carries, its own part and "
            "what came into it alike")


def handed_from_outside_hint(hints: Iterable[str]) -> bool:
    """A divergence's ``hints`` say it is named at a value handed from outside."""
    return any(h.startswith(OUTSIDE_HINT) and OUTSIDE_HINT_END in h for h in hints)


def handed_values(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The targets of the ``get_attr`` nodes of a recorded ``gm`` that stand for values
    computed outside it (none for a graph that was not recorded)."""
    return gm.meta.get(COMPUTED_OUTSIDE, frozenset())


def handed_from_outside(graph: Any) -> bool:
    """The recorded ``graph`` (an ``IntrospectGraph``) holds a value computed outside it."""
    return bool(handed_values(graph.gm))


__all__ = ["COMPUTED_OUTSIDE", "computed_outside", "handed_from_outside",
           "handed_from_outside_hint", "handed_values", "merged_outside", "outside_hint"]
