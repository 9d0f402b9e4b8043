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

Two shortcuts keep the trace cheap without changing the graph (``fast=False`` turns them
off; a test compares both node for node):

- leaf modules get their trace-time value from a shape rule (``introspect.tracing.leaf_shapes``)
  instead of running on FakeTensors;
- each repeated layer of a ``ModuleList`` is traced once and its nodes replayed for the
  others (``introspect.tracing.replay``); a layer that cannot be replayed is traced in
  full and ``TraceResult.notes`` says why.

The shapes on every node are then written by ``torch.fx``'s ``ShapeProp``, run on the
values computed while tracing (``introspect.tracing.shapes.propagate_trace_values``): no forward
pass is spent only for shapes. Tracing holds a process-wide lock: ``torch.fx`` patches
``nn.Module.__call__`` and ``__getattr__`` for the whole process while it traces, so two
traces at once would break each other (and every later forward).

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

import contextlib
import functools
import gc
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.node import map_aggregate

from introspect.errors import TraceError
from introspect.run.quiet import checkpoint_warning_quiet, said, worker_errors
from introspect.tracing import cache as trace_cache
from introspect.tracing import replay as layer_replay
from introspect.tracing.fx_module import build_graph_module
from introspect.tracing.leaf_shapes import NO_RULE, leaf_value
from introspect.tracing.records import NodeRecord
from introspect.tracing.traced_sizes import factories_take_traced_sizes

# Attributes of a tensor that are fixed at trace time (DESIGN.md, point 6): answering them
# as constants lets HF call torch.finfo(x.dtype) and build tensors on x.device.
_CONSTANT_TENSOR_ATTRIBUTES = frozenset(
    {"dtype", "device", "ndim", "is_cuda", "layout", "is_floating_point", "requires_grad"}
)

# Module types kept as single call_module nodes (besides torch.nn's own leaves).
EXTRA_LEAF_MODULE_PREFIXES = ("transformers.activations",)
# torch.nn's composite modules, traced into rather than kept whole (fx keeps every torch.nn
# module whole): a port built from nn.TransformerEncoderLayer must show its projections,
# norms and attention as nodes, or nothing of it could be drawn or compared inside.
COMPOSITE_TORCH_MODULES = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoder,
                            torch.nn.TransformerDecoderLayer, torch.nn.TransformerDecoder,
                            torch.nn.Transformer, torch.nn.MultiheadAttention)

