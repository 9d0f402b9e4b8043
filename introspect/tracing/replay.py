"""Trace a repeated layer once and replay its nodes for the other layers.

BERT-base has twelve ``BertLayer``s in one ``nn.ModuleList``: same class, same parameter
layout, called with arguments of the same shapes. Tracing each of them gives the same
nodes with another module path, so the tracer traces the first one, records the nodes
it made, and for every other layer of the list creates the same nodes again with
``encoder.layer.0`` renamed to ``encoder.layer.N``. Nodes are created through the same
graph with the same targets in the same order, so fx gives them the names a full trace
would give; their trace-time values (FakeTensors) are the recorded layer's, which is
sound because the arguments' metadata are identical.

A layer is replayed only when it is a different module of the same ``ModuleList`` with
the same class, parameter and buffer layout, plain attributes (``layer_idx`` aside, private
ones included) and no hooks, all its classes torch's, HF's or introspect's own and
unpatched (a port's layers are each traced: ``trace_cache.layer_state``), called with
arguments of identical metadata, and when the recorded layer's nodes read nothing but
its own arguments and target nothing outside its own path. Anything else is traced in
full; where a layer like a recorded one could not be replayed, the tracer keeps a note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from introspect.tracing import cache as trace_cache

# HF numbers its layers for the key/value cache; the number never reaches an encoder's graph.
_PER_LAYER_COUNTERS = frozenset({"layer_idx", "layer_index", "layer_id"})
_PLAIN = (bool, int, float, str, type(None), torch.dtype)


@dataclass
class LayerRecord:
    """What tracing one layer of a ``ModuleList`` made, for replaying the others."""

    module: torch.nn.Module
    path: str  # "encoder.layer.0"
    arguments: tuple[Any, ...]  # metadata of every argument, in flattened order
    argument_nodes: list[torch.fx.Node | None]  # the node behind each argument (or None)
    nodes: list[torch.fx.Node] = field(default_factory=list)
    output: Any = None  # the value the layer returned (Proxies inside)
    decisions: list[tuple[int, Any]] = field(default_factory=list)  # (nodes before, Decision)
    calls: dict[str, int] = field(default_factory=dict)  # tracer.num_calls increments
    unreplayable: str = ""  # why the others cannot replay it ("" when they can)


def module_list_of(root: torch.nn.Module, path: str) -> str | None:
    """The path of the ``nn.ModuleList`` holding the module at ``path``, or None."""
    parent, _, _ = path.rpartition(".")
    if not parent:
        return None
    try:
        holder = root.get_submodule(parent)
    except AttributeError:
        return None
    return parent if isinstance(holder, torch.nn.ModuleList) else None


def layer_signature(module: torch.nn.Module) -> tuple[Any, ...] | None:
    """Class, state and parameter layout; None when the layer may not be replayed.

    Only layers of torch's, HF's and introspect's own classes, unpatched, with no hooks and
    only plain attributes (``trace_cache.layer_state``) are replayed: a port's layer may
    pick its graph by anything (a private flag, a dict keyed on ``id(self)``, a global), so
    each one is traced for real.
    """
    state = trace_cache.layer_state(module, _PER_LAYER_COUNTERS)
    if state is None:
        return None
    layout: list[Any] = [type(module), state]
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        layout.append((name, tuple(tensor.shape), tensor.dtype, tensor.requires_grad))
    return tuple(layout)


def describe_arguments(args: tuple[Any, ...], kwargs: dict[str, Any],
                       meta_of: Callable[[torch.fx.Node], Any]
                       ) -> tuple[tuple[Any, ...], list[torch.fx.Node | None]] | str:
    """Hashable metadata of every argument and the nodes behind them, or why not."""
    described: list[Any] = []
    nodes: list[torch.fx.Node | None] = []
    problem = _describe(args, "args", meta_of, described, nodes) or \
        _describe(kwargs, "kwargs", meta_of, described, nodes)
    return problem or (tuple(described), nodes)


def _describe(value: Any, where: str, meta_of: Callable[[torch.fx.Node], Any],
              described: list[Any], nodes: list[torch.fx.Node | None]) -> str:
    """Append ``value``'s leaves to ``described``/``nodes``; return why it cannot, or ""."""
    if type(value) in (tuple, list, dict):
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        described.append((where, type(value), tuple(key for key, _ in items)))
        for key, item in items:
            problem = _describe(item, f"{where}[{key!r}]", meta_of, described, nodes)
            if problem:
                return problem
        return ""
    if isinstance(value, torch.fx.Proxy):
        described.append((where, "node", _value_key(meta_of(value.node))))
        nodes.append(value.node)
        return ""
    if isinstance(value, torch.Tensor):
        return f"argument {where} is a real tensor"
    if not isinstance(value, _PLAIN):
        return f"argument {where} is a {type(value).__name__}"
    described.append((where, type(value), value))
    nodes.append(None)
    return ""


