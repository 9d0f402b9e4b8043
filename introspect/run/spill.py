"""Module values held on disk once a plain call's hooks hold more than a budget in memory.

``capture`` keeps what every module of a plain call took and returned until module
evidence has judged it: at BERT-base 8 x 512 about 2.6 GB, against a forward's growth of
about 320 MB (``benchmarks.diff_peak``). Past a budget of held values (``Holding``, one for a
diff's two models), each new value's memory, its whole storage so that values viewing one
storage still view one when read back, is copied as the hook sees it and written by a
thread of its own to one file of a temporary folder (``SpillFolder``), while the forward
goes on. ``Spilled.load`` maps it again (copy on write: never written back) as the same
dtype, shape, strides and storage offset. It reads back bit for bit what the hook saw, so
nothing judged on it changes; it is a copy, so an edit the model makes later does not
reach it (a held value so edited is dropped as no longer what the module returned).

A storage read back is one memory while anything holding a value read from it lives
(``SpilledStorage.base``, its mapping kept weakly): two values that viewed one memory in the
call still do when read together, as ``same_view`` and the storage checks of module
evidence ask. Module evidence holds each value it pairs, and a mapped page stays resident
once read: ``Holding.release_pages``, called after each call it judges, lets go of the pages
read (the values stay mapped, the next read takes them from the file again).

Only plain CPU tensors are spilled (not a device's, not a tensor subclass's); where a write
fails (a full disk) the copy is held in memory instead and nothing more is spilled. The
file is ``tempfile.TemporaryFile``'s (``TMPDIR`` chooses where): it has no name from the
start (or loses it at once), so nothing is left behind, even by a diff killed with
SIGKILL; its space goes when the last mapping of it and the ``SpillFolder`` have gone.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import os
import queue
import tempfile
import threading
import weakref
from typing import Any

import numpy as np
import torch

from introspect.errors import InputError
from introspect.files import printable_name
from introspect.run.heap import Trimmer

# Held in memory before values go to disk: the larger of this and half the reference's
# parameters' bytes (``hold_budget``), so a diff's memory stays a small multiple of its
# models' whatever the input's size.
HOLD_FLOOR_BYTES = 256 << 20
# Copies waiting for the writer at most: a hook waits past this (the disk is slower than
# the forward makes values).
PENDING_BYTES = 64 << 20
HOLD_VARIABLE = "INTROSPECT_HOLD_MIB"


def hold_budget(model: torch.nn.Module) -> int:
    """Bytes of values a diff's hooks hold in memory, ``model`` the reference; the
    environment's ``INTROSPECT_HOLD_MIB`` where set (0: every value goes to disk)."""
    asked = asked_hold_bytes()
    if asked is not None:
        return asked
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(HOLD_FLOOR_BYTES, weights // 2)


def asked_hold_bytes() -> int | None:
    """``INTROSPECT_HOLD_MIB`` in bytes, None where unset (the CLI asks before any work).

    Raises:
        InputError: not a finite number of MiB.
    """
    asked = os.environ.get(HOLD_VARIABLE, "").strip()
    if not asked:
        return None
    try:
        return max(0, int(float(asked) * (1 << 20)))
    except (ValueError, OverflowError):
        raise InputError(f"{HOLD_VARIABLE}={printable_name(asked)[:40]} is not a number of "
                         "MiB (the values a diff holds in memory; 0: all on disk)") from None


class SpillFolder:
    """One temporary file, with no name, that spilled storages are appended to, in the
    order they came, by one writer thread; closed with this object."""

    def __init__(self) -> None:
        try:
            # written by the writer alone; read by mapping its descriptor, never by a seek
            self.file: Any = tempfile.TemporaryFile(prefix="introspect-values-",
                                                    buffering=0)
        except OSError:
            self.file = None
        self.size = 0  # bytes given to the writer
        self.failed = self.file is None  # a write failed (a full disk): nothing more spilled
        self.mapped: dict[int, weakref.ref[np.ndarray]] = {}  # mapped again, by id
        self._queue: queue.Queue[SpilledStorage | None] = queue.Queue()
        self._pending = 0
        self._room = threading.Condition()
        self._writer: threading.Thread | None = None
        if self.file is not None:
            weakref.finalize(self, self.file.close)

    def write(self, memory: torch.Tensor) -> SpilledStorage:
        """``memory`` (a flat uint8 tensor) copied now and given to the writer."""
        nbytes = memory.numel()
        with self._room:
            while self._pending and self._pending + nbytes > PENDING_BYTES:
                self._room.wait()
            self._pending += nbytes
        spilled = SpilledStorage(self, self.size, nbytes, memory.clone())
        self.size += nbytes
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_all, daemon=True,
                                            name="introspect-spill")
            self._writer.start()
        self._queue.put(spilled)
        return spilled

    def flush(self) -> None:
        """Every copy given so far on disk (or, where a write failed, kept in memory)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None

    def _write_all(self) -> None:
        while (spilled := self._queue.get()) is not None:
            try:
                memory = spilled.memory
                if self.file is not None and not self.failed and memory is not None:
                    _write_fully(self.file, memoryview(memory.numpy()))  # type: ignore[arg-type]
                    spilled.memory = None  # on disk: read back from there
            except BaseException:  # noqa: BLE001  (a full disk, or anything: the copy
                # stays in memory, later offsets would be wrong, nothing more is written)
                self.failed = True
            finally:
                with self._room:  # (a hook waiting for room never waits for ever)
                    self._pending -= spilled.nbytes
                    self._room.notify_all()

    def release(self) -> None:
        """Every page of a mapped value that was read let go of (``MADV_DONTNEED``): the
        value stays mapped, as the same tensor, and its next read takes its bytes from the
        file again. Nothing writes into a value read back (the runs on one take copies),
        so nothing is lost."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for held in list(self.mapped.values()):
            array = held()
            handle = array.base if array is not None else None
            if isinstance(handle, mmap.mmap):
                handle.madvise(mmap.MADV_DONTNEED)