# torch.fx patches process-wide state while it traces (see the module docstring); every
# fx trace in this package runs under this lock. Re-entrant, so a trace that triggers
# another fx trace in the same thread (unpickling a GraphModule) does not deadlock.
TRACE_LOCK = threading.RLock()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def holds_trace_lock(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a public entry point under ``TRACE_LOCK``, graph runs and forwards included.

    While one thread traces, fx's patched ``nn.Module.__call__`` reaches every thread's
    forwards, so ``trace``, ``trace_module``, ``diff``, ``attention`` and ``capture`` hold
    the lock for their whole run: from several threads at once they give what they give
    one after another.
    """

    @functools.wraps(function)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with TRACE_LOCK:
            return function(*args, **kwargs)

    return locked


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
    notes: list[str] = field(default_factory=list)  # layers traced in full, and why
    # One NodeRecord per node, from the shapes seen while tracing (kept by the cache too).
    records: list[NodeRecord] = field(default_factory=list)


class _MetaProxy(torch.fx.Proxy):
    """A Proxy that answers shape questions from the FakeTensor stored on its node."""

    def __getattr__(self, name: str) -> Any:
        if name in _CONSTANT_TENSOR_ATTRIBUTES:
            value = _meta_of(self.node)
            if isinstance(value, torch.Tensor):
                return getattr(value, name)
        return _MetaAttribute(self, name)  # fx's Attribute: its node is made when used

    def __len__(self) -> int:
        # Ranks and tuple lengths are fixed for a graph; no decision worth recording.
        return len(_meta_of(self.node))


class _MetaAttribute(torch.fx.proxy.Attribute):
    """``x.shape`` and other attributes: ``len(x.shape)`` and ``*x.shape`` work too."""

    def __len__(self) -> int:
        return len(_meta_of(self.node))

    def __iter__(self) -> Iterator[Any]:
        return iter([self[i] for i in range(len(self))])  # type: ignore[index]


def _meta_of(node: torch.fx.Node) -> Any:
    if "fake" not in node.meta:
        raise TraceError(f"no trace-time value for node {node.format_node()}")
    return node.meta["fake"]


class MetaTracer(torch.fx.Tracer):
    """A ``torch.fx.Tracer`` that carries FakeTensor values on every node while tracing.

    Args:
        example_inputs: the inputs, by name, that fix the graph's placeholders and the
            dtypes and ranks seen while tracing. Only their shapes and dtypes are used.
        fast: use shape rules for leaf modules and replay repeated layers (the same
            graph; False traces every node in full, as a reference).
    """

    proxy_buffer_attributes = True

    def __init__(self, example_inputs: Mapping[str, torch.Tensor] | None = None,
                 fast: bool = True) -> None:
        super().__init__()
        self.example_inputs = dict(example_inputs or {})
        self.fast = fast
        self.decisions: list[Decision] = []
        self.notes: list[str] = []
        self._decided_at: list[int] = []  # graph length at each decision (for replays)
        self._layers: dict[tuple[str, Any], list[layer_replay.LayerRecord]] = {}
        self._fake_mode: FakeTensorMode | None = None
        self._computing_meta = False
        self._names: dict[int, str] | None = None  # tensors of the root, by id

    # -- leaves -------------------------------------------------------------------
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if type(m).__module__.startswith(EXTRA_LEAF_MODULE_PREFIXES):
            return True
        if isinstance(m, COMPOSITE_TORCH_MODULES):
            return False
        return super().is_leaf_module(m, module_qualified_name)

    # -- repeated layers: trace one, replay the others --------------------------------
    def call_module(self, m: torch.nn.Module, forward: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if self.submodule_paths is not None and m not in self.submodule_paths:
            # a module made inline (DistilBERT's ``nn.ReLU()(x)``, RoBERTa's LM head gelu)
            # has no path for a call_module node: trace through its forward instead
            return forward(*args, **kwargs)
        path = self.path_of_module(m)
        if not self.fast or self.is_leaf_module(m, path):
            return super().call_module(m, forward, args, kwargs)
        group = layer_replay.module_list_of(self.root, path)
        signature = layer_replay.layer_signature(m) if group is not None else None
        if group is None or signature is None:
            return super().call_module(m, forward, args, kwargs)
        described = layer_replay.describe_arguments(args, kwargs, _meta_of)
        if isinstance(described, str):
            self._note_full_trace(path, group, signature, m, described)
            return super().call_module(m, forward, args, kwargs)
        records = self._layers.setdefault((group, signature), [])
        reason = ""
        for record in records:
            if record.module is not m and not record.unreplayable \
                    and record.arguments == described[0]:
                mapping = layer_replay.argument_mapping(record, described[1])
                if mapping is not None:
                    return layer_replay.replay(record, path, mapping, self)
                reason = f"it reads one node where {record.path} read two, or the reverse"
        if records:
            self._note_full_trace(path, group, signature, m, reason)
        return self._trace_and_record(m, path, records, described, forward, args, kwargs)

    def _note_full_trace(self, path: str, group: str, signature: Any, m: torch.nn.Module,
                         reason: str) -> None:
        """Say why a layer like one traced before was traced again in full."""
        others = [r for r in self._layers.get((group, signature), []) if r.module is not m]
        if not others:
            return  # the first of its kind, or the same module called again (ALBERT)
        first = others[0]
        if not reason:
            reason = (f"{first.path} cannot be replayed: {first.unreplayable}"
                      if first.unreplayable
                      else f"its arguments differ from those of {first.path}")
        self.notes.append(f"layer {path} was traced in full: {reason}")

    def _trace_and_record(self, m: torch.nn.Module, path: str,
                          records: list[layer_replay.LayerRecord],
                          described: tuple[tuple[Any, ...], list[torch.fx.Node | None]],
                          forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        record = layer_replay.LayerRecord(m, path, described[0], described[1])
        last = next(iter(reversed(self.graph.nodes)), None)
        length, decided = len(self.graph.nodes), len(self.decisions)
        calls = dict(self.num_calls)
        record.output = super().call_module(m, forward, args, kwargs)
        first_new = last.next if last is not None else next(iter(self.graph.nodes), None)
        layer_replay.finish_record(record, first_new, self.graph)
        record.decisions = [(at - length, decision) for at, decision in
                            zip(self._decided_at[decided:], self.decisions[decided:],
                                strict=True)]
        record.calls = {owner: count - calls.get(owner, 0)
                        for owner, count in self.num_calls.items()
                        if count != calls.get(owner, 0)}
        records.append(record)
        return record.output

    # -- root arguments -------------------------------------------------------------
    def create_args_for_root(
        self, root_fn: Any, is_module: bool, concrete_args: Any = None
    ) -> tuple[Any, list[Any]]:
        names = list(self.example_inputs)
        fixed = cache_off(self.root, names)

        def call_forward_with_keywords(root: torch.nn.Module, *proxies: Any) -> Any:
            outputs = root.forward(**dict(zip(names, proxies, strict=True)), **fixed)
            return _outputs_as_dict(outputs)

        proxies = [self.create_proxy("placeholder", name, (), {}) for name in names]
        return call_forward_with_keywords, [self.root, *proxies]

    # -- attributes -------------------------------------------------------------------
    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._computing_meta:  # a leaf running on FakeTensors wants its real weight
            return attr_val
        if not isinstance(attr_val, torch.Tensor):
            return attr_val
        # What fx's Tracer.getattr does, with the tensors' names looked up in a table made
        # once per trace instead of a scan of every parameter at every access.
        name = self._tensor_names().get(id(attr_val))
        if name is None:
            return attr_val
        if name not in parameter_proxy_cache:
            parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
        return parameter_proxy_cache[name]

    def _tensor_names(self) -> dict[int, str]:
        """Parameters, then buffers, by id: the first name fx's own scan would find."""
        if self._names is None:
            self._names = {}
            for name, parameter in self.root.named_parameters():
                self._names.setdefault(id(parameter), name)
            for name, buffer in self.root.named_buffers():
                self._names.setdefault(id(buffer), name)
        return self._names

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
        if kind == "call_module" and self.fast:
            with self._fake_mode:
                value = leaf_value(self.root.get_submodule(target), args, kwargs)
            if value is not NO_RULE:
                return value
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
        self.record_decision(Decision(obj.node.name, str(obj.node.format_node()), answer))
        return answer

    def record_decision(self, decision: Decision) -> None:
        """Keep a branch taken, and where in the graph (a replayed layer's are kept too)."""
        self.decisions.append(decision)
        self._decided_at.append(len(self.graph.nodes))

    def iter(self, obj: torch.fx.Proxy) -> Iterator[Any]:
        value = _meta_of(obj.node)
        return iter([obj[i] for i in range(len(value))])  # type: ignore[index]

    def keys(self, obj: torch.fx.Proxy) -> Any:
        return _meta_of(obj.node).keys()

    # -- entry point ------------------------------------------------------------------------
    def trace(self, root: Any, concrete_args: Any = None) -> torch.fx.Graph:
        # A fresh mode per trace: FakeTensors of one trace must not leak into the next.
        in_threads: list[Any] = []
        with TRACE_LOCK, _patches_restored(), factories_take_traced_sizes(), \
                _fake_tensor_log_quiet(), worker_errors(in_threads), \
                checkpoint_warning_quiet():
            self._fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
            try:
                graph = super().trace(root, concrete_args)
            finally:
                self._fake_mode = None
                self._layers.clear()  # records hold the user's modules; drop them
                self._names = None
        if in_threads:  # the graph lacks what they computed (and they were not printed)
            raise TraceError(f"a worker thread of the model failed while it was traced "
                             f"({said(in_threads[0])})")
        return graph


@contextlib.contextmanager
def _fake_tensor_log_quiet() -> Iterator[None]:
    """torch's FakeTensor log kept quiet while we trace: a forward that runs its work in
    worker threads shares our fake mode with them, torch logs the failure it meets there
    with a full traceback before raising it, and the trace then falls back as for any
    other failure (the user would read a traceback beside a verdict)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


class ReloadableTracer(torch.fx.Tracer):
    """A tracer with no required arguments, so a pickled GraphModule loads again.

    Loading re-traces the generated code; buffers must stay proxies there too, or
    ``position_ids[:, :seq_len]`` would index a real tensor with a traced length.
    """

    proxy_buffer_attributes = True

    def trace(self, root: Any, concrete_args: Any = None) -> torch.fx.Graph:
        with TRACE_LOCK, _patches_restored():
            return super().trace(root, concrete_args)


@contextlib.contextmanager
def _patches_restored() -> Iterator[None]:
    """Put back ``nn.Module.__call__``/``__getattr__`` if a trace left them patched.

    torch.fx's patcher restores them itself when a trace ends or raises; this is the
    guard for the case it does not (a trace interrupted in a way it did not expect).
    """
    module_call, module_getattr = torch.nn.Module.__call__, torch.nn.Module.__getattr__
    try:
        yield
    finally:
        if torch.nn.Module.__call__ is not module_call:
            torch.nn.Module.__call__ = module_call  # type: ignore[method-assign]
        if torch.nn.Module.__getattr__ is not module_getattr:
            torch.nn.Module.__getattr__ = module_getattr  # type: ignore[method-assign]


def _node_to_meta(value: Any) -> Any:
    return _meta_of(value) if isinstance(value, torch.fx.Node) else value


def _fetch_attr(root: torch.nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


CACHE_OFF_NOTE = ("key/value cache, on by default (config.use_cache), was off for this "
                  "forward (use_cache=False): one forward without a cache is in the graph, "
                  "which the cache neither enters nor changes")


def cache_off(model: torch.nn.Module, names: Any = ()) -> dict[str, Any]:
    """``{"use_cache": False}`` for a decoder whose forward takes it and whose cache is on.

    A decoder built with its default config (``GPT2LMHeadModel(GPT2Config())``) makes a
    ``DynamicCache`` at every forward; a graph of one forward has no use for it, and
    torch.fx cannot trace through it.
    """
    if "use_cache" in names:
        return {}
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    if "use_cache" not in parameters:
        return {}
    config = getattr(model, "config", None)
    if getattr(config, "is_decoder", True) is False:  # BERT and its cousins: no cache made
        return {}
    return {"use_cache": False} if getattr(config, "use_cache", True) else {}


def _outputs_as_dict(outputs: Any) -> Any:
    """HF returns a ModelOutput; the graph returns a plain dict of its non-None fields."""
    if isinstance(outputs, Mapping):
        return {key: value for key, value in outputs.items() if value is not None}
    if isinstance(outputs, tuple) and not isinstance(outputs, torch.fx.Proxy):
        return {f"output_{i}": value for i, value in enumerate(outputs) if value is not None}
    return {"output": outputs}


# Under the lock too: fx patches ``nn.Module.__call__`` process-wide while it traces, and
# two traces at once in two threads each saw the other's patch (a node in another order,
# under load): from several threads they now run one after another.
@holds_trace_lock
def trace_module(model: torch.nn.Module, example_inputs: Mapping[str, torch.Tensor],
                 *, fast: bool = True, cache: bool = True) -> TraceResult:
    """Trace ``model`` into a GraphModule whose placeholders are ``example_inputs``' names.

    Every node gets the shapes ``ShapeProp`` writes (``tensor_meta``, and ``value`` for
    ints and sizes), from the values computed while tracing: the model is not run.

    Args:
        model: any ``nn.Module`` whose ``forward`` takes the inputs as keyword arguments
            (HF ``BertFor*``, the from-scratch BERT, a user's own port).
        example_inputs: input tensors by name; only their shapes and dtypes are used.
        fast: shape rules for leaves and one trace per repeated layer (the same graph);
            False traces every node in full.
        cache: look the graph up in the trace cache (``introspect.tracing.cache``: the same
            model class, configuration and input shapes traced before in this process;
            installed, unpatched models only) and bind it to ``model``'s own weights; off with
            ``INTROSPECT_NO_CACHE=1``.

    Returns:
        A ``TraceResult``: the GraphModule (it returns a dict of the model's outputs),
        the input and output names, the branches specialised on example values, and
        notes on layers that had to be traced in full.

    Raises:
        TraceError: the model does something a graph cannot hold; the message names the
            node and keeps the cause.
    """
    # Tracing makes many small objects next to a model's large heap; the cyclic garbage
    # collector would walk that heap again and again (a third of a cache hit's time).
    with _collector_paused():
        return _trace_module(model, example_inputs, fast=fast, cache=cache)


# Traces running at once (threads) share one pause: the collector comes back when the
# last of them ends, never in the middle of another's (each trace sees what one alone
# sees: the same graph, node for node).
# (An object, not a dict: this module's globals are part of the trace cache's key, read
# by value for plain containers; the count changes while a trace runs.)
class _Pauses:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.was_enabled = False


_PAUSES = _Pauses()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    with _PAUSES.lock:
        if _PAUSES.running == 0:
            _PAUSES.was_enabled = gc.isenabled()
            gc.disable()
        _PAUSES.running += 1
    try:
        yield
    finally:
        with _PAUSES.lock:
            _PAUSES.running -= 1
            if _PAUSES.running == 0 and _PAUSES.was_enabled:
                gc.enable()


def _trace_module(model: torch.nn.Module, example_inputs: Mapping[str, torch.Tensor],
                  *, fast: bool, cache: bool) -> TraceResult:
    """``trace_module`` itself (the collector paused)."""
    from introspect.models.families import untraceable_reason
    from introspect.tracing.shapes import node_records, propagate_trace_values

    if not example_inputs:
        raise TraceError("tracing needs at least one example input, got none")
    untraceable = untraceable_reason(model)  # a known family fx cannot trace: say why
    if untraceable is not None:
        raise TraceError(untraceable)
    unknown = [n for n in example_inputs if n not in inspect.signature(model.forward).parameters
               and not _takes_var_keywords(model.forward)]
    if unknown:
        raise TraceError(
            f"{type(model).__name__}.forward takes no argument named {', '.join(unknown)}"
        )
    key = trace_cache.cache_key(model, example_inputs, fast) \
        if cache and trace_cache.enabled() else None
    if key is not None:
        with TRACE_LOCK:
            entry = trace_cache.recall(key)
            if entry is not None and entry.input_names == tuple(example_inputs):
                return TraceResult(trace_cache.bind(entry, model), entry.input_names,
                                   entry.output_names, [Decision(*d) for d in entry.decisions],
                                   list(entry.notes), list(entry.records))
    tracer = MetaTracer(example_inputs, fast=fast)
    attributes_before = set(vars(model))
    # A forward that stores a tensor on a module (``self.scores = scores``, as tutorials
    # do) leaves an fx Proxy there while tracing; the next trace, or a deepcopy, trips on
    # it. Each module's attributes are put back as they were once tracing ends.
    saved = [(module, dict(vars(module)), _container_contents(module))
             for module in model.modules()]
    try:
        graph = tracer.trace(model)
    except TraceError:
        raise
    except Exception as e:
        raise TraceError(f"torch.fx could not trace {type(model).__name__}: {e}") from e
    finally:
        for module, before, contents in saved:
            _restore_proxied_attributes(module, before, contents)
        added = set(vars(model)) - attributes_before
    values = {}
    for node in graph.nodes:
        values[node] = node.meta.pop("fake", None)  # FakeTensors only live while tracing
        if isinstance(node.type, str):  # a postponed annotation ("Any") cannot be pickled
            node.type = None
    graph._tracer_cls = ReloadableTracer
    graph.owning_module = model  # type: ignore[assignment]  # DCE asks modules if pure
    try:
        graph.eliminate_dead_code()
        gm = build_graph_module(tracer.root, graph, type(model).__name__)  # no codegen yet
    except RuntimeError as e:
        # a constant computed from the trace's fake values (a weight made by a registered
        # parametrization, probe round s) has no value to keep: the graph cannot run
        for name in set(vars(model)) - attributes_before:
            delattr(model, name)
        raise TraceError(f"torch.fx could not trace {type(model).__name__}: {e}") from e
    # fx parks tensor constants (_tensor_constant0, ...) on the traced module; the
    # GraphModule keeps its own copy, so take them off the user's model again.
    for name in added:
        delattr(model, name)
    propagate_trace_values(gm, values)
    records = node_records(gm)
    output_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = output_node.args[0]
    output_names = tuple(returned) if isinstance(returned, dict) else ("output",)
    if key is not None:
        with TRACE_LOCK:
            entry = trace_cache.remember(key, gm, tuple(example_inputs), output_names,
                                         tracer.decisions, tracer.notes, records)
            trace_cache.write_entry(key, entry)
    return TraceResult(gm, tuple(example_inputs), output_names, list(tracer.decisions),
                       list(tracer.notes), records)


def _container_contents(module: torch.nn.Module) -> dict[str, list[Any]]:
    """A shallow copy of each list or dict a module holds, to undo an in-place append."""
    return {name: list(value.items()) if isinstance(value, dict) else list(value)
            for name, value in vars(module).items()
            if type(value) in (list, dict) and not name.startswith("_")}


def _restore_proxied_attributes(module: torch.nn.Module, before: dict[str, Any],
                                contents: dict[str, list[Any]]) -> None:
    """Put back each attribute of ``module`` that tracing set to (or filled with) a Proxy."""
    attributes = vars(module)
    for name, value in list(attributes.items()):
        if not _holds_proxy(value):
            continue
        if name not in before:
            del attributes[name]
            continue
        attributes[name] = before[name]
        if value is before[name] and name in contents:  # appended to in place
            if isinstance(value, dict):
                value.clear()
                value.update(contents[name])
            else:
                value[:] = contents[name]


def _holds_proxy(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.fx.Proxy | FakeTensor):  # a FakeTensor outlives no trace
        return True
    if depth < 3 and type(value) in (list, tuple):
        return any(_holds_proxy(v, depth + 1) for v in value)
    if depth < 3 and type(value) is dict:
        return any(_holds_proxy(v, depth + 1) for v in value.values())
    return False


def _takes_var_keywords(fn: Any) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD
               for p in inspect.signature(fn).parameters.values())


__all__ = ["Decision", "MetaTracer", "TraceResult", "trace_module"]
