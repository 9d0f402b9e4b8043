"""Trace a model into a module-level ``torch.fx`` graph.

transformers 5.x no longer ships an fx tracer and plain ``torch.fx.symbolic_trace``
fails on ``BertModel``: HF's code asks tensors for their shape, length and truthiness
while it builds masks, and its ``forward`` takes ``**kwargs``. ``MetaTracer`` answers
those questions by running every new node on FakeTensors while it traces (shapes only,
no arithmetic), so the graph stays symbolic in batch size and sequence length.

What it does, in the order of shared/DESIGN.md ("Tracing HF BERT with torch.fx"):

1. placeholders only for the chosen input names; the root's ``forward`` is called with
   keyword arguments, so decorators taking ``**kwargs`` see what they expect;
2. buffers (``position_ids``) become ``get_attr`` nodes, so the graph is not specialised
   to one sequence length and the position branch is drawn;
3. every node carries a FakeTensor value while tracing, answering ``.shape``, ``len()``,
   iteration and ``bool()``; ``.dtype`` and ``.device`` are answered as constants;
4. ``nn.Linear``/``LayerNorm``/``Embedding``/``Dropout``/``Tanh`` and HF's activation
   modules stay ``call_module`` leaves; attention math and masks are functions;
5. dead code is removed and the GraphModule can be pickled and loaded again.

Every Python branch taken on a traced value (``if x.shape[1] > 512``) is recorded in
``TraceResult.decisions``: those are the places where the graph was specialised to the
example inputs, and tools downstream say so instead of drawing a different graph in
silence.

Example::

    >>> result = trace_module(model, {"input_ids": ids, "attention_mask": mask})
    >>> result.gm(input_ids=ids, attention_mask=mask)["last_hidden_state"].shape
    torch.Size([2, 9, 384])
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.node import map_aggregate

from introspect.errors import TraceError

# Attributes of a tensor that are fixed at trace time (DESIGN.md, point 6): answering them
# as constants lets HF call torch.finfo(x.dtype) and build tensors on x.device.
_CONSTANT_TENSOR_ATTRIBUTES = frozenset(
    {"dtype", "device", "ndim", "is_cuda", "layout", "is_floating_point", "requires_grad"}
)

# Module types kept as single call_module nodes (besides torch.nn's own leaves).
_EXTRA_LEAF_MODULE_PREFIXES = ("transformers.activations",)


@dataclass(frozen=True)
class Decision:
    """A Python branch taken on a traced value: the graph holds only the branch taken."""

    node: str  # the node whose truth was asked (often removed later as dead code)
    expression: str  # the node as fx prints it: "%gt : ... = call_function[...](...)"
    answer: bool  # what the example inputs answered


@dataclass
class TraceResult:
    """The traced GraphModule, its input names, and where the graph was specialised."""

    gm: torch.fx.GraphModule
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    decisions: list[Decision] = field(default_factory=list)


class _MetaProxy(torch.fx.Proxy):
    """A Proxy that answers shape questions from the FakeTensor stored on its node."""

    def __getattr__(self, name: str) -> Any:
        if name in _CONSTANT_TENSOR_ATTRIBUTES:
            value = _meta_of(self.node)
            if isinstance(value, torch.Tensor):
                return getattr(value, name)
        return super().__getattr__(name)

    def __len__(self) -> int:
        # Ranks and tuple lengths are fixed for a graph; no decision worth recording.
        return len(_meta_of(self.node))


def _meta_of(node: torch.fx.Node) -> Any:
    if "fake" not in node.meta:
        raise TraceError(f"no trace-time value for node {node.format_node()}")
    return node.meta["fake"]


class MetaTracer(torch.fx.Tracer):
    """A ``torch.fx.Tracer`` that carries FakeTensor values on every node while tracing.

    Args:
        example_inputs: the inputs, by name, that fix the graph's placeholders and the
            dtypes and ranks seen while tracing. Only their shapes and dtypes are used.
    """

    proxy_buffer_attributes = True

    def __init__(self, example_inputs: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.example_inputs = dict(example_inputs or {})
        self.decisions: list[Decision] = []
        self._fake_mode: FakeTensorMode | None = None
        self._computing_meta = False

    # -- leaves -------------------------------------------------------------------
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if type(m).__module__.startswith(_EXTRA_LEAF_MODULE_PREFIXES):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    # -- root arguments -------------------------------------------------------------
    def create_args_for_root(
        self, root_fn: Any, is_module: bool, concrete_args: Any = None
    ) -> tuple[Any, list[Any]]:
        names = list(self.example_inputs)

        def call_forward_with_keywords(root: torch.nn.Module, *proxies: Any) -> Any:
            outputs = root.forward(**dict(zip(names, proxies, strict=True)))
            return _outputs_as_dict(outputs)

        proxies = [self.create_proxy("placeholder", name, (), {}) for name in names]
        return call_forward_with_keywords, [self.root, *proxies]

    # -- attributes -------------------------------------------------------------------
    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._computing_meta:  # a leaf running on FakeTensors wants its real weight
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    # -- proxies carry values -----------------------------------------------------------
    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _MetaProxy(node, self)

    def create_node(self, kind: str, target: Any, args: Any, kwargs: Any, name: str | None = None,
                    type_expr: Any | None = None) -> torch.fx.Node:
        # Every node, tensor constants included, gets its trace-time value here.
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        try:
            node.meta["fake"] = self._compute_meta(kind, target, node.args, node.kwargs, node.name)
        except TraceError:
            raise
        except Exception as e:
            raise TraceError(
                f"could not run node {node.format_node()} on FakeTensors while tracing: {e}"
            ) from e
        return node

    def _compute_meta(self, kind: str, target: Any, args: Any, kwargs: Any, name: str) -> Any:
        assert self._fake_mode is not None
        if kind == "placeholder":
            return self._fake_mode.from_tensor(self.example_inputs[name])
        if kind == "output":
            return None
        if kind == "get_attr":
            self._computing_meta = True
            try:
                value = _fetch_attr(self.root, target)
            finally:
                self._computing_meta = False
            return self._fake_mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
        args = map_aggregate(args, _node_to_meta)
        kwargs = map_aggregate(kwargs, _node_to_meta)
        self._computing_meta = True
        try:
            with self._fake_mode:
                if kind == "call_module":
                    return self.root.get_submodule(target).forward(*args, **kwargs)
                if kind == "call_method":
                    return getattr(args[0], target)(*args[1:], **kwargs)
                return target(*args, **kwargs)
        finally:
            self._computing_meta = False

    # -- Python control flow on traced values ---------------------------------------------
    def to_bool(self, obj: torch.fx.Proxy) -> bool:
        value = _meta_of(obj.node)
        try:
            answer = bool(value)
        except Exception as e:
            raise TraceError(
                f"the model branches on the values of node {obj.node.name} "
                f"({obj.node.format_node()}); a graph cannot hold that branch"
            ) from e
        self.decisions.append(Decision(obj.node.name, str(obj.node.format_node()), answer))
        return answer

    def iter(self, obj: torch.fx.Proxy) -> Iterator[Any]:
        value = _meta_of(obj.node)
        return iter([obj[i] for i in range(len(value))])  # type: ignore[index]

    def keys(self, obj: torch.fx.Proxy) -> Any:
        return _meta_of(obj.node).keys()

    # -- entry point ------------------------------------------------------------------------
    def trace(self, root: Any, concrete_args: Any = None) -> torch.fx.Graph:
        # A fresh mode per trace: FakeTensors of one trace must not leak into the next.
        self._fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        try:
            return super().trace(root, concrete_args)
        finally:
            self._fake_mode = None


class ReloadableTracer(torch.fx.Tracer):
    """A tracer with no required arguments, so a pickled GraphModule loads again.

    Loading re-traces the generated code; buffers must stay proxies there too, or
    ``position_ids[:, :seq_len]`` would index a real tensor with a traced length.
    """

    proxy_buffer_attributes = True


def _node_to_meta(value: Any) -> Any:
    return _meta_of(value) if isinstance(value, torch.fx.Node) else value


def _fetch_attr(root: torch.nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _outputs_as_dict(outputs: Any) -> Any:
    """HF returns a ModelOutput; the graph returns a plain dict of its non-None fields."""
    if isinstance(outputs, Mapping):
        return {key: value for key, value in outputs.items() if value is not None}
    if isinstance(outputs, tuple) and not isinstance(outputs, torch.fx.Proxy):
        return {f"output_{i}": value for i, value in enumerate(outputs) if value is not None}
    return {"output": outputs}


def trace_module(model: torch.nn.Module, example_inputs: Mapping[str, torch.Tensor]) -> TraceResult:
    """Trace ``model`` into a GraphModule whose placeholders are ``example_inputs``' names.

    Args:
        model: any ``nn.Module`` whose ``forward`` takes the inputs as keyword arguments
            (HF ``BertFor*``, the from-scratch BERT, a user's own port).
        example_inputs: input tensors by name; only their shapes and dtypes are used.

    Returns:
        A ``TraceResult``: the GraphModule (it returns a dict of the model's outputs),
        the input and output names, and the branches specialised on example values.

    Raises:
        TraceError: the model does something a graph cannot hold; the message names the
            node and keeps the cause.
    """
    if not example_inputs:
        raise TraceError("tracing needs at least one example input, got none")
    unknown = [n for n in example_inputs if n not in inspect.signature(model.forward).parameters
               and not _takes_var_keywords(model.forward)]
    if unknown:
        raise TraceError(
            f"{type(model).__name__}.forward takes no argument named {', '.join(unknown)}"
        )
    tracer = MetaTracer(example_inputs)
    attributes_before = set(vars(model))
    try:
        graph = tracer.trace(model)
    except TraceError:
        raise
    except Exception as e:
        raise TraceError(f"torch.fx could not trace {type(model).__name__}: {e}") from e
    finally:
        added = set(vars(model)) - attributes_before
    # fx parks tensor constants (_tensor_constant0, ...) on the traced module; the
    # GraphModule keeps its own copy, so take them off the user's model again.
    for node in graph.nodes:
        _keep_shapes(node, node.meta.pop("fake", None))  # FakeTensors only live while tracing
        if isinstance(node.type, str):  # a postponed annotation ("Any") cannot be pickled
            node.type = None
    graph._tracer_cls = ReloadableTracer
    gm = torch.fx.GraphModule(tracer.root, graph, class_name=type(model).__name__)
    for name in added:
        delattr(model, name)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    output_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = output_node.args[0]
    output_names = tuple(returned) if isinstance(returned, dict) else ("output",)
    return TraceResult(gm, tuple(example_inputs), output_names, list(tracer.decisions))


def _keep_shapes(node: torch.fx.Node, fake: Any) -> None:
    """Keep what ShapeProp would record from a trace-time value: shapes are known unrun.

    Tensors (and tuples of them) as ``tensor_meta``; ints and sizes as ``value``.
    """
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    if isinstance(fake, torch.Tensor):
        node.meta["tensor_meta"] = _extract_tensor_metadata(fake)
    elif isinstance(fake, (tuple, list)) and fake and all(
            isinstance(v, torch.Tensor) for v in fake):
        node.meta["tensor_meta"] = type(fake)(_extract_tensor_metadata(v) for v in fake)
    elif isinstance(fake, int) and not isinstance(fake, bool):
        node.meta["value"] = fake
    elif isinstance(fake, tuple) and fake and all(
            isinstance(v, int) and not isinstance(v, bool) for v in fake):
        node.meta["value"] = fake


def _takes_var_keywords(fn: Any) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD
               for p in inspect.signature(fn).parameters.values())


__all__ = ["Decision", "MetaTracer", "TraceResult", "trace_module"]