def _value_key(value: Any) -> Any:
    """What a trace-time value looks like to the code reading it: shapes, not numbers."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype,
                value.device, value.requires_grad)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_value_key(v) for v in value))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    return ("object", id(value))  # never equal across layers unless the very same object


def finish_record(record: LayerRecord, first_new: torch.fx.Node | None,
                  graph: torch.fx.Graph) -> None:
    """Collect the nodes the layer's trace made and check that they can be replayed."""
    node = first_new
    while node is not None and node is not graph._root:
        record.nodes.append(node)
        node = node.next
    inside = set(record.nodes)
    allowed = inside | {n for n in record.argument_nodes if n is not None}
    prefix = record.path + "."
    for node in record.nodes:
        if node.op in ("call_module", "get_attr") and not str(node.target).startswith(prefix):
            record.unreplayable = f"node {node.name} reads {node.target}, outside the layer"
            return
        outside = [n.name for n in node.all_input_nodes if n not in allowed]
        if outside:
            record.unreplayable = (f"node {node.name} reads {', '.join(outside)}, which is "
                                   "not one of the layer's arguments")
            return
    problem = _output_problem(record.output, allowed)
    if problem:
        record.unreplayable = problem


def _output_problem(value: Any, allowed: set[torch.fx.Node]) -> str:
    if isinstance(value, torch.fx.Proxy):
        return "" if value.node in allowed else "it returns a node from outside the layer"
    if type(value) in (tuple, list, dict):
        items = value.values() if isinstance(value, dict) else value
        return next((p for p in (_output_problem(v, allowed) for v in items) if p), "")
    if isinstance(value, _PLAIN):
        return ""
    return f"it returns a {type(value).__name__}"


def argument_mapping(record: LayerRecord, argument_nodes: list[torch.fx.Node | None]
                     ) -> dict[torch.fx.Node, torch.fx.Node] | None:
    """The recorded layer's argument nodes -> this call's, or None where they disagree.

    One node passed twice to the recorded layer but two different nodes passed here
    cannot be replayed: the recorded nodes read one value where this call has two.
    """
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    for old, new in zip(record.argument_nodes, argument_nodes, strict=True):
        if old is None or new is None:
            continue
        if mapping.setdefault(old, new) is not new:
            return None
    return mapping


def replay(record: LayerRecord, path: str, mapping: dict[torch.fx.Node, torch.fx.Node],
           tracer: Any) -> Any:
    """Create the recorded layer's nodes again for the layer at ``path``; return its output.

    ``mapping`` is ``argument_mapping``'s; ``tracer`` is the running ``MetaTracer``: its
    graph gets the nodes, its decisions the recorded branches (renamed), its
    ``num_calls`` the module calls.
    """
    mapping = dict(mapping)

    def rename(text: str) -> str:
        if text == record.path or text.startswith(record.path + "."):
            return path + text[len(record.path):]
        return text

    decisions = iter(record.decisions)
    pending = next(decisions, None)
    graph: torch.fx.Graph = tracer.graph
    for index, old in enumerate(record.nodes):
        while pending is not None and pending[0] == index:
            tracer.record_decision(_renamed_decision(pending[1], mapping))
            pending = next(decisions, None)
        target = rename(str(old.target)) if old.op in ("call_module", "get_attr") \
            else old.target
        args = torch.fx.node.map_arg(old.args, mapping.__getitem__)
        kwargs = torch.fx.node.map_arg(old.kwargs, mapping.__getitem__)
        new = graph.create_node(old.op, target, args, kwargs, None, old.type)
        scope_path, scope_type = tracer.node_name_to_scope.get(old.name, ("", None))
        tracer.node_name_to_scope[new.name] = (rename(scope_path), scope_type)
        stack = old.meta.get("nn_module_stack")
        if stack is not None:
            new.meta["nn_module_stack"] = type(stack)(  # fx keeps an OrderedDict
                (rename(key), (rename(owner), kind)) for key, (owner, kind) in stack.items())
        new.meta["fake"] = old.meta["fake"]
        mapping[old] = new
    while pending is not None:
        tracer.record_decision(_renamed_decision(pending[1], mapping))
        pending = next(decisions, None)
    for owner, count in record.calls.items():
        renamed = rename(owner)
        tracer.num_calls[renamed] = tracer.num_calls.get(renamed, 0) + count
    return _map_output(record.output, mapping, tracer)


def _renamed_decision(decision: Any, mapping: dict[torch.fx.Node, torch.fx.Node]) -> Any:
    by_name = {old.name: new for old, new in mapping.items()}
    node = by_name.get(decision.node)
    if node is None:
        return decision
    return type(decision)(node.name, str(node.format_node()), decision.answer)


def _map_output(value: Any, mapping: dict[torch.fx.Node, torch.fx.Node], tracer: Any) -> Any:
    if isinstance(value, torch.fx.Proxy):
        return tracer.proxy(mapping.get(value.node, value.node))
    if type(value) in (tuple, list):
        return type(value)(_map_output(v, mapping, tracer) for v in value)
    if type(value) is dict:
        return {k: _map_output(v, mapping, tracer) for k, v in value.items()}
    return value
