"""A one-token step recorded as a flat log of calls; its fx graph built only when needed.

A step that passes the quick comparison (``quick``) reads each node's value and the
structure of the step, nothing else: writing a ``torch.fx`` node for each of its calls
(some 600 for GPT-2) is most of what recording costs. So the step is recorded by the
eager recorder itself (``eager._Recorder``: the same module hooks, the same calls kept or
skipped, in the same order), with one difference: each node it would create is appended
to flat lists instead (op, target, arguments with earlier calls as ``_Ref`` indices, the
module stack, the value and its version counter).

- ``CallLog.signature()`` is the structure proof, read from the log: each call's op,
  target, inputs (as indices) and the dtype and rank of its value.
- ``CallLog.recording()`` builds, once, the ``Recording`` that ``eager.record_forward``
  would have built from the same run: ``torch.fx`` names each node from its target and
  the names before it, so replaying the log into a graph in order gives the same names,
  arguments, module stacks and kept values (tested, step by step, against
  ``record_forward``). A step aligned anew or sent to the full diff builds it; a step
  that passes never does.

Node names are a function of the sequence of targets: two logs with the same signature
have the same node names, call by call, so an alignment made on one step's built graph
applies, by index, to a later step's log.

Example::

    >>> log = log_forward(model, {"input_ids": token}, {"past_key_values": cache})
    >>> log.signature() == earlier.signature()  # the same structure, call by call
    >>> log.recording().gm  # the GraphModule, built now
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from introspect.diff.ops.eager import (
    Recording,
    _Recorder,
    graph_module,
    outputs_as_dict,
    run_recorded,
)


class _Ref:
    """An earlier call's result as an argument of a later call: the call's index."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"_Ref({self.index})"


class _LoggingRecorder(_Recorder):
    """The eager recorder, writing each node it would create into flat lists."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, metadata=False, keep_values=False)
        self.ops: list[str] = []
        self.targets: list[Any] = []
        self.arguments: list[tuple[Any, dict[str, Any]]] = []
        self.stacks: list[tuple[tuple[str, type], ...]] = []
        self.values: list[Any] = []
        self.versions: list[int | None] = []
        self.stack_now: tuple[tuple[str, type], ...] = ()  # ``stack``, as a tuple

    def _create(self, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                value: Any) -> Any:
        ref = _Ref(len(self.ops))
        self.ops.append(op)
        self.targets.append(target)
        self.arguments.append((args, kwargs))
        self.stacks.append(self.stack_now)
        self.values.append(value)
        self.versions.append(value._version if isinstance(value, torch.Tensor) else None)
        return ref

    def enter(self, module: torch.nn.Module) -> None:
        super().enter(module)
        self.stack_now = tuple(self.stack)

    def leave(self, module: torch.nn.Module) -> None:
        super().leave(module)
        self.stack_now = tuple(self.stack)


class CallLog:
    """One model's step as it ran: every call it recorded, in order, with its value."""

    def __init__(self, recorder: _LoggingRecorder, model: torch.nn.Module,
                 input_names: tuple[str, ...], outputs: Any) -> None:
        self.model = model
        self.input_names = input_names
        self.outputs = outputs_as_dict(outputs)  # the eager outputs, by name
        # the outputs as arguments (an output that is a parameter logs its get_attr here,
        # as ``finish_recording`` creates it)
        self.returned = {name: recorder.as_arguments(value)
                         for name, value in self.outputs.items()}
        self.ops = recorder.ops
        self.targets = recorder.targets
        self.arguments = recorder.arguments
        self.stacks = recorder.stacks
        self.values = recorder.values
        self.versions = recorder.versions
        self.constants = recorder.constants
        self.names: list[str] = []  # each call's node name, once the graph is built
        self._signature: tuple[Any, ...] | None = None
        self._recording: Recording | None = None

    def __len__(self) -> int:
        return len(self.ops)

    def changed(self, index: int) -> bool:
        """The call's value was changed in place after the call made it."""
        return self.versions[index] != self.values[index]._version

    def signature(self) -> tuple[Any, ...]:
        """The step's structure: each call's op, target, inputs (the calls whose results
        it reads, in order of first use) and its value's dtype and rank, or type; what an
        alignment depends on, but the sizes that grow with the cache."""
        if self._signature is None:
            signature = []
            for op, target, (args, kwargs), value in zip(self.ops, self.targets,
                                                         self.arguments, self.values,
                                                         strict=True):
                inputs: dict[int, None] = {}
                _refs_in(args, inputs)
                _refs_in(kwargs, inputs)
                kind = (value.dtype, value.ndim) if isinstance(value, torch.Tensor) \
                    else type(value)
                signature.append((op, target, tuple(inputs), kind))
            self._signature = tuple(signature)
        return self._signature

    def recording(self, title: str = "") -> Recording:
        """The ``Recording`` ``record_forward`` makes of the same run (built once): nodes
        named by ``torch.fx`` in the same order, dead code dropped, every value kept."""
        if self._recording is None:
            graph = torch.fx.Graph()
            nodes: list[torch.fx.Node] = []
            kept: dict[str, Any] = {}
            versions: dict[str, int] = {}
            for op, target, (args, kwargs), stack, value, version in zip(
                    self.ops, self.targets, self.arguments, self.stacks, self.values,
                    self.versions, strict=True):
                node = graph.create_node(op, target, _resolve(args, nodes),
                                         _resolve(kwargs, nodes))
                if stack:
                    node.meta["nn_module_stack"] = {path: (path, cls) for path, cls in stack}
                nodes.append(node)
                kept[node.name] = value
                if version is not None:
                    versions[node.name] = version
            graph.output(_resolve(self.returned, nodes))
            self.names = [node.name for node in nodes]
            gm = graph_module(graph, self.model, self.constants, title)
            self._recording = Recording(gm, self.input_names, tuple(self.returned),
                                        recorded_outputs=self.outputs, values=kept,
                                        versions=versions)
        return self._recording


