"""Ports and losses that reach past their own job: exits, threads, prints, cwd, umask."""

from __future__ import annotations

import copy
import importlib.util
import os
import posix
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ci" / "my_port.py"
_spec = importlib.util.spec_from_file_location("_misbehaves_my_port", _EXAMPLE)
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


# --- Ending the process ---------------------------------------------------------------

def os_exit_0(reference: Any) -> Any:
    os._exit(0)


def os_exit_1(reference: Any) -> Any:
    os._exit(1)


def posix_exit_0(reference: Any) -> Any:
    posix._exit(0)


class _ExitsInForward(torch.nn.Module):
    def __init__(self, port: torch.nn.Module, code: int) -> None:
        super().__init__()
        self.port, self.code = port, code

    def forward(self, **inputs: torch.Tensor) -> Any:
        out = self.port(**inputs)
        os._exit(self.code)
        return out


def forward_os_exit_0(reference: Any) -> torch.nn.Module:
    return _ExitsInForward(my_port.build(reference), 0)


class _ExitsAtStep(torch.nn.Module):
    """A causal LM that ends the process at its third call (a generation step)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.calls = model, 0
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 3:
            os._exit(0)
        return self.model(*args, **kwargs)


def exits_at_step_3(reference: Any) -> torch.nn.Module:
    return _ExitsAtStep(copy.deepcopy(reference.model))


def loss_os_exit_0(outputs: Any, inputs: Any) -> torch.Tensor:
    os._exit(0)


def loss_interrupts(outputs: Any, inputs: Any) -> torch.Tensor:
    raise KeyboardInterrupt


def loss_prints(outputs: Any, inputs: Any) -> torch.Tensor:
    print("loss is being computed")
    first = outputs[0]
    return first.float().pow(2).mean()


def loss_edits_its_inputs(outputs: Any, inputs: Any) -> torch.Tensor:
    """Marks the padded positions real, in place, as a careless loss might."""
    mask = inputs["attention_mask"]
    mask.fill_(1)
    first = outputs[0]
    keep = mask.unsqueeze(-1).to(first.dtype)
    return (first * keep).pow(2).sum() / keep.sum()


def loss_nan(outputs: Any, inputs: Any) -> torch.Tensor:
    return outputs[0].float().sum() * float("nan")


def loss_inf(outputs: Any, inputs: Any) -> torch.Tensor:
    return outputs[0].float().abs().mean() + float("inf")


# --- Hanging -------------------------------------------------------------------------

def starts_a_thread(reference: Any) -> Any:
    """A background worker, as a data loader or a logger might start, that never ends."""
    threading.Thread(target=lambda: time.sleep(10**6), name="port-worker").start()
    return my_port.build(reference)


# --- Printing and moving things ------------------------------------------------------

class _Prints(torch.nn.Module):
    def __init__(self, port: torch.nn.Module) -> None:
        super().__init__()
        self.port = port

    def forward(self, **inputs: torch.Tensor) -> Any:
        print("forward called")
        os.write(1, b"raw write\n")
        return self.port(**inputs)


def prints(reference: Any) -> torch.nn.Module:
    print("building the port")
    sys.stdout.flush()
    return _Prints(my_port.build(reference))


def changes_folder(reference: Any) -> Any:
    os.chdir(os.environ["PORT_FOLDER"])
    return my_port.build(reference)


def sets_umask(reference: Any) -> Any:
    os.umask(0o777)
    return my_port.build(reference)


def sets_signal_handlers(reference: Any) -> Any:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.argv[:] = ["port"]
    return my_port.build(reference)


# --- Backward ------------------------------------------------------------------------

class _NoGrad(torch.nn.Module):
    """Runs its forward under no_grad, as an inference-only port does."""

    def __init__(self, port: torch.nn.Module) -> None:
        super().__init__()
        self.port = port

    def forward(self, **inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            return self.port(**inputs)


def no_grad_forward(reference: Any) -> torch.nn.Module:
    return _NoGrad(my_port.build(reference))


def loss_times_zero(outputs: Any, inputs: Any) -> torch.Tensor:
    return outputs[0].float().pow(2).mean() * 0


# --- Names that reach the reports -----------------------------------------------------

def formula_named(reference: Any) -> torch.nn.Module:
    """The port under a submodule whose name a spreadsheet would run as a formula."""
    wrapper = torch.nn.Module()
    wrapper.add_module("=cmd|' /C calc'!A0", my_port.build(reference))
    name = "=cmd|' /C calc'!A0"

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module(name, wrapper.get_submodule(name))

        def forward(self, **inputs: torch.Tensor) -> Any:
            return self.get_submodule(name)(**inputs)

    return Wrapped()


def labels_in_place(outputs: Any, inputs: Any) -> torch.Tensor:
    """The labels idiom as tutorials write it: the ids themselves, padding set to -100."""
    labels = inputs["input_ids"]
    labels[inputs["attention_mask"] == 0] = -100
    logits = outputs[0]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             labels.reshape(-1), ignore_index=-100)


def loss_adds_a_global_hook(outputs: Any, inputs: Any) -> torch.Tensor:
    """Registers a global forward hook (to log activations) and never removes it."""
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    return outputs[0].float().pow(2).mean()
