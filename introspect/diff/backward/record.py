"""Run a model forward and backward once, for real, and keep every node's gradient.

The forward is recorded exactly as ``introspect.diff.ops.eager`` records it (the same node
names, so the diff's alignment applies), with autograd on. Each tensor a node produces
gets a hook at the moment it is made, so the gradient kept is the one of that very
value, even where a later in-place op changes the tensor (torch gives a hook registered
before an in-place op the gradient of the value before it). Nothing is replayed: the
gradients are the model's own, its custom ``autograd.Function``s, detaches, tensor hooks
and in-place ops included.

Example::

    >>> recording = record_backward(model, inputs, loss_fn)
    >>> recording.grads["encoder_layer_0_output_dense"].shape
    torch.Size([2, 9, 128])
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.autograd.graph import get_gradient_edge
from torch.overrides import TorchFunctionMode

from introspect.diff.ops.eager import (
    Recording,
    _function_calls,
    _module_hooks,
    _mutates,
    _Recorder,
    finish_recording,
    outputs_as_dict,
)
from introspect.errors import InputError
from introspect.run.random_state import RandomState

LossFn = Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Shell:
    """A value's shape, dtype and device, without its data."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Shell:
        return cls(tensor.shape, tensor.dtype, tensor.device)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype, device=self.device)


@dataclass
class GradientRecording:
    """One side's forward and backward: values and gradients by node name.

    ``values`` is empty where the backward let them go (``keep_values=False``); ``shells``
    always says each value's shape, dtype and device.
    """

    values: dict[str, torch.Tensor]  # node name -> its value (as made; see ``shells``)
    grads: dict[str, torch.Tensor]  # node name -> d loss / d value (absent: none flowed)
    requires_grad: set[str]  # nodes whose value was part of autograd's graph
    parameter_grads: dict[str, torch.Tensor | None]  # parameter path -> its .grad
    parameters: dict[str, torch.Tensor]  # parameter path -> the parameter (first name of each)
    loss: float
    outputs: dict[str, Any] = field(default_factory=dict)
    node_targets: dict[str, str] = field(default_factory=dict)  # node name -> op and target
    # node name -> the live tensor, its autograd graph kept (with keep_graph only)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    # node name -> (autograd function, output number) of the value as the node made it
    edges: dict[str, tuple[Any, int]] = field(default_factory=dict)
    detached: bool = False  # the loss did not reach autograd: no gradient flowed at all
    shells: dict[str, Shell] = field(default_factory=dict)  # node name -> its value's shell
    random_state: RandomState | None = None  # the generators' state as its forward began
    # nodes whose autograd functions ran once and are gone: a reentrant checkpoint's
    # region, run again in the backward, and its outputs (their function is the region's)
    recomputed: set[str] = field(default_factory=set)


GradientConsumer = Callable[[str, torch.Tensor], None]


class GradientSink:
    """Where each node's gradient goes as autograd makes it.

    - **kept** (the default): the gradient itself, not a copy (a view's gradient often
      shares its input's storage: copies took 1.7x the memory of the values at
      BERT-base), with its version counter. Holding it keeps autograd from adding into
      it in place (the engine does so only with the last reference); a custom backward
      that changes its ``grad_output`` in place would still change it, and ``changed``
      says so: the run's backward then runs again, copying (``GradientRun.backward``).
    - **copied**: ``grad.clone()`` at the hook, as the model made it.
    - **consumed**: handed to ``consumer`` at the hook and not kept (the diff compares a
      candidate's gradient with the reference's as it comes, then lets it go).
    """

    def __init__(self, grads: dict[str, torch.Tensor]) -> None:
        self.grads = grads
        self.versions: dict[str, int] = {}
        self.copy = False
        self.consumer: GradientConsumer | None = None
        self.failure: Exception | None = None  # the consumer's own error, raised as it is
        self.taken: set[str] = set()  # the nodes a gradient came for, this backward

    def take(self, name: str, grad: torch.Tensor | None) -> None:
        if grad is None:  # a piece of a split the loss never reaches: no gradient came
            return
        self.taken.add(name)
        grad = grad.detach()
        if self.consumer is not None:
            if self.failure is None:
                try:
                    self.consumer(name, grad)
                except Exception as e:  # not the model's: kept from the model's error message
                    self.failure = e
        elif self.copy:
            self.grads[name] = grad.clone()
        else:
            self.grads[name] = grad
            self.versions[name] = grad._version

    def changed(self) -> list[str]:
        """Kept gradients changed in place after the hook gave them."""
        return [name for name, version in self.versions.items()
                if name in self.grads and self.grads[name]._version != version]

    def clear(self) -> None:
        self.grads.clear()
        self.versions.clear()


