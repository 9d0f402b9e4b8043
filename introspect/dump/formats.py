"""Captures and dumps on disk: safetensors, ``.npz`` and folders of ``.npy`` files.

A capture is one ``.safetensors`` file: the reference's inputs under ``input.<name>``, its
values under the reference's node names, and in the header's metadata (strings only, as
safetensors wants) the order, what each tensor is, the texts, tokens and versions.

A dump is what a port wrote, under its own names: ``.safetensors`` (ordered only when its
metadata holds an ``order``, since safetensors sorts its header), ``.npz`` (the archive
keeps the order the port saved in), or a folder of ``.npy`` files (ordered by an
``order.txt`` in the folder or an order file given). Integer arrays are kept apart: they
are the token ids the port was fed, checked against the reference's inputs.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from introspect.dump.capture import Capture, CaptureEntry
from introspect.errors import InputError
from introspect.files import open_regular, parse_json, printable_name, read_text

FORMAT = "introspect-capture"
FORMAT_VERSION = "1"
INPUT_PREFIX = "input."
DUMP_SUFFIXES = (".safetensors", ".npz")


@dataclass
class Dump:
    """Tensors a port wrote, in the order it produced them when that is known.

    Attributes:
        path: where they came from.
        values: name -> floating-point tensor.
        dtypes: name -> the dtype as written ("float32", "bfloat16", "float64", ...).
        ordered: whether ``values`` is in the order the port produced them.
        integers: name -> integer tensor (token ids, masks the port was fed).
        capture: the whole ``Capture`` when the file is one of introspect's.
        skipped: members that hold no array of numbers (a stray text file in an archive,
            complex or string arrays, booleans), with the reason.

    A dump read from a file holds its tensors lazily (``LazyTensors``): each is read
    from the file when asked for and not kept, so memory holds one dumped tensor at a
    time. Names are ``files.printable_name``s: safe to show and to write.
    """

    path: str
    values: Mapping[str, torch.Tensor]
    dtypes: dict[str, str]
    ordered: bool
    integers: Mapping[str, torch.Tensor] = field(default_factory=dict)
    capture: Capture | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it was not read


# ---------------------------------------------------------------------------------------
# Writing a capture


def capture_bytes(capture: Capture) -> bytes:
    """The capture as one safetensors file, inputs and metadata included (byte-stable)."""
    tensors = {f"{INPUT_PREFIX}{k}": v.contiguous() for k, v in capture.inputs.items()}
    tensors.update({k: v.contiguous() for k, v in capture.values.items()})
    metadata = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "model": capture.model,
        "order": json.dumps([e.name for e in capture.entries]),
        "entries": json.dumps([asdict(e) for e in capture.entries]),
        "texts": json.dumps(list(capture.texts)),
        "tokens": json.dumps([list(t) for t in capture.tokens]),
        "noise": json.dumps(capture.noise),
        **{f"version.{k}": v for k, v in capture.metadata.items()},
    }
    return safetensors_bytes(tensors, metadata)


# safetensors' own writer keeps its metadata in a hash map, whose order changes from run to
# run; the format is simple enough to write here, in a fixed order.
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                       torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                       torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                       torch.bool: "BOOL"}


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors file: 8-byte header length, JSON header, then the data, in order."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    chunks, offset = [], 0
    for name, tensor in tensors.items():
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def index_rows(capture: Capture) -> list[dict[str, Any]]:
    """One row per captured tensor, for ``index.json`` and ``index.csv``."""
    return [{"name": e.name, "index": e.index, "module": e.module, "layer": e.layer,
             "op": e.op, "shape": list(e.shape), "dtype": e.dtype,
             "bytes": capture.values[e.name].numel() * capture.values[e.name].element_size()}
            for e in capture.entries]


def index_json(capture: Capture) -> str:
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": capture.model,
                "texts": list(capture.texts),
                "inputs": {k: list(v.shape) for k, v in capture.inputs.items()},
                "versions": capture.metadata, "tensors": index_rows(capture)}
    return json.dumps(document, indent=2) + "\n"


def index_csv(capture: Capture) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, ["name", "index", "module", "layer", "op", "shape", "dtype",
                                  "bytes"], lineterminator="\n")
    writer.writeheader()
    for row in index_rows(capture):
        writer.writerow({**row, "shape": "x".join(map(str, row["shape"]))})
    return out.getvalue()


# ---------------------------------------------------------------------------------------
# Reading

# A tensor read from a dump must fit in memory next to the reference: its declared size
# (from the file's header, before any byte of it is read) is checked against this share of
# the memory available.
MEMORY_SHARE = 0.5
_SAFETENSORS_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16",
                      "BF16": "bfloat16", "I64": "int64", "I32": "int32", "I16": "int16",
                      "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16",
                      "U32": "uint32", "U64": "uint64"}
_ITEM_SIZES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8,
               "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "uint16": 2,
               "uint32": 4, "uint64": 8}


class LazyTensors(Mapping[str, torch.Tensor]):
    """Name -> tensor, each read from its file when asked for and not kept.

    A mapping like a dict (order, ``in``, ``items()``), whose values cost memory only
    while the caller holds them.
    """

    def __init__(self, loaders: Mapping[str, Callable[[], torch.Tensor]],
                 shapes: Mapping[str, tuple[int, ...]]) -> None:
        self._loaders = dict(loaders)
        self.shapes = dict(shapes)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._loaders[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def ordered(self, names: list[str]) -> LazyTensors:
        """The same tensors, ``names`` first (in that order), the others after."""
        keys = [*names, *(n for n in self._loaders if n not in set(names))]
        return LazyTensors({n: self._loaders[n] for n in keys},
                           {n: self.shapes[n] for n in keys})


def read_dump(path: str | os.PathLike[str], order_file: str | os.PathLike[str] | None = None,
              what: str = "dump") -> Dump:
    """Read a port's dump (or a capture) from ``path``.

    Only regular files are opened (a FIFO, a device or a link to one is refused without
    blocking); every tensor's size is checked from the file's header before it is read,
    and tensors are read one at a time, when used.

    Args:
        path: a ``.safetensors`` or ``.npz`` file, or a folder of ``.npy`` files.
        order_file: a text file naming the tensors in the order the port produced them,
            one per line; overrides any order the file itself carries.

    Raises:
        InputError: a missing, unreadable or empty dump, or an order file that names
            tensors the dump does not hold. Messages name the file (as ``what``: a dump
            or a capture) and never quote the content of an order file.
    """
    source = Path(path)
    shown = repr(printable_name(str(source)))
    if not os.path.lexists(source):
        raise InputError(f"{what} {shown} does not exist")
    try:
        if source.is_dir():
            dump = _read_npy_folder(source)
        elif source.suffix == ".safetensors":
            dump = _read_safetensors(source)
        elif source.suffix == ".npz":
            dump = _read_npz(source)
        else:
            raise InputError(f"dump {shown}: expected a .safetensors or .npz file or "
                             "a folder of .npy files")
    except InputError:
        raise
    except Exception as e:  # any reader's own error on a damaged file
        raise InputError(f"cannot read {what} {shown}: {_reason(e)}") from e
    if order_file is not None:
        dump = _reordered(dump, Path(order_file))
    if not dump.values:
        raise InputError(f"dump {shown} holds no floating-point tensor")
    return dump


def read_capture(path: str | os.PathLike[str]) -> Capture:
    """Read a capture written by ``introspect capture``.

    Raises:
        InputError: not a capture (a plain dump, another format), unreadable, or its
            metadata damaged.
    """
    dump = read_dump(path, what="capture")
    if dump.capture is None:
        raise InputError(f"{printable_name(str(path))!r} is not a capture written by "
                         "'introspect capture' (no introspect metadata); use it as "
                         "--candidate-dump instead")
    return dump.capture


def _reason(error: BaseException) -> str:
    """The first line of an error, cut short: a reader's message may quote the file."""
    text = printable_name(str(error).strip().splitlines()[0] if str(error).strip() else "")
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _memory_limit() -> int:
    from introspect.models.validate import available_memory

    return int(available_memory() * MEMORY_SHARE)


