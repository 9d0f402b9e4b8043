"""Record what a model really runs, eagerly, as a graph the diff can align and replay.

The diff's verdict must rest on the model's own execution on the diff's inputs
(shared/DESIGN.md, "Soundness"). A symbolic trace is a prediction of that execution: a
forward hook, a private attribute, a global, a closure or a class patch can make the
model run something else than what fx saw, and a replayed or cached graph only widens
the gap. So the diff runs each model once, for real, and writes down every torch call as
it happens:

- a ``TorchFunctionMode`` sees every torch function, tensor method and operator on
  tensors, with its real arguments and results;
- module hooks keep the module stack (every node knows the module it ran in, as fx's
  ``nn_module_stack``), and turn torch's own leaf modules (``nn.Linear``,
  ``nn.LayerNorm``, ...) into single ``call_module`` nodes, as the tracer does, so the
  graph reads like a traced one and weights anchor the same way;
- the user's own hooks run where they always run and are recorded like any other code.

The record becomes a ``torch.fx.GraphModule`` (fx-style node names, tensor metadata on
every node, shapes as constants: the graph holds exactly the path these inputs took).
Replaying it runs the same kernels in the same order, so its outputs are the model's to
the bit; ``recorded_outputs`` keeps the eager outputs so the diff can prove that.

Example::

    >>> recording = record_forward(model, {"input_ids": ids, "attention_mask": mask})
    >>> [n.op for n in recording.gm.graph.nodes][:2]
    ['placeholder', 'placeholder']
"""

from __future__ import annotations

import builtins
import contextlib
import operator
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode, is_tensor_method_or_property

from introspect.diff.ops.outside import COMPUTED_OUTSIDE, computed_outside, merged_outside
from introspect.diff.ops.swapped import Weights, as_called, noted
from introspect.errors import InputError
from introspect.run.capture import remove_hook
from introspect.run.outputs import output_items
from introspect.run.truth import NO_GRAD, mode_context
from introspect.tracing.fx_module import build_graph_module
from introspect.tracing.tracer import COMPOSITE_TORCH_MODULES, EXTRA_LEAF_MODULE_PREFIXES

# Tensor dunders recorded as the operator fx would record (``x + y`` is operator.add).
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
           "pow": operator.pow, "matmul": operator.matmul, "and": operator.and_,
           "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift,
           "rshift": operator.rshift, "div": operator.truediv}
_COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
                "gt": operator.gt, "ge": operator.ge}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs,
          "invert": operator.invert}
_INPLACE = {"iadd": operator.iadd, "isub": operator.isub, "imul": operator.imul,
            "itruediv": operator.itruediv, "idiv": operator.itruediv,
            "ifloordiv": operator.ifloordiv, "imod": operator.imod, "ipow": operator.ipow,
            "imatmul": operator.imatmul, "iand": operator.iand, "ior": operator.ior,
            "ixor": operator.ixor}

# The tracer's leaves (torch.nn's and HF's activations); containers and torch's composite
# layers (COMPOSITE_TORCH_MODULES) are recorded inside, as they are traced.
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


@dataclass
class Recording:
    """A model's forward as it ran: the graph, its records' raw material, its outputs."""

    gm: torch.fx.GraphModule
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    # The eager outputs, by output name: what a replay of ``gm`` must reproduce.
    recorded_outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # With ``keep_values``: every node's value as the model made it, by node name, and
    # each tensor's in-place version counter then (a later change means it was mutated).
    values: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)


def is_leaf(module: torch.nn.Module) -> bool:
    """A torch.nn (or HF activation) module whose own code runs unchanged: one node.

    A subclass defined elsewhere, a forward set on the instance or patched on the class
    is not a leaf: its code is the user's and is recorded op by op.
    """
    cls = type(module)
    if "forward" in vars(module) or isinstance(module, _CONTAINERS + COMPOSITE_TORCH_MODULES):
        return False
    if cls.__module__.startswith(EXTRA_LEAF_MODULE_PREFIXES):
        forward_home = getattr(cls.forward, "__module__", "") or ""
        return forward_home.startswith(EXTRA_LEAF_MODULE_PREFIXES)
    if not cls.__module__.startswith(("torch.nn.", "torch.ao.nn.")):
        return False
    forward_home = getattr(cls.forward, "__module__", "") or ""
    return forward_home.startswith(("torch.nn.", "torch.ao.nn."))


