"""What the reference computes with besides its inputs, read cheaply: is a call needed to
check that the candidate left it as it was?

After the candidate's calls, ``introspect.diff`` calls the reference once more and holds
its outputs to its first ones (``check_reference_again``): a candidate that patched a torch
function, registered a kernel or edited the reference's weights is named, and gets no
verdict. Where the verdict was taken without running the reference after the candidate
(a PASS that outputs and module evidence prove: nothing of the reference runs after the
candidate's first call), that call adds no evidence to the verdict; it only tells whether
the reference is left changed. This footprint says when it can be left out.

A footprint, taken once the reference's truth was taken and before the candidate is built
or called, holds by identity or by checksum what a candidate could change for the
reference: its weights and buffers (integer checksums, dtype, shape, storage), its modules'
attributes and hooks, its classes' functions and the globals of the Python modules that
define them, torch's functions and Tensor's methods, torch's global hooks and switches
(``models.ports.fingerprint``), the kernels registered from Python (``torch.library``),
every shared library mapped into the process (a C++ kernel registers itself when it is
loaded) and the environment. Anything else moved, or a platform where the mapped
libraries cannot be read, means the call is made: the footprint only ever spares a call,
it never decides a verdict.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from introspect.models.ports import Fingerprint, fingerprint, what_changed
from introspect.run.truth import checksum, weight_sums

_MAPS = "/proc/self/maps"


@dataclasses.dataclass(frozen=True)
class Footprint:
    """The reference's surroundings at one moment (see the module's docstring)."""

    model: Fingerprint
    sums: dict[str, int]
    storages: tuple[tuple[str, str, tuple[int, ...], int], ...]
    kernels: frozenset[str]
    libraries: frozenset[str] | None  # None: this platform does not say
    environment: tuple[tuple[str, str], ...]


def take(reference: torch.nn.Module) -> Footprint:
    """The reference's footprint now (a few milliseconds: no hash of its weights)."""
    tensors = [*reference.named_parameters(remove_duplicate=False),
               *reference.named_buffers(remove_duplicate=False)]
    storages = tuple((name, str(t.dtype), tuple(t.shape),
                      t.untyped_storage().data_ptr() if t.device.type != "meta" else 0)
                     for name, t in tensors)
    with torch.no_grad():  # a buffer too: an integer one (position ids) included
        buffers = {f"buffer {name}": checksum(b.detach()) for name, b in reference.named_buffers()
                   if b.device.type != "meta" and b.layout == torch.strided}
    return Footprint(fingerprint(reference, tensors=False),
                     {**weight_sums(reference), **buffers}, storages, _kernels(),
                     _libraries(), tuple(sorted(os.environ.items())))


def moved(before: Footprint, reference: torch.nn.Module) -> list[str]:
    """What differs from ``before`` now, one phrase each (a platform that does not list
    its libraries always gives one: nothing can be told there)."""
    return differences(before, take(reference))


def differences(before: Footprint, now: Footprint) -> list[str]:
    """What differs between two footprints of one reference (``moved``)."""
    changes = what_changed(before.model, now.model)
    changes += [name for name, value in before.sums.items() if now.sums.get(name) != value]
    if now.storages != before.storages:
        changes.append("the reference's weights were replaced or moved")
    changes += [f"a {key} kernel registered" for key in sorted(now.kernels - before.kernels)]
    changes += [f"a {key} kernel removed" for key in sorted(before.kernels - now.kernels)]
    if before.libraries is None or now.libraries is None:
        changes.append("the libraries loaded (this platform does not list them)")
    else:
        changes += [f"{path} loaded" for path in sorted(now.libraries - before.libraries)]
        changes += [f"{path} unloaded" for path in sorted(before.libraries - now.libraries)]
    if now.environment != before.environment:
        changes.append("the environment")
    return changes


def _kernels() -> frozenset[str]:
    """The kernels registered from Python (``torch.library.Library.impl``)."""
    import torch.library

    return frozenset(getattr(torch.library, "_impls", ()))


def _libraries() -> frozenset[str] | None:
    """Every shared library mapped into this process, by path (None: cannot tell)."""
    try:
        with open(_MAPS, encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    fields = (line.split(None, 5) for line in lines)  # address, perms, ..., path
    return frozenset(f[5] for f in fields if len(f) == 6 and ".so" in f[5].rsplit("/", 1)[-1])


__all__ = ["Footprint", "differences", "moved", "take"]
