"""One side of a repro as plain torch calls: the op at the divergence, run once more under
a ``TorchFunctionMode`` that writes down each torch function it calls.

Whatever ran there (a leaf module of torch.nn or transformers, a function, a tensor
method), what computed the values were torch functions on tensors: ``F.linear``,
``F.gelu``, ``Tensor.softmax``. Written down with their arguments, they make a program
that needs torch alone, not the model's code, transformers or the port's file, and that
runs the same kernels in the same order. Tensors the calls read that they did not make
(the op's inputs, a module's weights) become the program's inputs, under keys that say
only which side and which one (``reference.0``); what each stood for in the model (a node
or a module's weight, names chosen by whoever wrote the model) is kept beside them as
data, never in the program's text. Everything else is written as a Python literal, made
only by Python's own quoting of plain values (``str.__repr__``, ``int.__repr__``): a
value's own ``__repr__`` never writes source, and a name never becomes code.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.node import map_arg
from torch.overrides import TorchFunctionMode

from introspect.errors import InputError

# Where a torch function is looked up by name, in this order: the first owner that holds
# the very same object names it.
_OWNERS = (("torch.Tensor", torch.Tensor), ("torch.nn.functional", torch.nn.functional),
           ("torch", torch), ("torch.special", torch.special), ("torch.linalg", torch.linalg),
           ("torch.fft", torch.fft))


class ReproError(InputError):
    """The op at the divergence cannot be written as a standalone torch program."""


@dataclass(frozen=True)
class Call:
    """One line of a program: ``target = function(arguments)``."""

    target: str  # the variable the result goes to: "v3"
    function: str  # "torch.nn.functional.gelu"; "{0}.T" for an attribute of the first argument
    arguments: tuple[str, ...]  # Python source of each argument ("v1", "approximate='tanh'")


@dataclass
class Program:
    """A side's op as torch calls, its named inputs, and the expression of its output."""

    calls: list[Call] = field(default_factory=list)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> saved value
    output: str = ""  # source of the result: "v3", "v2[0]"
    described: dict[str, str] = field(default_factory=dict)  # key -> what it was (data)