class _NodesByTensor:
    """The node that made each tensor, by the tensor's identity.

    Holds no tensor alive (a weak reference each: the recording's memory is the model's),
    and a tensor born where a dead one was (the same ``id``) is not taken for it. Lighter
    than torch's ``WeakIdKeyDictionary``, which builds a weak reference for every lookup:
    a one-token step looks up tensors some 25,000 times.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[torch.Tensor], torch.fx.Node]] = {}

    def get(self, tensor: torch.Tensor) -> torch.fx.Node | None:
        found = self._by_id.get(id(tensor))
        if found is None or found[0]() is not tensor:
            return None
        return found[1]

    def __setitem__(self, tensor: torch.Tensor, node: torch.fx.Node) -> None:
        self._by_id[id(tensor)] = (weakref.ref(tensor), node)


# Arguments that neither are nor hold a tensor: returned as they are, before any other test.
_PLAIN_ARGUMENTS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})


class _Recorder(TorchFunctionMode):
    """Writes every torch call on tensors into an fx graph, as it runs."""

    def __init__(self, model: torch.nn.Module, *, metadata: bool = True,
                 keep_values: bool = False) -> None:
        super().__init__()
        self.metadata = metadata
        self.kept: dict[str, Any] | None = {} if keep_values else None  # node -> value
        self.kept_versions: dict[str, int] = {}
        self.graph = torch.fx.Graph()
        self.nodes = _NodesByTensor()  # tensor -> node
        self.constants: dict[str, torch.Tensor] = {}
        self.stack: list[tuple[str, type]] = []  # the modules running, outermost first
        self.suspended = 0  # > 0 while a leaf module's own code runs
        names: dict[int, str] = {}
        for name, parameter in model.named_parameters():
            names.setdefault(id(parameter), name)
        for name, buffer in model.named_buffers():
            names.setdefault(id(buffer), name)
        self.tensor_names = names
        self.attributes: dict[str, torch.fx.Node] = {}
        self.leaf_weights: dict[str, list[Weights | None]] = {}  # (``ops.swapped``)
        self.paths = {module: path for path, module in model.named_modules()}

    # -- nodes ------------------------------------------------------------------------
    def node_for(self, tensor: torch.Tensor) -> torch.fx.Node:
        """The node that made ``tensor``; a parameter, buffer or constant gets get_attr."""
        node = self.nodes.get(tensor)
        if node is not None:
            return node
        name = self.tensor_names.get(id(tensor))
        if name is None:  # a tensor the model holds outside its state (or a global)
            name = f"_tensor_constant{len(self.constants)}"
            self.constants[name] = tensor
        if name not in self.attributes:
            self.attributes[name] = self._create("get_attr", name, (), {}, tensor)
        return self.attributes[name]

    def _create(self, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                value: Any) -> torch.fx.Node:
        node = self.graph.create_node(op, target, args, kwargs)
        if self.stack:
            node.meta["nn_module_stack"] = {path: (path, cls) for path, cls in self.stack}
        if self.metadata:
            _write_metadata(node, value)
        if self.kept is not None:
            self.kept[node.name] = value
            if isinstance(value, torch.Tensor):
                self.kept_versions[node.name] = value._version
        return node

    def as_arguments(self, value: Any) -> Any:
        """``value`` with every tensor in it replaced by its node."""
        if type(value) in _PLAIN_ARGUMENTS:
            return value
        if isinstance(value, torch.Tensor):
            return self.node_for(value)
        if isinstance(value, (tuple, list)):
            if isinstance(value, torch.Size):  # sizes hold no tensor
                return value
            mapped = [self.as_arguments(v) for v in value]
            return type(value)(mapped) if type(value) in (tuple, list) else tuple(mapped)
        if isinstance(value, dict):
            return {k: self.as_arguments(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(self.as_arguments(value.start), self.as_arguments(value.stop),
                         self.as_arguments(value.step))
        return value

    def record(self, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               result: Any) -> None:
        """Add one call and point every tensor in its result at the new node(s)."""
        node = self._create(op, target, self.as_arguments(args), self.as_arguments(kwargs),
                            result)
        self._claim(result, node)

    def _claim(self, result: Any, node: torch.fx.Node) -> None:
        if isinstance(result, torch.Tensor):
            self.nodes[result] = node
            return
        if isinstance(result, (tuple, list)):
            for i, item in enumerate(result):
                if _holds_tensor(item):
                    part = self._create("call_function", operator.getitem, (node, i), {}, item)
                    self._claim(item, part)

    # -- the mode -----------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self.suspended:
            return result
        mutates = _mutates(func)
        if not mutates and not _holds_tensor(result):
            return result  # sizes, dtypes, Python numbers: constants of this run
        op, target, args = _describe(func, args)
        self.record(op, target, args, kwargs, result)
        return result

    # -- modules --------------------------------------------------------------------------
    def enter(self, module: torch.nn.Module) -> None:
        path = self.paths.get(module)
        if path:  # the root and modules made inline have no place of their own
            self.stack.append((path, type(module)))

    def leave(self, module: torch.nn.Module) -> None:
        path = self.paths.get(module)
        if path and self.stack and self.stack[-1][0] == path:
            self.stack.pop()

    def leaf_starts(self, module: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> None:
        if not self.suspended:  # a leaf inside a leaf is part of the outer one's node
            self._leaf_inputs = (self.as_arguments(args), self.as_arguments(kwargs))
        self.suspended += 1

    def leaf_ends(self, module: torch.nn.Module, result: Any,
                  kwargs_now: dict[str, Any] | None = None) -> None:
        """``kwargs_now``: the call's keyword arguments, where a global hook, which has
        none before the call, reads them after it (they are not a leaf's to change)."""
        self.suspended -= 1
        if self.suspended:
            return
        args, kwargs = self._leaf_inputs
        if kwargs_now:
            kwargs = self.as_arguments(kwargs_now)
        node = self._create("call_module", self.paths[module], args, kwargs, result)
        self._claim(result, node)
        # (the weights it ran on: ``functional_call`` swaps others in for the call)
        self.leaf_weights.setdefault(self.paths[module], []).append(noted(module))

    def function_returned(self, function: type[torch.autograd.Function],
                          args: tuple[Any, ...],
                          kwargs: dict[str, Any], result: Any) -> None:
        """A custom ``autograd.Function`` was applied. Where an output it returns comes
        from no recorded op on the model's inputs while one of its inputs does (its forward
        left torch: NumPy, a C++ extension), the call is one node of its own, an opaque op,
        so the values flow through it to what follows, and a replay runs it again."""
        outputs = [result] if isinstance(result, torch.Tensor) else \
            [t for t in result if isinstance(t, torch.Tensor)] \
            if isinstance(result, (tuple, list)) else []
        given = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        # (outputs first: a checkpoint's region, the common Function, returns from there)
        if not outputs or all(self._from_inputs(self.nodes.get(t)) for t in outputs) \
                or not any(self._from_inputs(self.nodes.get(t)) for t in given):
            return
        node = self._create("call_function", _applied(function), self.as_arguments(args),
                            self.as_arguments(kwargs), result)
        self._claim(result, node)

    @staticmethod
    def _from_inputs(node: torch.fx.Node | None) -> bool:
        """Whether ``node`` is computed from a placeholder (the model's inputs)."""
        seen, frontier = set(), [node] if node is not None else []
        while frontier:
            current = frontier.pop()
            if current.op == "placeholder":
                return True
            for n in current.all_input_nodes:
                if n not in seen:
                    seen.add(n)
                    frontier.append(n)
        return False


def _applied(function: type[torch.autograd.Function]) -> Any:
    """``function.apply`` as a graph's target, named after the Function."""
    def apply(*args: Any, **kwargs: Any) -> Any:
        return function.apply(*args, **kwargs)

    apply.__name__ = apply.__qualname__ = function.__name__
    return apply


@contextlib.contextmanager
def _function_calls(recorder: _Recorder) -> Iterator[None]:
    """Every custom ``autograd.Function`` applied in this thread told to ``recorder``
    (``function_returned``); ``Function.apply`` is put back after."""
    original = torch.autograd.Function.__dict__["apply"]
    thread = threading.get_ident()

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        result = original.__func__(cls, *args, **kwargs)
        if threading.get_ident() == thread and not recorder.suspended:
            recorder.function_returned(cls, args, kwargs, result)
        return result

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign]


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v) for v in value)
    return False