class _GradientRecorder(_Recorder):
    """The eager recorder, also keeping each value and hooking its gradient."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.values: dict[str, torch.Tensor] = {}
        self.grads: dict[str, torch.Tensor] = {}
        self.requires_grad: set[str] = set()
        self.targets: dict[str, str] = {}
        self.tensors: dict[str, torch.Tensor] = {}  # the live tensors (autograd's graph)
        self.later: list[tuple[str, torch.Tensor]] = []
        # Values made without autograd that never joined its graph, in the forward's order:
        # a reentrant checkpoint's region (run under no_grad, run again in the backward)
        self.pending: list[str] = []
        self.watched: set[int] = set()  # autograd Functions whose backward is watched
        self.region_start = 0  # the first pending value of the next watched Function's
        self.outputs_of: dict[int, list[str]] = {}  # such a Function -> its output nodes
        self.recomputed: set[str] = set()  # nodes GradientRecording.recomputed names
        # pending node -> its value's fingerprint (the values may be let go before the
        # backward; the recomputation makes the same values again, bit for bit)
        self.fingerprints: dict[str, tuple[Any, ...]] = {}
        self.edges: dict[str, tuple[Any, int]] = {}  # node name -> autograd (function, output)
        self.shared: dict[int, list[str]] = {}  # storage -> names of values kept uncopied
        self.handles: list[Any] = []  # the gradient hooks, removed once the backward ran
        self.sink = GradientSink(self.grads)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if args and isinstance(args[0], torch.Tensor) and _mutates(func):
            self._protect(args[0])
        return super().__torch_function__(func, types, args, kwargs)

    def _protect(self, tensor: torch.Tensor) -> None:
        """Copy the kept values an in-place op is about to change (they share storage)."""
        with torch._C.DisableTorchFunction():
            try:
                key = tensor.untyped_storage().data_ptr()
            except Exception:  # a tensor with no storage of its own
                return
            for name in self.shared.pop(key, []):
                self.values[name] = self.values[name].clone()

    def _claim(self, result: Any, node: torch.fx.Node) -> None:
        super()._claim(result, node)
        if isinstance(result, torch.Tensor):
            with torch._C.DisableTorchFunction():  # our own calls are not the model's
                self._watch(result, node)

    def _watch(self, tensor: torch.Tensor, node: torch.fx.Node) -> None:
        name = node.name
        self.targets[name] = f"{node.op}:{getattr(node.target, '__name__', node.target)}"
        # Kept without a copy (memory: one more forward's worth otherwise); an in-place op
        # on the storage copies it first (``_protect``).
        self.values[name] = tensor.detach()
        try:
            self.shared.setdefault(tensor.untyped_storage().data_ptr(), []).append(name)
        except Exception:
            self.values[name] = tensor.detach().clone()
        if not tensor.is_floating_point():
            return
        self.tensors[name] = tensor
        if tensor.requires_grad:
            self.hook(name, tensor)
        else:  # made inside a custom autograd.Function: it joins the graph when apply returns
            self.later.append((name, tensor))

    def hook(self, name: str, tensor: torch.Tensor) -> None:
        self.requires_grad.add(name)
        edge = get_gradient_edge(tensor)  # this version's: an in-place op makes a new one
        self.edges[name] = (edge.node, edge.output_nr)

        # The hook lives in autograd's graph, which ``self.tensors`` keeps: were it to hold
        # the recorder, the cycle would pass through autograd's C++ nodes, which Python's
        # garbage collector cannot see, and every recording would live forever.
        sink = self.sink

        def keep(grad: torch.Tensor) -> None:
            sink.take(name, grad)

        self.handles.append(tensor.register_hook(keep))
        self._hook_base(name, tensor)

    def _hook_base(self, name: str, tensor: torch.Tensor) -> None:
        """A view's gradient from its base's, where its own hook does not fire: an in-place
        op on a view (``h = linear(x); h += x``: a 3-D input's Linear returns a view of its
        matmul) replaces the view's function, and a hook registered on the view before it
        never runs. Its base's function still receives the gradient of the value before the
        op; this view's part of it is taken (after the view's own hook, where that ran)."""
        base = tensor._base if tensor._is_view() else None
        if base is None or base.grad_fn is None or not base.is_contiguous() \
                or base.dtype != tensor.dtype:
            return
        output = get_gradient_edge(base).output_nr
        size, stride = tuple(tensor.shape), tuple(tensor.stride())
        offset = tensor.storage_offset() - base.storage_offset()
        sink = self.sink

        def from_base(grad_outputs: Any) -> None:
            grad = grad_outputs[output] if output < len(grad_outputs) else None
            if name not in sink.taken and grad is not None:
                sink.take(name, grad.contiguous().as_strided(size, stride, offset))

        self.handles.append(base.grad_fn.register_prehook(from_base))

    def hook_the_rest(self) -> None:
        """Values that joined autograd's graph after they were made (custom Functions)."""
        for name, tensor in self.later:
            if tensor.requires_grad and name not in self.requires_grad:
                self.hook(name, tensor)
                if self.pending:  # a Function that may run its region again in its backward
                    self._watch_recomputation(name, tensor.grad_fn)
            elif name not in self.requires_grad:
                self.pending.append(name)
                self.fingerprints[name] = _fingerprint(tensor)
        self.later.clear()

    def _watch_recomputation(self, name: str, function: Any) -> None:
        """While ``function``'s backward runs (a reentrant checkpoint's runs its region
        again), the recomputed values are matched to the pending nodes (``_Recomputation``).
        A mode entered around ``loss.backward()`` would not see it: a mode is off while
        the call it intercepts (``backward``) runs. Where values were made again, the
        function's outputs (``name``) are recomputed too: their function is the region's."""
        if function is None or not isinstance(function,
                                              torch.autograd.function.BackwardCFunction):
            return
        self.outputs_of.setdefault(id(function), []).append(name)
        if id(function) in self.watched:
            return
        self.watched.add(id(function))
        # its region's values are the ones left pending since the last such Function (the
        # backward runs the last region first: each search starts at its own region)
        mode = _Recomputation(self, self.region_start)
        self.region_start = len(self.pending)
        outputs = self.outputs_of[id(function)]

        def enter(_grads: Any) -> None:
            mode.__enter__()

        def leave(_inputs: Any, _outputs: Any) -> None:
            mode.__exit__(None, None, None)
            if mode.found:
                self.recomputed.update(outputs)

        self.handles += [function.register_prehook(enter), function.register_hook(leave)]

    def unhook(self) -> None:
        """Take the gradient hooks off autograd's graph once the backward has run: the
        recording keeps that graph, and nothing of the recorder should stay in it."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


class _Recomputation(TorchFunctionMode):
    """During the backward: a region the forward ran without autograd (a reentrant
    checkpoint) is run again with it; each value it makes again is the pending node's of
    the same shape and values, in the forward's order, and its gradient is hooked there.
    What autograd hands the recomputed value is what the model's backward used."""

    _LOOKAHEAD = 64  # pending nodes searched past the last one found

    def __init__(self, recorder: _GradientRecorder, start: int = 0) -> None:
        super().__init__()
        self.recorder = recorder
        self.at = start
        self.found = 0  # values matched to pending nodes

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if self.at < len(self.recorder.pending):
            with torch._C.DisableTorchFunction():
                for tensor in _tensors_in(result):
                    if tensor.requires_grad and tensor.is_floating_point():
                        self._match(tensor)
        return result

    def _match(self, tensor: torch.Tensor) -> None:
        recorder = self.recorder
        pending = recorder.pending
        made = None
        for i in range(self.at, min(len(pending), self.at + self._LOOKAHEAD)):
            name = pending[i]
            wanted = recorder.fingerprints.get(name)
            if name in recorder.requires_grad or wanted is None \
                    or wanted[:2] != (tensor.shape, tensor.dtype):
                continue
            made = _fingerprint(tensor) if made is None else made
            if made != wanted:
                continue
            recorder.hook(name, tensor)
            recorder.recomputed.add(name)
            self.found += 1
            self.at = i + 1
            return


