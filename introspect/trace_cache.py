"""A cache of traced graphs: in memory per process, and on disk in the user's cache folder.

A notebook that re-traces, ``make demo`` and CI re-runs trace the same model class with
the same configuration and the same input shapes again and again; the graph is the same
every time. The cache keeps the graph, never the weights: a hit builds a new
GraphModule whose ``call_module``/``get_attr`` targets are the *new* model's own modules,
parameters and buffers, so a hit can never serve stale weights.

The key (``cache_key``) holds everything the graph depends on: the model's class and the
sha256 of the source files of every module class in it, its configuration, its module
tree (classes, plain attributes, train/eval, parameter and buffer names, shapes, dtypes),
the input names, shapes and dtypes (the records hold shapes, and a branch may depend on a
size), autograd's grad mode, and the versions of torch, transformers and introspect with
a hash of introspect's tracing code.

On disk an entry is one JSON file, ``$XDG_CACHE_HOME/introspect/graphs/<key>.json`` (or
``~/.cache/introspect/...``, or ``$INTROSPECT_CACHE_DIR/graphs/...``): nodes, targets
(functions by module and name, imported only from torch, transformers, introspect and
the standard library's operator, builtins and math), arguments, metadata and the node
records (``introspect.records``), so a hit builds no records either. Nothing
is unpickled or executed from it; the code is generated again from the graph. An entry
that cannot be read or does not match its key is ignored and traced again.
At most ``DISK_ENTRIES`` files are kept: writing one removes the least recently used
beyond that (reading a file marks it used). ``INTROSPECT_NO_CACHE=1`` turns the cache
off entirely.

What the key cannot see: a function replaced at run time in a model's Python module
(``modeling_bert.some_function = patched``). A method set on a module instance is seen
(its code is part of the key). Code that monkeypatches model modules turns the cache off.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import TensorMetadata

from introspect.fx_module import build_graph_module
from introspect.records import NodeRecord

FORMAT = 3  # bump when the file layout changes
MEMORY_ENTRIES = 16  # graphs kept per process (each is a graph, not weights)
DISK_ENTRIES = 256  # files kept on disk (each 0.1-0.2 MB for BERT); least recently used go
_IMPORTABLE = ("torch", "transformers", "introspect", "operator", "_operator", "builtins",
               "math")
_TRACING_MODULES = ("tracer", "layer_replay", "leaf_shapes", "shapes", "records", "traced_sizes",
                    "trace_cache")


@dataclass
class CachedTrace:
    """What a trace produced, without weights: rebuild a GraphModule with ``bind``."""

    graph: torch.fx.Graph | None  # None once a graph read from disk was handed out
    constants: dict[str, torch.Tensor]  # get_attr targets the graph owns (tensor constants)
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    decisions: tuple[tuple[str, str, bool], ...]
    notes: tuple[str, ...]
    records: tuple[NodeRecord, ...]  # frozen rows, the same for every model the key fits
    # A graph read from disk is handed to the first bind as it is (no copy); the document
    # it came from rebuilds the entry's own graph if another bind follows.
    document: dict[str, Any] | None = None
    handed_out: bool = False


def enabled() -> bool:
    """False when ``INTROSPECT_NO_CACHE`` is set to anything but "" or "0"."""
    return os.environ.get("INTROSPECT_NO_CACHE", "") in ("", "0")


def cache_folder() -> Path:
    """``$INTROSPECT_CACHE_DIR``, else ``$XDG_CACHE_HOME/introspect`` or ``~/.cache/introspect``."""
    own = os.environ.get("INTROSPECT_CACHE_DIR")
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "introspect"


# -- the key -------------------------------------------------------------------------------

def cache_key(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], fast: bool) -> str:
    """The sha256 of everything the traced graph depends on (see the module docstring)."""
    parts: list[Any] = [FORMAT, _versions(), type(model).__module__, type(model).__qualname__,
                        fast, torch.is_grad_enabled()]
    config = getattr(model, "config", None)
    if config is not None:  # HF's to_json_string deep-copies: 10x slower than this
        fields = vars(config) if hasattr(config, "__dict__") else {"config": config}
        parts.append(sorted((k, repr(v)) for k, v in fields.items()))
        parts.append(getattr(config, "_attn_implementation", None))
    classes = set()
    for name, module in model.named_modules():
        classes.add(type(module))
        plain = sorted((k, _attribute_identity(v)) for k, v in vars(module).items()
                       if not k.startswith("_"))
        parts.append((name, type(module).__module__, type(module).__qualname__, plain))
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        parts.append((name, tuple(tensor.shape), str(tensor.dtype), str(tensor.device),
                      tensor.requires_grad))
    parts.append(sorted(_source_hash(c) for c in classes))
    for name, tensor in inputs.items():
        parts.append((name, tuple(tensor.shape), str(tensor.dtype), str(tensor.device)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _attribute_identity(value: Any, depth: int = 0) -> str:
    """What of an attribute can change the graph: its value, or a function's code.

    Containers and plain objects are looked into (a port's ``self.opts = {"fault": ...}``
    steers its control flow as much as a flag does), a few levels deep.
    """
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype)):
        return repr(value)
    if depth < _ATTRIBUTE_DEPTH:
        inner = depth + 1
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(_attribute_identity(v, inner) for v in value) + "]"
        if isinstance(value, (set, frozenset)):
            return "{" + ", ".join(sorted(_attribute_identity(v, inner) for v in value)) + "}"
        if isinstance(value, dict):
            items = sorted((repr(k), _attribute_identity(v, inner)) for k, v in value.items())
            return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    function = getattr(value, "__func__", value)
    code = getattr(function, "__code__", None)
    if code is not None:  # a function or method set on the instance (a patched forward)
        digest = hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()
        # What the function closes over and its defaults steer it as much as its code does
        # (a fault chosen by a closure variable).
        cells = [_attribute_identity(c.cell_contents, depth + 1)
                 for c in getattr(function, "__closure__", None) or ()
                 if depth < _ATTRIBUTE_DEPTH and _filled(c)
                 and not isinstance(c.cell_contents, torch.nn.Module)]
        defaults = _attribute_identity(getattr(function, "__defaults__", None), depth + 1)
        return f"code {code.co_filename}:{code.co_qualname} {digest} {cells} {defaults}"
    if callable(value) and not isinstance(value, torch.nn.Module):
        return f"callable {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    if (depth < _ATTRIBUTE_DEPTH and hasattr(value, "__dict__")
            and not isinstance(value, (torch.nn.Module, torch.Tensor, type))):
        fields = sorted((k, _attribute_identity(v, depth + 1)) for k, v in vars(value).items())
        return f"{type(value).__qualname__}{fields}"  # a SimpleNamespace, a dataclass, a config
    return type(value).__qualname__


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


_ATTRIBUTE_DEPTH = 4  # containers inside attributes looked into, this many levels
_VERSIONS: list[Any] = []
_SOURCE_HASHES: dict[type, str] = {}


def _versions() -> Any:
    if not _VERSIONS:
        import introspect

        try:
            import transformers

            transformers_version = transformers.__version__
        except ImportError:
            transformers_version = ""
        ours = hashlib.sha256()
        for name in _TRACING_MODULES:
            ours.update(Path(__file__).with_name(f"{name}.py").read_bytes())
        _VERSIONS.append((torch.__version__, transformers_version, introspect.__version__,
                          ours.hexdigest()))
    return _VERSIONS[0]


def _source_hash(cls: type) -> str:
    """The sha256 of the file defining ``cls`` (a changed model source misses the cache)."""
    if cls not in _SOURCE_HASHES:
        try:
            source = Path(inspect.getfile(cls)).read_bytes()
        except (TypeError, OSError):
            source = f"{cls.__module__}.{cls.__qualname__}".encode()
        _SOURCE_HASHES[cls] = hashlib.sha256(source).hexdigest()
    return _SOURCE_HASHES[cls]


# -- in memory -----------------------------------------------------------------------------

_MEMORY: collections.OrderedDict[str, CachedTrace] = collections.OrderedDict()


def remember(key: str, gm: torch.fx.GraphModule, input_names: tuple[str, ...],
             output_names: tuple[str, ...], decisions: list[Any], notes: list[str],
             records: list[NodeRecord]) -> CachedTrace:
    """Keep what ``gm`` was traced into, without its weights, under ``key``."""
    constants = {n.target: _fetch(gm, n.target) for n in gm.graph.nodes
                 if n.op == "get_attr" and str(n.target).startswith("_tensor_constant")}
    entry = CachedTrace(_copy_graph(gm.graph), constants, tuple(input_names),
                        tuple(output_names),
                        tuple((d.node, d.expression, d.answer) for d in decisions),
                        tuple(notes), tuple(records))
    _store(key, entry)
    return entry


def _store(key: str, entry: CachedTrace) -> None:
    _MEMORY[key] = entry
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > MEMORY_ENTRIES:
        _MEMORY.popitem(last=False)


def recall(key: str) -> CachedTrace | None:
    """The entry under ``key``: from memory, else from disk (then kept in memory)."""
    entry = _MEMORY.get(key)
    if entry is not None:
        _MEMORY.move_to_end(key)
        return entry
    entry = read_entry(key)
    if entry is not None:
        _store(key, entry)
    return entry


def clear_memory() -> None:
    """Forget every graph kept in this process (the disk entries stay)."""
    _MEMORY.clear()


def bind(entry: CachedTrace, model: torch.nn.Module) -> torch.fx.GraphModule:
    """A GraphModule running ``entry``'s graph on ``model``'s own modules and weights."""
    if entry.document is not None and not entry.handed_out:
        # Fresh from the file and held by nobody else: the first bind takes it, no copy.
        graph, entry.graph, entry.handed_out = entry.graph, None, True
    else:
        if entry.graph is None:  # the first bind took it: rebuild the entry's own
            assert entry.document is not None
            entry.graph = _graph_from_document(entry.document)
        graph = _copy_graph(entry.graph)
    assert graph is not None
    gm = build_graph_module(_Targets(model, entry.constants), graph, type(model).__name__)
    gm.training = model.training
    return gm


class _Targets(torch.nn.Module):
    """The model's attributes, with the graph's own tensor constants added on top."""

    def __init__(self, model: torch.nn.Module, constants: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.__dict__["_model"] = model
        self.__dict__["_constants"] = constants
        self.training = model.training

    def __getattr__(self, name: str) -> Any:
        constants = self.__dict__["_constants"]
        if name in constants:
            return constants[name]
        return getattr(self.__dict__["_model"], name)


def _fetch(root: Any, target: str) -> Any:
    value = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    copied = torch.fx.Graph(tracer_cls=graph._tracer_cls)
    values: dict[torch.fx.Node, torch.fx.Node] = {}
    output = copied.graph_copy(graph, values)
    old_output = next(reversed(graph.nodes))
    new_output = copied.output(output, old_output.type)
    new_output.meta = copy.copy(old_output.meta)
    return copied


# -- on disk -------------------------------------------------------------------------------

_IMMUTABLE_DICT = torch.fx.immutable_collections.immutable_dict


class _NotSerialisable(Exception):
    """A value the JSON form does not cover: the entry stays in memory only."""


def write_entry(key: str, entry: CachedTrace) -> bool:
    """Write ``entry`` as JSON under the cache folder; False (nothing written) if it cannot."""
    try:
        values: dict[str, int] = {}  # metadata repeat (module stacks, shapes): stored once
        assert entry.graph is not None  # written right after the trace, before any bind
        nodes = [_encode_node(n, values) for n in entry.graph.nodes]
        document = {"format": FORMAT, "key": key, "versions": list(_versions()),
                    "nodes": nodes, "values": [json.loads(v) for v in values],
                    "input_names": list(entry.input_names),
                    "output_names": list(entry.output_names),
                    "decisions": [list(d) for d in entry.decisions],
                    "notes": list(entry.notes),
                    "records": [list(vars(r).values()) for r in entry.records]}
        if entry.constants:
            raise _NotSerialisable("tensor constants")
        text = json.dumps(document, sort_keys=True)
        folder = cache_folder() / "graphs"
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(text)
            os.replace(temporary, folder / f"{key}.json")
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        _prune(folder)
    except (_NotSerialisable, OSError, TypeError, ValueError):
        return False  # a cache that cannot be written is only slower, never an error
    return True


def _prune(folder: Path) -> None:
    """Keep the ``DISK_ENTRIES`` most recently used files (a read touches its file).

    A notebook that sweeps input shapes writes one entry per shape: without a bound the
    folder would only grow.
    """
    entries = []
    for path in folder.glob("*.json"):
        try:
            entries.append((path.stat().st_mtime, path))
        except OSError:  # removed by another process meanwhile
            continue
    entries.sort()
    for _, path in entries[:max(0, len(entries) - DISK_ENTRIES)]:
        with contextlib.suppress(OSError):
            path.unlink()


def read_entry(key: str) -> CachedTrace | None:
    """The entry stored under ``key``, or None if absent, unreadable or not for this key."""
    path = cache_folder() / "graphs" / f"{key}.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document["format"] != FORMAT or document["key"] != key \
                or tuple(document["versions"]) != _versions():
            return None
        graph = _graph_from_document(document)
        records = tuple(_record(row) for row in document["records"])
        if len(records) != len(graph.nodes):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be pruned
        return CachedTrace(graph, {}, tuple(document["input_names"]),
                           tuple(document["output_names"]),
                           tuple((str(a), str(b), bool(c)) for a, b, c in document["decisions"]),
                           tuple(str(n) for n in document["notes"]), records, document)
    except Exception:  # noqa: BLE001 - any damage to a cache file means "trace again"
        return None


def _graph_from_document(document: dict[str, Any]) -> torch.fx.Graph:
    """The graph a cache file describes (ValueError where it does not hold together)."""
    from introspect.tracer import ReloadableTracer

    graph = torch.fx.Graph(tracer_cls=ReloadableTracer)
    nodes: dict[str, torch.fx.Node] = {}
    values = [_decode(v, nodes) for v in document["values"]]  # no node inside these
    for row in document["nodes"]:
        node = graph.create_node(row["op"], _decode(row["target"], nodes),
                                 _decode(row["args"], nodes), _decode(row["kwargs"], nodes),
                                 row["name"], _decode(row["type"], nodes))
        if node.name != row["name"]:
            raise ValueError(f"node {row['name']} was named {node.name}")
        node.meta = {str(k): copy.copy(values[i]) for k, i in row["meta"].items()}
        nodes[node.name] = node
    return graph


_TUPLE_FIELDS = frozenset({"shape", "inputs"})


def _record(row: list[Any]) -> NodeRecord:
    """A NodeRecord from its field values in order (lists back to tuples)."""
    fields = [field.name for field in dataclasses.fields(NodeRecord)]
    if len(row) != len(fields):
        raise ValueError("a record of another layout")
    values: list[Any] = [tuple(v) if name in _TUPLE_FIELDS and v is not None else v
                         for name, v in zip(fields, row, strict=True)]
    return NodeRecord(*values)


def _encode_node(node: torch.fx.Node, values: dict[str, int]) -> dict[str, Any]:
    """A node as JSON; each metadata value is an index into ``values`` (shared by nodes)."""
    meta = {}
    for name, value in node.meta.items():
        text = json.dumps(_encode(value), sort_keys=True)
        meta[name] = values.setdefault(text, len(values))
    return {"op": node.op, "name": node.name, "target": _encode(node.target),
            "args": _encode(node.args), "kwargs": _encode(node.kwargs),
            "type": _encode(node.type), "meta": meta}


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, TensorMetadata):
        return {"tensor_meta": [_encode(v) for v in value]}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, slice):
        return {"slice": [_encode(value.start), _encode(value.stop), _encode(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if type(value) in (tuple, list):
        return {type(value).__name__: [_encode(v) for v in value]}
    if type(value) in (dict, collections.OrderedDict, _IMMUTABLE_DICT):
        if not all(isinstance(k, str) for k in value):
            raise _NotSerialisable("a mapping with keys that are not text")
        tag = "odict" if type(value) is collections.OrderedDict else "dict"
        return {tag: [[k, _encode(v)] for k, v in value.items()]}
    if type(value) is torch.fx.immutable_collections.immutable_list:
        return {"list": [_encode(v) for v in value]}
    if callable(value) or isinstance(value, type):
        return {"object": _importable_name(value)}
    raise _NotSerialisable(type(value).__name__)


def _importable_name(value: Any) -> list[str]:
    try:
        return list(_NAMES[value])
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    found = _find_importable_name(value)
    try:
        _NAMES[value] = (found[0], found[1])
    except TypeError:
        pass
    return found


_NAMES: dict[Any, tuple[str, str]] = {}


def _find_importable_name(value: Any) -> list[str]:
    if value is type(None):
        return ["builtins", "NoneType"]
    module = getattr(value, "__module__", None) or ""
    # torch's built-in functions have a qualname of a private class; their name works.
    for name in (getattr(value, "__qualname__", ""), getattr(value, "__name__", "")):
        try:
            if name and _resolve(module, name) is value:
                return [module, name]
        except Exception:  # noqa: BLE001, S112 - try the next name, else memory only
            continue
    raise _NotSerialisable(f"{module}.{getattr(value, '__qualname__', value)}")


@functools.lru_cache(maxsize=4096)
def _resolve(module: str, name: str) -> Any:
    """The object ``module.name``, for modules of ``_IMPORTABLE`` only (memoised)."""
    if (module, name) == ("builtins", "NoneType"):
        return type(None)
    if module.split(".")[0] not in _IMPORTABLE:
        raise ValueError(f"{module} is not a module a cached graph may name")
    value: Any = sys.modules.get(module) or importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _decode(value: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, body),) = value.items()
    if tag == "node":
        return nodes[body]
    if tag == "float":
        return float(body)
    if tag == "tensor_meta":
        return TensorMetadata(*(_decode(v, nodes) for v in body))
    if tag == "size":
        return torch.Size(body)
    if tag == "torch":
        resolved = getattr(torch, body)
        if not isinstance(resolved, (torch.dtype, torch.memory_format, torch.layout)):
            raise ValueError(f"torch.{body} is not a dtype, layout or memory format")
        return resolved
    if tag == "device":
        return torch.device(body)
    if tag == "slice":
        return slice(*(_decode(v, nodes) for v in body))
    if tag == "ellipsis":
        return Ellipsis
    if tag in ("tuple", "list"):
        items = [_decode(v, nodes) for v in body]
        return tuple(items) if tag == "tuple" else items
    if tag in ("dict", "odict"):
        pairs = [(str(k), _decode(v, nodes)) for k, v in body]
        return collections.OrderedDict(pairs) if tag == "odict" else dict(pairs)
    if tag == "object":
        return _resolve(str(body[0]), str(body[1]))
    raise ValueError(f"unknown tag {tag!r} in a cached graph")