def _mutates(func: Any) -> bool:
    """An in-place call: it must stay in the graph even when nobody reads its result."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return False
    return name == "__setitem__" or (name.endswith("_") and not name.startswith("__")) \
        or (name.startswith("__i") and name.strip("_") in _INPLACE)


# id(func) -> (func, is_tensor_method_or_property(func)); by identity, with the function
# held: distinct builtins can compare equal (the same C function bound to the same object)
_TENSOR_METHODS: dict[int, tuple[Any, bool]] = {}


def _is_tensor_method(func: Any) -> bool:
    """torch's ``is_tensor_method_or_property``, remembered per function (torch's own
    silences warnings at every call: a tenth of a one-token step's recording)."""
    known = _TENSOR_METHODS.get(id(func))
    if known is not None and known[0] is func:
        return known[1]
    found = is_tensor_method_or_property(func)
    if len(_TENSOR_METHODS) >= 4096:  # torch's functions are far fewer: made on the fly
        _TENSOR_METHODS.clear()
    _TENSOR_METHODS[id(func)] = (func, found)
    return found


def _describe(func: Any, args: tuple[Any, ...]) -> tuple[str, Any, tuple[Any, ...]]:
    """The fx opcode, target and arguments a call is recorded as (fx's own choices)."""
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a tensor property: x.T, x.data
        owner = getattr(func, "__self__", None)
        return "call_function", builtins.getattr, (args[0], getattr(owner, "__name__", "?"))
    if _is_tensor_method(func):
        if name.startswith("__") and name.endswith("__"):
            bare = name[2:-2]
            if bare == "getitem":
                return "call_function", operator.getitem, args
            if bare == "setitem":
                return "call_function", operator.setitem, args
            if bare in _BINARY:
                return "call_function", _BINARY[bare], args
            if bare.startswith("r") and bare[1:] in _BINARY:  # 1 - x calls x.__rsub__(1)
                return "call_function", _BINARY[bare[1:]], (args[1], args[0])
            if bare in _COMPARISONS:
                return "call_function", _COMPARISONS[bare], args
            if bare in _UNARY:
                return "call_function", _UNARY[bare], args
            if bare in _INPLACE:
                return "call_function", _INPLACE[bare], args
        return "call_method", name, args
    return "call_function", func, args