class _Writer(TorchFunctionMode):
    """Writes each torch call on the way, naming tensors by where they came from."""

    def __init__(self, prefix: str, known: Mapping[int, str]) -> None:
        super().__init__()
        self.prefix = prefix
        self.program = Program()
        self.names: dict[int, str] = {}  # id(tensor) -> source of that tensor
        self.held: list[Any] = []  # every tensor named: its id stays its own
        self.known = dict(known)  # id(tensor) -> input name, for tensors given by the caller
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        shown_args, shown_kwargs = self._rows_read(func, args, kwargs) or (args, kwargs)
        written = [self.source(a) for a in shown_args] + \
            [f"{_keyword(k)}={self.source(v)}" for k, v in shown_kwargs.items()]
        result = func(*args, **kwargs)
        if _holds_tensor(result):
            self.count += 1
            target = f"v{self.count}"
            self.program.calls.append(Call(target, function_name(func), tuple(written)))
            self.name(result, target)
        return result

    def _rows_read(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """An embedding lookup in a table the program does not make, written on the rows
        it reads (indices renumbered into them): a lookup gives the same rows bit for bit,
        and the bundle holds 12 rows of a 30,522-row table, not the table. None: as it is.
        """
        if func is not torch.nn.functional.embedding or len(args) < 2 or \
                set(kwargs) - {"padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
                               "sparse"}:
            return None
        indices, weight = args[0], args[1]
        if not isinstance(indices, torch.Tensor) or not isinstance(weight, torch.Tensor) \
                or id(indices) in self.names or id(weight) in self.names \
                or weight.dim() != 2 or indices.numel() == 0 \
                or indices.dtype not in (torch.int64, torch.int32):
            return None
        count = weight.shape[0]
        if int(indices.min()) < 0 or int(indices.max()) >= count:
            return None  # the lookup itself fails: written as it is
        rows = indices.flatten().unique()
        padding = args[2] if len(args) > 2 else kwargs.get("padding_idx")
        if padding is not None:
            if not isinstance(padding, int) or not -count <= padding < count:
                return None
            padding = padding % count
            rows = torch.cat([rows, rows.new_tensor([padding])]).unique()
        if rows.numel() >= count:
            return None
        renumbered = torch.searchsorted(rows, indices).to(indices.dtype)
        table = weight.index_select(0, rows)
        what = self.known.get(id(weight), "a weight")
        self.known[id(table)] = f"{what}, rows {rows.tolist()} (the rows the lookup reads)"
        self.known[id(renumbered)] = f"{self.known.get(id(indices), 'the indices')}, " \
            "renumbered into those rows"
        args = (renumbered, table, *args[2:])
        if padding is not None:
            new_padding = int(torch.searchsorted(rows, rows.new_tensor(padding)))
            if len(args) > 2:
                args = (*args[:2], new_padding, *args[3:])
            else:
                kwargs = {**kwargs, "padding_idx": new_padding}
        return args, kwargs

    def name(self, value: Any, source: str) -> None:
        if isinstance(value, torch.Tensor):
            self.names.setdefault(id(value), source)
            self.held.append(value)
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                self.name(item, f"{source}[{i}]")

    def source(self, value: Any) -> str:
        """Python source that stands for ``value`` in the program."""
        if isinstance(value, torch.Tensor):
            if id(value) not in self.names:  # an input, a weight or a constant it reads
                key = f"{self.prefix}.{len(self.program.inputs)}"  # no name of the model's
                self.program.inputs[key] = value.detach().clone()
                self.program.described[key] = self.known.get(id(value), "a constant")
                self.name(value, f"T[{key!r}]")
            return self.names[id(value)]
        return literal(value, self.source)


def write_program(node: torch.fx.Node, gm: torch.fx.GraphModule, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any], chain: list[torch.fx.Node], prefix: str) -> Program:
    """Run ``chain`` (an op, then layout ops on its result) on ``args`` and write it down.

    Args:
        node: the chain's first node, the op that computed (``chain[0]``).
        gm: the recorded GraphModule holding the nodes' modules and weights.
        args, kwargs: ``node``'s arguments as they ran (tensors and constants).
        chain: the nodes run one after the other, each on the one before.
        prefix: "reference" or "candidate": the inputs' names start with it.

    Raises:
        ReproError: a call that torch cannot name, an argument no literal can write.
    """
    known: dict[int, str] = {}
    held: list[torch.Tensor] = []
    fresh_args, fresh_kwargs = _fresh((args, dict(kwargs)))
    for name, tensor in _named_tensors(node, (fresh_args, fresh_kwargs), prefix):
        known[id(tensor)] = name
        held.append(tensor)
    for chained in chain:
        if chained.op == "call_module":
            module = gm.get_submodule(str(chained.target))
            for path, tensor in [*module.named_parameters(), *module.named_buffers()]:
                known.setdefault(id(tensor), f"{prefix}.{chained.target}.{path}")
    writer = _Writer(prefix, known)
    value: Any = None
    with torch.no_grad(), writer:
        for i, chained in enumerate(chain):
            if i == 0:
                call_args, call_kwargs = fresh_args, fresh_kwargs
            else:
                call_args, call_kwargs = _on_previous(chained, chain[i - 1], value, gm)
            value = _run_node(chained, gm, call_args, call_kwargs)
    if not isinstance(value, torch.Tensor):
        raise ReproError(f"the repro needs a tensor out of {chain[-1].name}, got "
                         f"{type(value).__name__}")
    # an output the calls did not make: the op returned one of its inputs as it was
    writer.program.output = writer.source(value)
    del held
    return writer.program


