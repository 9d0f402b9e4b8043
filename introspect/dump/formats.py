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
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from introspect.dump.capture import Capture, CaptureEntry
from introspect.errors import InputError

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
    """

    path: str
    values: dict[str, torch.Tensor]
    dtypes: dict[str, str]
    ordered: bool
    integers: dict[str, torch.Tensor] = field(default_factory=dict)
    capture: Capture | None = None


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


def read_dump(path: str | os.PathLike[str], order_file: str | os.PathLike[str] | None = None
              ) -> Dump:
    """Read a port's dump (or a capture) from ``path``.

    Args:
        path: a ``.safetensors`` or ``.npz`` file, or a folder of ``.npy`` files.
        order_file: a text file naming the tensors in the order the port produced them,
            one per line; overrides any order the file itself carries.

    Raises:
        InputError: a missing, unreadable or empty dump, or an order file that names
            tensors the dump does not hold.
    """
    source = Path(path)
    if not source.exists():
        raise InputError(f"dump {str(source)!r} does not exist")
    try:
        if source.is_dir():
            dump = _read_npy_folder(source)
        elif source.suffix == ".safetensors":
            dump = _read_safetensors(source)
        elif source.suffix == ".npz":
            dump = _read_npz(source)
        else:
            raise InputError(f"dump {str(source)!r}: expected a .safetensors or .npz file or "
                             "a folder of .npy files")
    except InputError:
        raise
    except Exception as e:  # any reader's own error on a damaged file
        raise InputError(f"cannot read dump {str(source)!r}: {type(e).__name__}: {e}") from e
    if order_file is not None:
        dump = _reordered(dump, Path(order_file))
    if not dump.values:
        raise InputError(f"dump {str(source)!r} holds no floating-point tensor")
    return dump


def read_capture(path: str | os.PathLike[str]) -> Capture:
    """Read a capture written by ``introspect capture``.

    Raises:
        InputError: not a capture (a plain dump, another format) or unreadable.
    """
    dump = read_dump(path)
    if dump.capture is None:
        raise InputError(f"{str(path)!r} is not a capture written by 'introspect capture' "
                         "(no introspect metadata); use it as --candidate-dump instead")
    return dump.capture


def _read_safetensors(source: Path) -> Dump:
    from safetensors import safe_open

    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata() or {}
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    order = json.loads(metadata["order"]) if "order" in metadata else None
    if metadata.get("format") == FORMAT:
        return _capture_dump(source, tensors, metadata)
    if order is not None:
        missing = [n for n in order if n not in tensors]
        if missing:
            raise InputError(f"dump {str(source)!r}: its order names {missing[0]!r}, "
                             "which it does not hold")
        tensors = {n: tensors[n] for n in order} | tensors
    return _split(str(source), tensors, ordered=order is not None)


def _capture_dump(source: Path, tensors: dict[str, torch.Tensor],
                  metadata: dict[str, str]) -> Dump:
    if metadata.get("format_version") != FORMAT_VERSION:
        raise InputError(f"capture {str(source)!r} has format version "
                         f"{metadata.get('format_version')!r}; this introspect reads "
                         f"{FORMAT_VERSION!r}: capture it again")
    entries = [CaptureEntry(**{**e, "shape": tuple(e["shape"])})
               for e in json.loads(metadata["entries"])]
    inputs = {k.removeprefix(INPUT_PREFIX): v for k, v in tensors.items()
              if k.startswith(INPUT_PREFIX)}
    values = {e.name: tensors[e.name] for e in entries}
    versions = {k.removeprefix("version."): v for k, v in metadata.items()
                if k.startswith("version.")}
    capture = Capture(entries, values, inputs, tuple(json.loads(metadata.get("texts", "[]"))),
                      tuple(tuple(t) for t in json.loads(metadata.get("tokens", "[]"))),
                      metadata.get("model", ""), versions,
                      {k: float(v) for k, v in json.loads(metadata.get("noise", "{}")).items()})
    dump = _split(str(source), values, ordered=True)
    dump.integers = dict(inputs)
    dump.capture = capture
    return dump


def _read_npz(source: Path) -> Dump:
    import numpy as np

    with np.load(source, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    return _split(str(source), {k: _tensor(v) for k, v in arrays.items()}, ordered=True)


def _read_npy_folder(source: Path) -> Dump:
    import numpy as np

    files = sorted(source.glob("*.npy"))
    if not files:
        raise InputError(f"dump folder {str(source)!r} holds no .npy file")
    arrays = {f.stem: _tensor(np.load(f, allow_pickle=False)) for f in files}
    dump = _split(str(source), arrays, ordered=False)
    order = source / "order.txt"
    return _reordered(dump, order) if order.is_file() else dump


def _tensor(array: Any) -> torch.Tensor:
    import numpy as np

    if array.dtype == object:
        raise InputError("a dumped array holds Python objects; dump numbers only")
    return torch.from_numpy(np.ascontiguousarray(array).reshape(array.shape))  # 0-d stays


def _split(path: str, tensors: dict[str, torch.Tensor], *, ordered: bool) -> Dump:
    values: dict[str, torch.Tensor] = {}
    integers: dict[str, torch.Tensor] = {}
    dtypes: dict[str, str] = {}
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            dtypes[name] = str(tensor.dtype).split(".")[-1]
            values[name] = tensor
        else:  # integer and boolean arrays: inputs, or kept apart (check_inputs says which)
            integers[name] = tensor
    return Dump(path, values, dtypes, ordered, integers)


def _reordered(dump: Dump, order_file: Path) -> Dump:
    try:
        names = [line.strip() for line in order_file.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read order file {str(order_file)!r}: {e}") from e
    unknown = [n for n in names if n not in dump.values and n not in dump.integers]
    if unknown:
        raise InputError(f"order file {str(order_file)!r} names {unknown[0]!r}, which the "
                         f"dump does not hold")
    values = {n: dump.values[n] for n in names if n in dump.values}
    values |= dump.values  # anything the order file leaves out goes last
    return Dump(dump.path, values, dump.dtypes, True, dump.integers, dump.capture)
