"""Builders (and a forward) that end the process or raise what is not an Exception."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ci" / "my_port.py"
_spec = importlib.util.spec_from_file_location("_exits_my_port", _EXAMPLE)
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


class Stop(BaseException):
    """Neither an Exception nor an exit: what a framework might raise to unwind."""


def exits_0(reference: Any) -> Any:
    sys.exit(0)


def exits_none(reference: Any) -> Any:
    raise SystemExit


def interrupts(reference: Any) -> Any:
    raise KeyboardInterrupt


def raises_a_base_exception(reference: Any) -> Any:
    raise Stop("unwinding")


def gets_ctrl_c(reference: Any) -> Any:
    """A real Ctrl-C while the build runs: the run is interrupted, not the port's fault."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)  # the signal arrives here
    raise AssertionError("SIGINT did not interrupt the build")


class _Exiting(torch.nn.Module):
    def __init__(self, port: torch.nn.Module, stop: BaseException) -> None:
        super().__init__()
        self.port, self.stop = port, stop

    def forward(self, **inputs: torch.Tensor) -> Any:
        self.port(**inputs)
        raise self.stop  # traced or run, the diff meets it


def forward_exits_0(reference: Any) -> torch.nn.Module:
    return _Exiting(my_port.build(reference), SystemExit(0))


def forward_interrupts(reference: Any) -> torch.nn.Module:
    return _Exiting(my_port.build(reference), KeyboardInterrupt())


def forward_raises_a_base_exception(reference: Any) -> torch.nn.Module:
    return _Exiting(my_port.build(reference), Stop("unwinding"))
