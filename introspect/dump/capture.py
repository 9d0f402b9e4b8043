"""Capture a reference's activations: its inputs and the value of every node that computes.

A capture is the golden file a port in any framework tests itself against: the token ids
it must feed, and the value it must reach at every step, named after the reference's fx
nodes and described by module path, layer and op. Layout-only nodes (view, transpose,
contiguous, ...) and identities (dropout in eval mode) are left out: they hold no new
quantity, and a port's dump is aligned to the node that computed the values.

Example::

    >>> loaded = introspect.load_model("bert-tiny")
    >>> cap = capture(loaded.model, introspect.tokenize(loaded.tokenizer), select="layers")
    >>> [e.layer for e in cap.entries]
    ['embeddings', 'encoder.layer.0', 'encoder.layer.1', 'pooler']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from introspect.errors import InputError
from introspect.tracing.records import KIND_TENSOR, NodeRecord
from introspect.tracing.tracer import holds_trace_lock

# Ops that only rearrange or pass on their input's values: no quantity of their own.
LAYOUT_OPS = frozenset({
    "view", "reshape", "transpose", "permute", "contiguous", "expand", "expand_as",
    "unsqueeze", "squeeze", "flatten", "unflatten", "clone", "detach", "Dropout", "dropout",
    "Identity", "t", "movedim", "type_as",
})
SELECTIONS = ("all", "layers")


@dataclass(frozen=True)
class CaptureEntry:
    """What one captured tensor is: the reference node it comes from."""

    name: str  # the reference's fx node name (also the tensor's name in the file)
    index: int  # position in the reference's graph order
    module: str  # module path, "bert.encoder.layer.3.attention.self"
    layer: str  # "embeddings", "encoder.layer.N", "pooler", the head's name
    op: str  # op type: Linear, LayerNorm, scaled_dot_product_attention, add, ...
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Capture:
    """A reference run: its inputs, and its values in graph order.

    Attributes:
        entries: one ``CaptureEntry`` per captured value, in the reference's graph order.
        values: node name -> value (detached, on the CPU).
        inputs: input name -> tensor (``input_ids``, ``token_type_ids``, ``attention_mask``).
        texts, tokens: what the inputs were made from, when known.
        model: a label for the reference (its source or class).
        metadata: versions and anything else worth carrying (strings).
        noise: node name -> its numerical noise in float32 (``|fp32 - fp64|``), when measured.
        graph: the traced ``IntrospectGraph`` of a live capture (so a dump diff can be
            drawn); None for a capture read from a file.
    """

    entries: list[CaptureEntry]
    values: dict[str, torch.Tensor]
    inputs: dict[str, torch.Tensor]
    texts: tuple[str, ...] = ()
    tokens: tuple[tuple[str, ...], ...] = ()
    model: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    noise: dict[str, float] = field(default_factory=dict)
    graph: Any = None  # the IntrospectGraph it was taken from, when live (never written)

    def entry(self, name: str) -> CaptureEntry:
        return next(e for e in self.entries if e.name == name)

    @property
    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.values.values())


def computing_records(records: Sequence[NodeRecord]) -> list[NodeRecord]:
    """The records of nodes that compute a floating-point tensor of their own."""
    return [r for r in records
            if r.kind == KIND_TENSOR and r.op not in ("placeholder", "get_attr", "output")
            and r.dtype.startswith(("float", "bfloat")) and r.op_type not in LAYOUT_OPS
            and r.layer not in ("mask", "inputs")]


def layer_outputs(records: Sequence[NodeRecord]) -> list[NodeRecord]:
    """The last computing node of each layer: what a layer hands on."""
    last: dict[str, NodeRecord] = {}
    for r in computing_records(records):
        last[r.layer] = r
    return sorted(last.values(), key=lambda r: r.index)


def select_records(records: Sequence[NodeRecord], select: str = "all",
                   layers: Iterable[str] | None = None) -> list[NodeRecord]:
    """The nodes a capture keeps.

    Args:
        select: ``all`` (every computing node) or ``layers`` (each layer's output only).
        layers: keep only these layers: ``encoder.layer.N`` labels, bare indices ``N``,
            ``embeddings``, ``pooler`` or the head's name.

    Raises:
        InputError: an unknown selection or a layer the model does not have.
    """
    if select not in SELECTIONS:
        raise InputError(f"unknown selection {select!r}; choose one of {', '.join(SELECTIONS)}")
    chosen = computing_records(records) if select == "all" else layer_outputs(records)
    if layers is None:
        return chosen
    known = list(dict.fromkeys(r.layer for r in computing_records(records)))
    wanted = [f"encoder.layer.{w}" if w.strip().isdigit() else w.strip() for w in layers]
    missing = [w for w in wanted if w not in known]
    if missing:
        raise InputError(f"no layer {missing[0]!r} in this model; it has {', '.join(known)}")
    return [r for r in chosen if r.layer in wanted]


class _Recorder(torch.fx.Interpreter):
    """Runs a recorded graph once and keeps the values of the chosen nodes.

    A leaf module's node runs its ``forward`` alone: the graph already holds what the
    module's hooks did, as nodes of their own.
    """

    def __init__(self, gm: torch.fx.GraphModule, keep: set[str]) -> None:
        super().__init__(gm)
        self.keep = keep
        self.kept: dict[str, torch.Tensor] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self.fetch_attr(target).forward(*args, **kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.name in self.keep and isinstance(value, torch.Tensor):
            self.kept[n.name] = value.detach().clone()
        return value


def record_values(gm: torch.fx.GraphModule, input_names: Sequence[str],
                  inputs: Mapping[str, torch.Tensor], keep: set[str]) -> dict[str, torch.Tensor]:
    """Run ``gm`` on ``inputs`` and return the values of the nodes named in ``keep``."""
    recorder = _Recorder(gm, keep)
    with torch.no_grad():
        recorder.run(*[inputs[n] for n in input_names])
    return recorder.kept


@holds_trace_lock  # thread safety: fx patches process-wide state (tracer.py)
def capture(model: torch.nn.Module, inputs: Any, *, select: str = "all",
            layers: Iterable[str] | None = None, label: str = "",
            noise: bool = False) -> Capture:
    """Run ``model`` on ``inputs`` and capture the value of every node that computes.

    The model's forward is recorded as it runs (``introspect.diff.ops.eager``, as the diff
    does): hooks, private state and Python branches are what ran, never a cached or
    replayed trace.

    Args:
        model: the reference (an HF ``BertFor*`` or any module the tracer handles).
        inputs: ``introspect.tokenize(...)`` output or a mapping of tensors by input name.
        select, layers: which nodes to keep (see ``select_records``).
        label: a name for the reference, stored in the file.
        noise: also run a float64 copy and store each node's float32 rounding noise, so
            that ``--noise-budget`` works against the capture alone.

    Returns:
        A ``Capture``.

    Raises:
        InputError: bad selection or inputs, or a model that fails on them.
    """
    import copy

    from introspect.diff.ops.explain import record_for_diff

    tensors = dict(getattr(inputs, "tensors", inputs))
    graph, _, _ = record_for_diff(model, tensors, label or type(model).__name__)
    chosen = select_records(graph.records, select, layers)
    values = record_values(graph.gm, graph.input_names, tensors, {r.name for r in chosen})
    chosen = [r for r in chosen if r.name in values and not _is_identity(graph.gm, r, values)]
    entries = [CaptureEntry(r.name, r.index, r.module, r.layer, r.op_type,
                            tuple(values[r.name].shape), str(values[r.name].dtype).split(".")[-1])
               for r in chosen]
    noise_of: dict[str, float] = {}
    if noise:
        wide = copy.deepcopy(graph.gm).double()
        wide_inputs = {k: v.double() if v.is_floating_point() else v for k, v in tensors.items()}
        exact = record_values(wide, graph.input_names, wide_inputs, {e.name for e in entries})
        noise_of = {e.name: float((values[e.name].double() - exact[e.name]).abs().max())
                    for e in entries if e.name in exact}
    return Capture(entries, {e.name: values[e.name] for e in entries}, tensors,
                   tuple(getattr(inputs, "texts", ())), tuple(getattr(inputs, "tokens", ())),
                   label or type(model).__name__, _versions(), noise_of, graph)


def _is_identity(gm: torch.fx.GraphModule, record: NodeRecord,
                 values: Mapping[str, torch.Tensor]) -> bool:
    """A node whose value equals one of its captured inputs' (e.g. dropout in eval)."""
    value = values[record.name]
    return any(name in values and values[name].shape == value.shape
               and torch.equal(values[name], value) for name in record.inputs)


def _versions() -> dict[str, str]:
    import transformers

    from introspect.version import __version__

    return {"introspect": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__}