def _check_size(shown: str, name: str, shape: tuple[int, ...], item: int) -> None:
    nbytes = math.prod(shape) * item
    limit = _memory_limit()
    if nbytes > limit:
        raise InputError(f"dump {shown}: tensor {name!r} of shape {tuple(shape)} needs "
                         f"{nbytes:,} bytes, more than half the memory available "
                         f"({limit:,} bytes); dump fewer or smaller tensors")


def _proc_path(fd: int, source: Path) -> str:
    """A name that opens the very file ``fd`` holds (no swap between check and read)."""
    name = f"/proc/self/fd/{fd}"
    return name if os.path.exists(name) else str(source)


def _safe_name(raw: str, seen: Mapping[str, Any], shown: str) -> str:
    name = printable_name(raw)
    if name in seen:
        raise InputError(f"dump {shown}: two tensors are named {name!r} once shown safely; "
                         "give every tensor a distinct printable name")
    return name


def _read_safetensors(source: Path) -> Dump:
    from safetensors import safe_open

    shown = repr(printable_name(str(source)))
    fd = open_regular(source, "dump")
    handle_path = _proc_path(fd, source)
    with safe_open(handle_path, framework="pt") as handle:
        metadata = handle.metadata() or {}
        headers = {k: (handle.get_slice(k).get_dtype(), tuple(handle.get_slice(k).get_shape()))
                   for k in handle.keys()}  # noqa: SIM118
    for key, (dtype, shape) in headers.items():
        item = _ITEM_SIZES.get(_SAFETENSORS_NAMES.get(dtype, ""), 1)
        _check_size(shown, printable_name(key), shape, item)
    if metadata.get("format") == FORMAT:
        try:
            tensors = _load_safetensors(handle_path, list(headers))
        finally:
            os.close(fd)
        return _capture_dump(source, tensors, metadata)
    keep = _FileHolder(fd)

    def loader(key: str) -> Callable[[], torch.Tensor]:
        def load() -> torch.Tensor:
            with safe_open(_proc_path(keep.fd, source), framework="pt") as handle:
                return handle.get_tensor(key)
        return load

    names: dict[str, str] = {}
    for key in headers:
        names[_safe_name(key, names, shown)] = key
    kinds: dict[str, tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]] = {}
    skipped: dict[str, str] = {}
    for name, key in names.items():
        dtype, shape = headers[key]
        dtype = _SAFETENSORS_NAMES.get(dtype, dtype.lower())
        if dtype not in _ITEM_SIZES:
            skipped[name] = f"dtype {dtype} is not read"
            continue
        kinds[name] = (dtype, shape, loader(key))
    order = None
    if "order" in metadata:
        listed = parse_json(metadata["order"], f"the order in dump {shown}")
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise InputError(f"dump {shown}: its metadata's order is not a list of names")
        order = [printable_name(n) for n in listed]
        missing = [n for n in order if n not in names]
        if missing:
            raise InputError(f"dump {shown}: its order names {missing[0]!r}, "
                             "which it does not hold")
    return _split(str(source), kinds, skipped, ordered=order is not None, order=order)