def log_forward(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                keywords: Mapping[str, Any] | None = None) -> CallLog:
    """Run ``model(**inputs, **keywords)`` once, for real, as ``record_forward`` runs it,
    and log every call it makes (no fx node yet: ``CallLog.recording()`` builds them).

    Raises:
        InputError: the model failed on the inputs (the cause is kept).
    """
    recorder = _LoggingRecorder(model)
    outputs = run_recorded(recorder, model, inputs, keywords)
    return CallLog(recorder, model, tuple(inputs), outputs)


def _refs_in(value: Any, found: dict[int, None]) -> None:
    """The indices of the ``_Ref`` in a logged argument, in order of first use."""
    kind = type(value)
    if kind is _Ref:
        found[value.index] = None
    elif kind is tuple or kind is list:
        for item in value:
            _refs_in(item, found)
    elif kind is dict:
        for item in value.values():
            _refs_in(item, found)
    elif kind is slice:
        _refs_in(value.start, found)
        _refs_in(value.stop, found)
        _refs_in(value.step, found)


def _resolve(value: Any, nodes: list[torch.fx.Node]) -> Any:
    """A logged argument with each ``_Ref`` replaced by its node (the containers as
    ``_Recorder.as_arguments`` left them: exact tuples, lists, dicts, slices)."""
    kind = type(value)
    if kind is _Ref:
        return nodes[value.index]
    if kind is tuple:
        return tuple(_resolve(item, nodes) for item in value)
    if kind is list:
        return [_resolve(item, nodes) for item in value]
    if kind is dict:
        return {key: _resolve(item, nodes) for key, item in value.items()}
    if kind is slice:
        return slice(_resolve(value.start, nodes), _resolve(value.stop, nodes),
                     _resolve(value.step, nodes))
    return value


__all__ = ["CallLog", "log_forward"]