def _write_metadata(node: torch.fx.Node, value: Any) -> None:
    """ShapeProp's ``tensor_meta`` from the real value (the records read only this)."""
    meta = _tensor_meta(value)
    if meta is not None:
        node.meta["tensor_meta"] = meta


def _tensor_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _extract_tensor_metadata(value)
    if isinstance(value, (tuple, list)) and _holds_tensor(value):
        return type(value)(_tensor_meta(v) for v in value) if type(value) in (tuple, list) \
            else tuple(_tensor_meta(v) for v in value)
    return None


@contextlib.contextmanager
def _module_hooks(recorder: _Recorder, model: torch.nn.Module) -> Iterator[None]:
    """Hooks that keep the module stack and make torch's leaves single nodes.

    A module with no hooks of its own is followed by *global* hooks, which leave its
    ``_forward_hooks`` empty: a forward that asks whether it is hooked takes the path its
    plain call takes (the module evidence's capture hooks the same way). A module with
    hooks of the user's gets ours beside them, ours innermost: the user's pre-hooks run
    before a module is entered (so what they do is recorded, inside the module), the
    user's forward hooks after the leaf's node is written (so they are recorded acting on
    its output). The hooks are added last and removed whatever happens.
    """
    handles = []
    hooked = {module for module in model.modules()
              if module._forward_pre_hooks or module._forward_hooks}
    leaves = {module for module in model.modules() if is_leaf(module) and module is not model}
    followed = {module for module in model.modules() if module not in hooked}

    def enter(module: torch.nn.Module, args: Any) -> None:
        recorder.enter(module)

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        recorder.leave(module)

    def leaf_starts(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        recorder.leaf_starts(module, args, kwargs)

    def leaf_ends(module: torch.nn.Module, args: Any, output: Any) -> None:
        recorder.leaf_ends(module, output)

    def starts(module: torch.nn.Module, args: Any) -> None:
        if module in followed:
            recorder.enter(module)
            if module in leaves:
                recorder.leaf_starts(module, args, {})

    def ends(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if module in followed:
            if module in leaves:
                recorder.leaf_ends(module, output, kwargs)
            recorder.leave(module)

    try:
        for module in hooked:
            handles.append(module.register_forward_pre_hook(enter, prepend=True))
            if module in leaves:
                handles.append(module.register_forward_pre_hook(leaf_starts, with_kwargs=True))
                handles.append(module.register_forward_hook(leaf_ends, prepend=True))
            handles.append(module.register_forward_hook(leave))
        if followed:
            handles.append(register_module_forward_pre_hook(starts))
            handles.append(register_module_forward_hook(ends, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            remove_hook(handle)


def outputs_as_dict(outputs: Any) -> dict[str, Any]:
    """HF returns a ModelOutput, ports a tuple, a dataclass or a tensor: outputs by name
    (``introspect.run.outputs.output_items``), tensors only."""
    return {name: value for name, value in output_items(outputs) if _holds_tensor(value)}


def record_forward(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                   title: str = "", keywords: Mapping[str, Any] | None = None, *,
                   metadata: bool = True, keep_values: bool = False,
                   mode: str = NO_GRAD) -> Recording:
    """Run ``model(**inputs)`` once, for real, and record every torch call it makes.

    Args:
        model: any ``nn.Module`` (hooks, private state and Python branches included:
            whatever this call runs is what is recorded).
        inputs: the input tensors by keyword.
        title: the GraphModule's class name.
        keywords: other keyword arguments, passed as they are (``use_cache=False``, a
            cache object); not placeholders: a tensor they hold is a constant of the graph.
        metadata: write ``tensor_meta`` on every node as it is made (the records need
            it); False leaves it to ``write_metadata``, for a recording that may be
            compared from its kept values alone (``generation``'s one-token steps).
        keep_values: keep every node's value and version counter (``Recording.values``).
        mode: the grad mode it runs in (``introspect.run.truth``'s AUTOGRAD, NO_GRAD or
            INFERENCE_MODE): a forward may branch on it, and a recording sees the branch
            its own mode takes.

    Returns:
        A ``Recording``: a GraphModule that replays this very call, with tensor
        metadata and the module stack on every node, and the eager outputs.

    Raises:
        InputError: the model failed on the inputs (the cause is kept).
    """
    recorder = _Recorder(model, metadata=metadata, keep_values=keep_values)
    outputs = run_recorded(recorder, model, inputs, keywords, mode)
    return finish_recording(recorder, model, tuple(inputs), outputs, title)


def run_recorded(recorder: _Recorder, model: torch.nn.Module,
                 inputs: Mapping[str, torch.Tensor],
                 keywords: Mapping[str, Any] | None = None, mode: str = NO_GRAD) -> Any:
    """Run ``model(**inputs, **keywords)`` once under ``recorder`` (placeholders first,
    then every call; ``record_forward``'s run, shared with ``generation.call_log``).

    Raises:
        InputError: the model failed on the inputs (the cause is kept).
    """
    for name, tensor in inputs.items():
        recorder.nodes[tensor] = recorder._create("placeholder", name, (), {}, tensor)
    try:
        with mode_context(mode), _module_hooks(recorder, model), \
                _function_calls(recorder), recorder:
            return model(**inputs, **(keywords or {}))
    except Exception as e:
        cause = " ".join(str(e).split())  # torch's messages span lines: one line here
        # ("while recorded": a model that ran plainly may fail only under the recording,
        # a compiled submodule whose tracer the recording's function mode trips)
        raise InputError(f"{type(model).__name__} could not run on the inputs while "
                         f"recorded: {type(e).__name__}: {cause}") from e


def finish_recording(recorder: _Recorder, model: torch.nn.Module, input_names: tuple[str, ...],
                     outputs: Any, title: str = "") -> Recording:
    """The recorded calls as a GraphModule (dead code dropped), once the model has run."""
    named = outputs_as_dict(outputs)
    returned = {name: recorder.as_arguments(value) for name, value in named.items()}
    recorder.graph.output(returned)
    # (before ``graph_module``, whose copy of each constant on the model would hold it)
    outside = computed_outside(recorder.constants, [recorder.kept])
    outside = merged_outside(recorder.graph, recorder.constants, outside)
    # a value handed from outside was computed from ops the graph holds with no use left
    # (a layer's output that a worker thread took): kept, they are compared as any op;
    # not ops on ``vmap``'s own tensors, which cannot run again outside it
    with as_called(model, recorder.leaf_weights):
        gm = graph_module(recorder.graph, model, recorder.constants, title,
                          keep_unused=bool(outside) and not any(
                              is_functorch_wrapped_tensor(t)
                              for t in recorder.constants.values()))
    gm.meta[COMPUTED_OUTSIDE] = frozenset(outside)
    return Recording(gm, input_names, tuple(returned), recorded_outputs=named,
                     values=recorder.kept or {}, versions=recorder.kept_versions)


def graph_module(graph: torch.fx.Graph, model: torch.nn.Module,
                 constants: Mapping[str, torch.Tensor], title: str = "",
                 keep_unused: bool = False) -> torch.fx.GraphModule:
    """A recorded graph (its output node written) as a GraphModule on ``model``, dead
    code dropped (but with ``keep_unused``); ``constants``: the tensors its
    ``_tensor_constant`` nodes read."""
    graph.owning_module = model  # type: ignore[assignment]  # DCE checks every target
    for name, tensor in constants.items():  # GraphModule copies them from the root
        setattr(model, name, tensor)
    try:
        if not keep_unused:
            graph.eliminate_dead_code(is_impure_node=_is_impure)
        return build_graph_module(model, graph, title or type(model).__name__)
    finally:
        for name in constants:
            delattr(model, name)


def write_metadata(recording: Recording) -> None:
    """``tensor_meta`` on every node of a recording made with ``metadata=False``, from its
    kept values (what the records need, once a diff is made of it after all)."""
    for node in recording.gm.graph.nodes:
        if "tensor_meta" not in node.meta and node.name in recording.values:
            _write_metadata(node, recording.values[node.name])


def _is_impure(node: torch.fx.Node) -> bool:
    return node.op in ("placeholder", "output") or mutates_in_place(node)


_IN_PLACE_OPERATORS = {"setitem", *_INPLACE}


def mutates_in_place(node: torch.fx.Node) -> bool:
    """An in-place op: ``x.masked_fill_(...)``, ``x -= y``, ``x[i] = v``."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if node.op == "call_method":
        return name.endswith("_") and not name.startswith("__")
    return node.op == "call_function" and name in _IN_PLACE_OPERATORS


def outputs_not_replayed(recording: Recording, replayed: Mapping[str, Any]) -> list[str]:
    """The outputs whose replayed value is not bit-identical to the eager one."""
    differing = []
    for name, eager in recording.recorded_outputs.items():
        again = replayed.get(name)
        if not _identical(eager, again):
            differing.append(name)
    return differing


def _identical(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype \
            and torch.equal(a.nan_to_num(), b.nan_to_num()) \
            and torch.equal(a.isnan(), b.isnan())
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(
            _identical(x, y) for x, y in zip(a, b, strict=True))
    return True


__all__ = ["Recording", "is_leaf", "mutates_in_place", "outputs_as_dict",
           "outputs_not_replayed", "record_forward", "write_metadata"]