def _fingerprint(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Shape, dtype and two sums: what tells a value from the others its region makes."""
    with torch.no_grad():
        wide = tensor.detach().double()
        return tensor.shape, tensor.dtype, float(wide.sum()), float(wide.abs().sum())


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    return []


@dataclass
class GradientRun:
    """One side's forward, recorded with autograd on; its backward runs later (``backward``).

    The forward's ``Recording`` serves the forward diff as ``record_forward``'s does, so
    one recorded forward per side serves both comparisons. The run holds the autograd
    graph (and so every value the model saved for its backward) until ``backward``.
    """

    model: torch.nn.Module
    inputs: Mapping[str, torch.Tensor]
    recorder: _GradientRecorder
    outputs: Any  # the model's own outputs, autograd's graph attached
    named: dict[str, torch.nn.Parameter]  # parameter path -> parameter (first name of each)
    keywords: Mapping[str, Any] | None = None  # other arguments of the call
    shells: dict[str, Shell] | None = None  # set once the values were let go
    random_state: RandomState | None = None  # the generators' state as the forward began

    def let_values_go(self, keep: Collection[str] = ()) -> None:
        """Hold no value but those named in ``keep`` (their shells stay): a backward without
        its graph then frees each saved value as it goes, as a plain backward does."""
        recorder = self.recorder
        self.shells = {name: Shell.of(value) for name, value in recorder.values.items()}
        for name in [n for n in recorder.values if n not in keep]:
            del recorder.values[name]
        recorder.tensors.clear()
        recorder.shared.clear()

    def backward(self, loss_fn: LossFn, *, keep_graph: bool = True,
                 detached_ok: bool = False, consumer: GradientConsumer | None = None,
                 keep_values: bool = True, copy: bool = False) -> GradientRecording:
        """``loss_fn(outputs, inputs).backward()``; every node's and parameter's gradient.

        See ``record_backward``. Without ``keep_graph`` autograd frees each function's
        saved values as it runs; the run cannot be used again either way. With
        ``consumer``, each node's gradient is handed to it as autograd makes it and not
        kept (the recording's ``grads`` stay empty). Without ``keep_values`` the values
        go too (the recording keeps their ``shells``; no graph is kept). ``copy``: each
        gradient copied at its hook (``GradientSink``).
        """
        keep_graph = keep_graph and keep_values  # the graph holds the values anyway
        recorder, named, outputs, inputs = self.recorder, self.named, self.outputs, self.inputs
        self.outputs = None  # the graph goes with the recording (keep_graph) or now
        saved = {name: (p.requires_grad, p.grad) for name, p in named.items()}
        sink = recorder.sink
        sink.copy, sink.consumer = copy, consumer
        sink.taken.clear()
        again = False  # a kept gradient changed, and no graph to run the backward again on
        try:
            for p in named.values():
                p.requires_grad_(True)  # AccumulateGrad writes .grad only where it is set
                p.grad = None
            try:
                with torch.enable_grad():
                    loss = _loss_of(loss_fn, outputs, inputs)
                    detached = isinstance(loss, torch.Tensor) and loss.numel() == 1 \
                        and not loss.requires_grad and detached_ok
                    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 \
                            or not (loss.requires_grad or detached):
                        raise InputError("the loss must be a scalar tensor that depends on "
                                         f"the model's outputs, got {_describe(loss)}")
                    if not detached:
                        loss.reshape(()).backward(retain_graph=keep_graph)
                        # a backward that edited its grad_output in place: run again,
                        # copying each gradient (the graph kept), else the forward too
                        again = bool(sink.changed())
                        if again and keep_graph:
                            sink.clear()
                            sink.copy, again = True, False
                            for p in named.values():
                                p.grad = None
                            loss.reshape(()).backward(retain_graph=True)
            except InputError:
                raise
            except Exception as e:
                cause = " ".join(str(e).split())
                raise InputError(f"{type(self.model).__name__} could not run forward and "
                                 f"backward: {type(e).__name__}: {cause}") from e
            if sink.failure is not None:
                raise sink.failure
            # Taken, not copied: each .grad is put back to what it was below.
            grads: dict[str, torch.Tensor | None] = {
                name: None if p.grad is None else p.grad.detach() for name, p in named.items()}
        finally:
            recorder.unhook()
            sink.consumer = None  # the hooks are gone; nothing of the diff stays with the run
            for name, p in named.items():
                p.requires_grad_(saved[name][0])
                p.grad = saved[name][1]
        if again:  # the forward once more, then its backward copying each gradient
            return run_forward(self.model, inputs, self.keywords).backward(
                loss_fn, keep_graph=keep_graph, detached_ok=detached_ok, consumer=consumer,
                keep_values=keep_values, copy=True)
        shells = self.shells if self.shells is not None else \
            {name: Shell.of(value) for name, value in recorder.values.items()}
        return GradientRecording(recorder.values if keep_values else {}, recorder.grads,
                                 recorder.requires_grad, grads,
                                 {n: p.detach() for n, p in named.items()},
                                 float(loss.detach()),
                                 outputs_by_name(outputs),
                                 recorder.targets, recorder.tensors if keep_graph else {},
                                 recorder.edges if keep_graph else {}, detached, shells,
                                 self.random_state, set(recorder.recomputed))


@dataclass
class GradientRecorded(Recording):
    """A forward ``Recording`` made with autograd on, its ``GradientRun`` to go on with."""

    run: GradientRun | None = None


def run_forward(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                keywords: Mapping[str, Any] | None = None) -> GradientRun:
    """``model(**inputs)`` with autograd on, every node's value and gradient hooked.

    Every parameter takes part (``requires_grad`` set for the call, then put back).

    Raises:
        InputError: the model failed on the inputs.
    """
    recorder = _GradientRecorder(model)
    for name, tensor in inputs.items():
        node = recorder._create("placeholder", name, (), {}, tensor)
        recorder.nodes[tensor] = node
    named: dict[str, torch.nn.Parameter] = {}
    for name, p in model.named_parameters():
        named.setdefault(name, p)
    saved = {name: p.requires_grad for name, p in named.items()}
    random_state = RandomState.now()
    try:
        for p in named.values():
            p.requires_grad_(True)
        with torch.enable_grad():
            with _module_hooks(recorder, model), _function_calls(recorder), recorder:
                outputs = model(**inputs, **(keywords or {}))
            recorder.hook_the_rest()
    except Exception as e:
        recorder.unhook()
        cause = " ".join(str(e).split())
        raise InputError(f"{type(model).__name__} could not run forward and backward: "
                         f"{type(e).__name__}: {cause}") from e
    finally:
        for name, p in named.items():
            p.requires_grad_(saved[name])
    return GradientRun(model, inputs, recorder, outputs, named, keywords,
                       random_state=random_state)


def record_with_gradients(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                          title: str = "",
                          keywords: Mapping[str, Any] | None = None) -> GradientRecorded:
    """``record_forward``'s recording, made by ``run_forward``: the forward diff reads the
    graph, the backward diff goes on with ``.run`` (one recorded forward for both)."""
    run = run_forward(model, inputs, keywords)
    recording = finish_recording(run.recorder, model, tuple(inputs), run.outputs, title)
    return GradientRecorded(recording.gm, recording.input_names, recording.output_names,
                            recorded_outputs=outputs_by_name(run.outputs),
                            notes=recording.notes, run=run)


def record_backward(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                    loss_fn: LossFn, *, keep_graph: bool = True,
                    detached_ok: bool = False) -> GradientRecording:
    """Run ``model(**inputs)``, ``loss_fn(outputs, inputs).backward()``; keep all gradients.

    Every parameter takes part (``requires_grad`` set for the run, then put back); the
    parameters' own ``.grad`` are put back afterwards too, so the model is left as found.
    With ``detached_ok``, a scalar loss that autograd cannot reach (a forward under
    ``no_grad``) gives a recording with no gradient and ``detached`` set: a candidate's
    cut gradients are a failure to report, not bad input.

    Raises:
        InputError: the model or the loss failed, or the loss is not a scalar.
    """
    return run_forward(model, inputs).backward(loss_fn, keep_graph=keep_graph,
                                               detached_ok=detached_ok)


def _loss_of(loss_fn: LossFn, outputs: Any, inputs: Mapping[str, torch.Tensor],
             side: str = "") -> Any:
    """The loss; what it raises is the loss's failure, not the model's, said with the
    side whose outputs it was taking (``side``: "reference" or "candidate")."""
    try:
        return loss_fn(outputs, inputs)
    except InputError:
        raise
    except Exception as e:
        cause = " ".join(str(e).split())
        name = getattr(loss_fn, "__name__", "loss")
        where = f" on the {side}'s outputs" if side else ""
        raise InputError(f"the loss ({name}) raised {type(e).__name__}{where}"
                         + (f": {cause[:200]}" if cause else "")) from e


def for_side(loss_fn: LossFn, side: str) -> LossFn:
    """``loss_fn``, whose failure names the side whose outputs it was taking: a loss that
    reads a key only one side returns fails there, and the user needs to know which."""

    def loss(outputs: Any, inputs: Mapping[str, torch.Tensor]) -> Any:
        return _loss_of(loss_fn, outputs, inputs, side)

    loss.__name__ = getattr(loss_fn, "__name__", "loss")
    return loss


def outputs_by_name(outputs: Any) -> dict[str, Any]:
    """A run's outputs by name (``eager.outputs_as_dict``), detached from its graph."""
    return outputs_as_dict(detached_outputs(outputs))


def detached_outputs(outputs: Any) -> Any:
    """``outputs`` with every tensor in it detached (the structure kept)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    if isinstance(outputs, Mapping):
        return {k: detached_outputs(v) for k, v in outputs.items()}
    if isinstance(outputs, (tuple, list)):
        parts = (detached_outputs(v) for v in outputs)
        return type(outputs)(parts) if type(outputs) in (tuple, list) else tuple(parts)
    return outputs


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}" + (
            "" if value.requires_grad else " that does not require grad")
    return type(value).__name__


__all__ = ["GradientConsumer", "GradientRecorded", "GradientRecording", "GradientRun",
           "GradientSink", "LossFn", "Shell", "detached_outputs", "outputs_by_name",
           "record_backward", "record_with_gradients", "run_forward"]