def _run_node(node: torch.fx.Node, gm: torch.fx.GraphModule, args: tuple[Any, ...],
              kwargs: Mapping[str, Any]) -> Any:
    """One node, as the diff's replay runs it (a module's ``forward`` alone, no hooks)."""
    if node.op == "call_module":
        return gm.get_submodule(str(node.target)).forward(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    raise ReproError(f"{node.name} is a {node.op} node: there is no op to run at it")


def _on_previous(node: torch.fx.Node, previous: torch.fx.Node, value: Any,
                 gm: torch.fx.GraphModule) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A layout op's arguments: the previous node's result, weights, constants."""
    def resolve(n: torch.fx.Node) -> Any:
        if n is previous:
            return value
        if n.op == "get_attr":
            return getattr(gm, str(n.target))
        raise ReproError(f"{node.name} reads {n.name} besides {previous.name}; the repro "
                         "follows a single chain of layout ops")

    return map_arg(node.args, resolve), map_arg(node.kwargs, resolve)


def _named_tensors(node: torch.fx.Node, values: Any, prefix: str
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The op's tensor arguments, named after the nodes they came from."""
    sources = map_arg((node.args, dict(node.kwargs)), lambda n: n.name)
    seen: set[str] = set()

    def walk(source: Any, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(value, torch.Tensor):
            name = f"{prefix}.{source}" if isinstance(source, str) else f"{prefix}.input"
            while name in seen:
                name += "_"
            seen.add(name)
            yield name, value
        elif isinstance(value, (tuple, list)) and isinstance(source, (tuple, list)):
            for s, v in zip(source, value, strict=False):
                yield from walk(s, v)
        elif isinstance(value, dict) and isinstance(source, dict):
            for k, v in value.items():
                yield from walk(source.get(k), v)

    yield from walk(sources, values)


def _fresh(value: Any) -> Any:
    """A copy to run on: the captured values stay as they were."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_fresh(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    return value


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(_holds_tensor(v) for v in value)


def _keyword(name: Any) -> str:
    """A keyword argument's name as source: an identifier, or no repro."""
    name = str.__str__(name) if isinstance(name, str) else name
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ReproError(f"the op at the divergence takes a keyword argument that is not a "
                         f"name ({_short(name)}), which the repro cannot write")
    return name


def _identifier(name: Any) -> str:
    """``name`` as a plain ``str`` if it is a Python identifier, else ""."""
    if not isinstance(name, str):
        return ""
    name = str.__str__(name)
    return name if name.isidentifier() and not keyword.iskeyword(name) else ""


def function_name(func: Any) -> str:
    """The Python source that names ``func`` with torch alone.

    A tensor property (``x.T``, ``x.mT``) is written ``{0}.T``: the attribute of the
    first argument.

    Raises:
        ReproError: ``func`` is not reachable from torch by name (a custom op, a function
            of the model's own package).
    """
    if getattr(func, "__name__", "") == "__get__" and hasattr(func, "__self__"):
        attribute = _identifier(getattr(func.__self__, "__name__", ""))
        if attribute:
            return "{0}." + attribute
    name = _identifier(getattr(func, "__name__", ""))
    for owner_name, owner in _OWNERS:
        if name and getattr(owner, name, None) is func:
            return f"{owner_name}.{name}"
    if isinstance(func, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        namespace, *parts = str.__str__(str(func)).replace("::", ".").split(".")
        if namespace in ("aten", "prims") and parts and len(parts) <= 2 \
                and all(_identifier(p) for p in parts):
            op = getattr(getattr(torch.ops, namespace), parts[0], None)
            if op is func or (len(parts) == 2 and getattr(op, parts[1], None) is func):
                return f"torch.ops.{namespace}.{'.'.join(parts)}"
    what = getattr(func, "__qualname__", None) or type(func).__name__
    raise ReproError(f"the op at the divergence calls {_short(what)}, which torch alone "
                     "cannot name; the repro would need the model's code")


def literal(value: Any, tensor_source: Callable[[Any], str]) -> str:
    """``value`` as Python source (tensors inside it through ``tensor_source``).

    Raises:
        ReproError: a value no literal writes (an object of the model's own classes).
    """
    # Python's own quoting of the plain value: a subclass's __repr__ is never called
    if value is None or value is Ellipsis or value is True or value is False:
        return repr(value)
    if isinstance(value, str):
        return str.__repr__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
        return float.__repr__(value)
    if isinstance(value, torch.Tensor):
        return tensor_source(value)
    if isinstance(value, torch.Size):
        return f"torch.Size([{', '.join(literal(v, tensor_source) for v in value)}])"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return _torch_constant(value)
    if isinstance(value, torch.device):
        return f"torch.device({literal(value.type, tensor_source)}, " \
            f"{literal(value.index, tensor_source)})"
    if isinstance(value, slice):
        parts = (value.start, value.stop, value.step)
        return f"slice({', '.join(literal(v, tensor_source) for v in parts)})"
    if isinstance(value, list):
        return f"[{', '.join(literal(v, tensor_source) for v in value)}]"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        items = [literal(v, tensor_source) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return "{" + ", ".join(f"{str.__repr__(k)}: {literal(v, tensor_source)}"
                               for k, v in value.items()) + "}"
    raise ReproError(f"the op at the divergence takes a {_short(type(value).__name__)}, "
                     "which the repro cannot write as a literal")


def _torch_constant(value: Any) -> str:
    """``torch.float32``, ``torch.strided``, ``torch.contiguous_format``: checked to be the
    very object torch names so, not the text an object says of itself."""
    name = _identifier(str(value).removeprefix("torch."))
    if not name or getattr(torch, name, None) is not value:
        raise ReproError(f"the op at the divergence takes a {type(value).__name__} that "
                         "torch does not name")
    return f"torch.{name}"


def _short(value: Any) -> str:
    """A short description for a message: a plain ``str``'s quoting, never an object's own
    ``__repr__`` (a port's class decides what that runs)."""
    if isinstance(value, str):
        text = str.__repr__(value)
    else:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:59] + "…"


__all__ = ["Call", "Program", "ReproError", "function_name", "literal", "write_program"]