class _FileHolder:
    """Keeps a verified file open while a lazy dump reads from it; closed with the dump."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _load_safetensors(handle_path: str, keys: list[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(handle_path, framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in keys}


def _capture_dump(source: Path, tensors: dict[str, torch.Tensor],
                  metadata: dict[str, str]) -> Dump:
    shown = repr(printable_name(str(source)))
    if metadata.get("format_version") != FORMAT_VERSION:
        raise InputError(f"capture {shown} has format version "
                         f"{printable_name(str(metadata.get('format_version')))!r}; this "
                         f"introspect reads {FORMAT_VERSION!r}: capture it again")
    try:
        entries = [CaptureEntry(**{**e, "shape": tuple(e["shape"])})
                   for e in parse_json(metadata["entries"], "entries")]
        texts = parse_json(metadata.get("texts", "[]"), "texts")
        tokens = parse_json(metadata.get("tokens", "[]"), "tokens")
        noise = parse_json(metadata.get("noise", "{}"), "noise")
        capture_texts = tuple(str(t) for t in texts)
        capture_tokens = tuple(tuple(str(t) for t in row) for row in tokens)
        capture_noise = {str(k): float(v) for k, v in noise.items()}
        values = {e.name: tensors[e.name] for e in entries}
    except (InputError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"capture {shown}: its metadata is damaged ({_reason(e)}); "
                         "capture it again") from e
    inputs = {k.removeprefix(INPUT_PREFIX): v for k, v in tensors.items()
              if k.startswith(INPUT_PREFIX)}
    versions = {k.removeprefix("version."): v for k, v in metadata.items()
                if k.startswith("version.")}
    capture = Capture(entries, values, inputs, capture_texts, capture_tokens,
                      metadata.get("model", ""), versions, capture_noise)
    dtypes = {k: str(v.dtype).split(".")[-1] for k, v in values.items()}
    return Dump(str(source), {k: v for k, v in values.items() if v.is_floating_point()},
                {k: d for k, d in dtypes.items() if values[k].is_floating_point()}, True,
                dict(inputs), capture)


def _npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], Any]:
    """(shape, dtype) of an .npy stream, from its header only (ValueError: not one)."""
    import numpy as np

    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version in ((2, 0), (3, 0)):
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"unknown .npy format version {version}")
    return tuple(shape), dtype


def _numpy_kind(dtype: Any) -> str | None:
    """The dtype's name when it is numbers this project reads, else None."""
    import numpy as np

    if dtype.hasobject:
        raise InputError("a dumped array holds Python objects; dump numbers only")
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) \
            or dtype == np.bool_:
        return str(dtype)
    return None


def _array_tensor(array: Any) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(array).reshape(array.shape))  # 0-d stays


