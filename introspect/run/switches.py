"""Process-wide switches a port's build may flip, read and put back.

A build may switch off PyTorch's attention fast path, leave autograd off, set the default
dtype or the float32 matmul precision, turn on deterministic algorithms, or switch off
scaled-dot-product attention's backends. Such a switch is not code that the reference
runs: whether it matters is a matter of values. So a flipped switch is no refusal by
itself (``introspect.diff``): the reference is checked again under it, bit for bit (exit 2
only when its own values move, naming the switch), and the candidate is called once more
with every switch as it was before its build, judged like its other calls (a fault that
only the switched-off path computes cannot hide behind the switch). Either way the notes
name the switch.

Example::

    >>> before = snapshot()
    >>> torch.backends.mha.set_fastpath_enabled(False)
    >>> flipped(before, snapshot())
    {'attention fast path': ('on', 'off')}
    >>> with put_back(before):
    ...     torch.backends.mha.get_fastpath_enabled()
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

_SDPA_BACKENDS = ("flash", "mem_efficient", "math", "cudnn")


def _fastpath() -> Any:
    return "on" if torch.backends.mha.get_fastpath_enabled() else "off"


def _set_fastpath(value: Any) -> None:
    torch.backends.mha.set_fastpath_enabled(value == "on")


def _matmul_precision() -> Any:
    return torch.get_float32_matmul_precision()


def _deterministic() -> Any:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def _set_deterministic(value: Any) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _sdpa() -> Any:
    backends = torch.backends.cuda
    return tuple((name, bool(getattr(backends, f"{name}_sdp_enabled")()))
                 for name in _SDPA_BACKENDS if hasattr(backends, f"{name}_sdp_enabled"))


def _set_grad_mode(value: Any) -> None:
    torch.set_grad_enabled(value == "on")


def _set_sdpa(value: Any) -> None:
    for name, on in value:
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


# name -> (read, write); the names are the fingerprint's (``models.ports``)
SWITCHES: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "default dtype": (lambda: str(torch.get_default_dtype()),
                      lambda v: torch.set_default_dtype(getattr(torch, v.split(".")[-1]))),
    "float32 matmul precision": (_matmul_precision, torch.set_float32_matmul_precision),
    "grad mode": (lambda: "on" if torch.is_grad_enabled() else "off", _set_grad_mode),
    "deterministic algorithms": (_deterministic, _set_deterministic),
    "attention fast path": (_fastpath, _set_fastpath),
    "sdpa backends": (_sdpa, _set_sdpa),
}


def snapshot() -> dict[str, Any]:
    """Every switch's value now (one this torch cannot read is left out)."""
    values = {}
    for name, (read, _) in SWITCHES.items():
        try:
            values[name] = read()
        except Exception:  # noqa: BLE001  an older torch, or the per-backend precision API
            continue
    return values


def flipped(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The switches whose value differs: name -> (before, after)."""
    return {name: (value, after.get(name)) for name, value in before.items()
            if after.get(name) != value}


def describe(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """``attention fast path (on -> off)``, for one line."""
    return ", ".join(f"{name} ({_shown(old)} -> {_shown(new)})"
                     for name, (old, new) in changes.items())


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):  # sdpa's
        on = [name for name, enabled in value if enabled]
        return "+".join(on) if on else "none"
    if isinstance(value, tuple):
        return str(value[0])
    return str(value)


@contextlib.contextmanager
def put_back(before: Mapping[str, Any]) -> Iterator[None]:
    """Every switch as in ``before`` inside the block; as it was on entry afterwards."""
    now = snapshot()
    changes = flipped(before, now)
    try:
        for name in changes:
            SWITCHES[name][1](before[name])
        yield
    finally:
        for name in changes:
            SWITCHES[name][1](now[name])


__all__ = ["SWITCHES", "describe", "flipped", "put_back", "snapshot"]
