"""A dump is read lazily: one 256 MiB tensor costs at most twice its size, measured.

The files are written in chunks (the test process never holds the tensor) and read in a
fresh process, whose peak resident memory (``ru_maxrss``) is compared with what it had
after its imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
MIB = 2**20
SIZE = 256 * MIB  # the one big tensor: 64 Mi float32
STATED_PEAK = 2 * SIZE + 64 * MIB  # twice the tensor, plus the interpreter's own slack
_CHUNK = np.full(MIB // 4, 0.5, dtype=np.float32).tobytes()

MEASURE = """
import resource, sys
import torch, numpy, safetensors, zipfile
from introspect.dump.formats import read_dump
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
dump = read_dump(sys.argv[1])
total = 0.0
for name in dump.values:
    value = dump.values[name]
    # every byte touched; summed in chunks (a float64 copy of the whole would count)
    total += sum(float(c.sum(dtype=torch.float64)) for c in value.reshape(-1).split(1 << 20))
    del value
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base, total)
"""


def _small() -> dict[str, np.ndarray]:
    return {"embeddings": np.ones((2, 9, 16), np.float32), "ids": np.arange(18).reshape(2, 9)}


def _write_npz(path: Path) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in _small().items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, array)
        with archive.open("big.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(
                member, {"descr": "<f4", "fortran_order": False, "shape": (SIZE // 4,)})
            for _ in range(SIZE // len(_CHUNK)):
                member.write(_CHUNK)


def _write_safetensors(path: Path) -> None:
    header: dict[str, object] = {}
    offset = 0
    blobs = []
    for name, array in _small().items():
        data = array.tobytes()
        header[name] = {"dtype": "F32" if array.dtype == np.float32 else "I64",
                        "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["big"] = {"dtype": "F32", "shape": [SIZE // 4], "data_offsets": [offset,
                                                                            offset + SIZE]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
        for _ in range(SIZE // len(_CHUNK)):
            f.write(_CHUNK)


@pytest.mark.slow
@pytest.mark.parametrize("suffix, write", [(".npz", _write_npz),
                                           (".safetensors", _write_safetensors)])
def test_one_256_mib_tensor_is_read_within_twice_its_size(tmp_path, suffix, write):
    path = tmp_path / f"big{suffix}"
    write(path)
    run = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    peak, total = run.stdout.split()
    assert float(total) == 0.5 * (SIZE // 4) + 2 * 9 * 16  # every float tensor read in full
    assert int(peak) < STATED_PEAK, f"peak {int(peak) / MIB:.0f} MiB"
    print(f"{suffix}: peak {int(peak) / MIB:.0f} MiB for a {SIZE // MIB} MiB tensor")