def _read_npz(source: Path) -> Dump:
    import numpy as np

    shown = repr(printable_name(str(source)))
    fd = open_regular(source, "dump")
    handle = os.fdopen(fd, "rb")
    try:
        archive = zipfile.ZipFile(handle)
    except BaseException:
        handle.close()
        raise
    kinds: dict[str, tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]] = {}
    skipped: dict[str, str] = {}

    def loader(info: zipfile.ZipInfo) -> Callable[[], torch.Tensor]:
        def load() -> torch.Tensor:
            with archive.open(info) as member:
                return _array_tensor(np.lib.format.read_array(member, allow_pickle=False))
        return load

    for info in archive.infolist():
        if info.is_dir():
            continue
        raw = info.filename.removesuffix(".npy")
        name = _safe_name(raw, {**kinds, **skipped}, shown)
        if not info.filename.endswith(".npy"):
            skipped[name] = "not a .npy array"
            continue
        if info.file_size > _memory_limit():  # before a byte of it is decompressed
            raise InputError(f"dump {shown}: member {name!r} unpacks to {info.file_size:,} "
                             f"bytes, more than half the memory available "
                             f"({_memory_limit():,} bytes); is it the right file?")
        with archive.open(info) as member:
            try:
                shape, dtype = _npy_header(member)
            except ValueError:
                skipped[name] = "not a .npy array"
                continue
        kind = _numpy_kind(dtype)
        if kind is None:
            skipped[name] = f"dtype {dtype} is not read"
            continue
        _check_size(shown, name, shape, dtype.itemsize)
        kinds[name] = (kind, shape, loader(info))
    return _split(str(source), kinds, skipped, ordered=True)  # the loaders hold the archive


def _read_npy_folder(source: Path) -> Dump:
    import numpy as np

    shown = repr(printable_name(str(source)))
    entries = sorted((e for e in os.scandir(source) if e.name.endswith(".npy")),
                     key=lambda e: e.name)
    if not entries:
        raise InputError(f"dump folder {shown} holds no .npy file")
    kinds: dict[str, tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]] = {}
    skipped: dict[str, str] = {}

    def loader(path: str) -> Callable[[], torch.Tensor]:
        def load() -> torch.Tensor:
            with os.fdopen(open_regular(path, "dumped array"), "rb") as stream:
                return _array_tensor(np.lib.format.read_array(stream, allow_pickle=False))
        return load

    for entry in entries:
        name = _safe_name(entry.name.removesuffix(".npy"), {**kinds, **skipped}, shown)
        with os.fdopen(open_regular(entry.path, "dumped array"), "rb") as stream:
            try:
                shape, dtype = _npy_header(stream)
            except ValueError as e:
                raise InputError(f"dump {shown}: {name!r} is not a .npy array "
                                 f"({_reason(e)})") from e
        kind = _numpy_kind(dtype)
        if kind is None:
            skipped[name] = f"dtype {dtype} is not read"
            continue
        _check_size(shown, name, shape, dtype.itemsize)
        kinds[name] = (kind, shape, loader(entry.path))
    dump = _split(str(source), kinds, skipped, ordered=False)
    order = source / "order.txt"
    return _reordered(dump, order) if os.path.lexists(order) else dump


def _split(path: str,
           kinds: Mapping[str, tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]],
           skipped: dict[str, str], *, ordered: bool, order: list[str] | None = None) -> Dump:
    """Floating-point tensors as values; integer and boolean arrays as integers (inputs, or
    kept apart: ``check_inputs`` says which)."""
    names = list(kinds)
    if order is not None:
        names = [*order, *(n for n in names if n not in set(order))]
    values, integers, dtypes = {}, {}, {}
    for name in names:
        if name not in kinds:
            continue
        dtype, shape, load = kinds[name]
        if dtype.startswith(("float", "bfloat")):
            values[name], dtypes[name] = (load, shape), dtype
        else:
            integers[name] = (load, shape)
    return Dump(path, LazyTensors({k: v[0] for k, v in values.items()},
                                  {k: v[1] for k, v in values.items()}),
                dtypes, ordered,
                LazyTensors({k: v[0] for k, v in integers.items()},
                            {k: v[1] for k, v in integers.items()}),
                skipped=skipped)


def _reordered(dump: Dump, order_file: Path) -> Dump:
    shown = repr(printable_name(str(order_file)))
    text = read_text(order_file, "order file")
    names = [printable_name(line.strip()) for line in text.splitlines() if line.strip()]
    unknown = [i for i, n in enumerate(names, 1) if n not in dump.values
               and n not in dump.integers and n not in dump.skipped]
    if unknown:
        raise InputError(f"order file {shown}: {len(unknown)} of its {len(names)} lines name "
                         f"no tensor of the dump (the first at line {unknown[0]}); each line "
                         f"must be a tensor name the dump holds")
    listed = [n for n in names if n in dump.values]
    if isinstance(dump.values, LazyTensors):
        values: Mapping[str, torch.Tensor] = dump.values.ordered(listed)
    else:
        values = {n: dump.values[n] for n in listed} | dict(dump.values)
    return Dump(dump.path, values, dump.dtypes, True, dump.integers, dump.capture,
                dump.skipped)