def _write_fully(f: object, data: memoryview) -> None:
    while data:
        written = f.write(data)  # type: ignore[attr-defined]
        data = data[written:]


def _mapped(file: Any, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of ``file`` from ``offset``, mapped copy on write (never written back): a
    uint8 array whose ``base`` is the mapping (a mapping starts at a page's boundary)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    handle = mmap.mmap(file.fileno(), offset - start + nbytes, access=mmap.ACCESS_COPY,
                       offset=start)
    return np.frombuffer(handle, dtype=np.uint8, count=nbytes, offset=offset - start)


def _forget(mapped: dict[int, Any], key: int, _: object) -> None:
    mapped.pop(key, None)


class SpilledStorage:
    """One storage's bytes: the copy the hook took while it waits for the writer (or where
    the write failed), then the folder's file, mapped again on demand."""

    def __init__(self, folder: SpillFolder, offset: int, nbytes: int,
                 memory: torch.Tensor) -> None:
        self.folder = folder  # (holds the file while any of its storages is referred to)
        self.offset = offset
        self.nbytes = nbytes
        self.memory: torch.Tensor | None = memory
        self._mapped: weakref.ref[np.ndarray] | None = None

    def base(self) -> torch.Tensor:
        """The storage as a flat uint8 tensor: on the memory mapped already while any
        value read from it lives (each holds the mapping: ``torch.from_numpy``)."""
        memory = self.memory
        if memory is not None:
            return memory
        mapped = self._mapped() if self._mapped is not None else None
        if mapped is None:
            if self.nbytes == 0:
                return torch.empty(0, dtype=torch.uint8)
            mapped = _mapped(self.folder.file, self.offset, self.nbytes)
            self._mapped = weakref.ref(mapped)
            self.folder.mapped[id(mapped)] = weakref.ref(
                mapped, functools.partial(_forget, self.folder.mapped, id(mapped)))
        return torch.from_numpy(mapped)


@dataclasses.dataclass(frozen=True)
class Spilled:
    """A value held on disk: its storage and its layout in it."""

    storage: SpilledStorage
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # storage offset, in elements
    probe: tuple[float, ...]  # ``capture.probe`` of it, read before it was let go
    version: int  # the original's version counter when it was copied

    def load(self) -> torch.Tensor:
        return self.storage.base().view(self.dtype).as_strided(self.shape, self.stride,
                                                               self.offset)


class Holding:
    """What one diff's hooks hold in memory, against one budget (the reference's and the
    candidate's calls together), and the folder the rest goes to."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget  # None: everything is held
        self.held_bytes = 0
        self.held: set[int] = set()  # storages held, by address (held, so not reused)
        # the models' own weights and buffers, by address: a value viewing one (a position
        # table's rows) is held, as the model holds it, and costs nothing
        self.weights: set[int] = set()
        self.folder: SpillFolder | None = None
        # storages written, by the address they had: reused for a later value viewing
        # that address while its bytes there are still the ones written
        self.written: dict[int, SpilledStorage] = {}
        self.trimmer = Trimmer()  # (the free heap given back as values go: ``run.heap``)

    def know_weights(self, model: torch.nn.Module) -> None:
        """``model``'s parameters and buffers: values viewing them are held for free."""
        for t in [*model.parameters(), *model.buffers()]:
            if t.layout == torch.strided and not t.is_meta:
                self.weights.add(t.untyped_storage().data_ptr())

    def store(self, value: torch.Tensor, probe: tuple[float, ...]) -> torch.Tensor | Spilled:
        """``value`` itself where its storage is held (a weight's, or one held already) or
        fits the budget, else spilled."""
        if self.budget is None or not spillable(value):
            return value
        storage = value.untyped_storage()
        address = storage.data_ptr()
        if address in self.held or address in self.weights:
            return value
        if self.held_bytes + storage.nbytes() <= self.budget or \
                (self.folder is not None and self.folder.failed):
            self.held.add(address)
            self.held_bytes += storage.nbytes()
            return value
        return Spilled(self._written(value, address), value.dtype, tuple(value.shape),
                       tuple(value.stride()), int(value.storage_offset()), probe,
                       value._version)

    def tick(self) -> None:
        """A value seen by the hooks: the allocator's free memory given back where it has
        grown (a forward frees its activations around the values held: ``run.heap``),
        once values go to disk (below the budget the heap is small, and left alone)."""
        if self.folder is not None:
            self.trimmer.maybe_trim()

    def flush(self) -> None:
        """Every spilled value written (the end of a model's calls)."""
        if self.folder is not None:
            self.folder.flush()

    def release_pages(self) -> None:
        """The pages of spilled values read so far let go of (``SpillFolder.release``), and
        the allocator's free memory given back where it has grown (``run.heap``)."""
        if self.folder is not None:
            self.folder.release()
            self.trimmer.maybe_trim()

    def _written(self, value: torch.Tensor, address: int) -> SpilledStorage:
        memory = storage_bytes(value)
        known = self.written.get(address)
        if known is not None and known.nbytes == memory.numel() \
                and torch.equal(known.base(), memory):
            return known  # (another view of a storage written already, unchanged since)
        if self.folder is None:
            self.folder = SpillFolder()
        written = self.written[address] = self.folder.write(memory)
        return written


def spillable(value: torch.Tensor) -> bool:
    """A plain CPU tensor whose storage can be written as bytes and read back as it is."""
    return type(value) is torch.Tensor and value.device.type == "cpu" \
        and value.layout == torch.strided and not value.is_quantized \
        and not value.is_meta and not value.is_nested \
        and value.untyped_storage().nbytes() % value.element_size() == 0


def storage_bytes(value: torch.Tensor) -> torch.Tensor:
    """``value``'s whole storage as a flat uint8 tensor (its memory, not a copy)."""
    storage = value.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))


__all__ = ["HOLD_FLOOR_BYTES", "HOLD_VARIABLE", "PENDING_BYTES", "Holding", "SpillFolder",
           "Spilled", "SpilledStorage", "asked_hold_bytes", "hold_budget", "spillable",
           "storage_bytes"]
