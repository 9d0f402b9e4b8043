"""The adversarial corpus: its mechanisms, the reference's perturbation, and the port
files imported by path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tests import launch

PORTS = Path(__file__).resolve().parent / "ports"
SEED = 20
# Port variables set by builders (env_var.py); restored after every test.
PORT_ENV = ("ADV_PORT_TANH_LAYER",)


def perturb(model: torch.nn.Module, seed: int = SEED) -> None:
    """Move every LayerNorm weight and bias and every other bias off its init, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            noise = torch.randn(value.shape, generator=generator)
            if "LayerNorm.weight" in name:
                value.copy_(1 + 0.3 * noise)
            elif "intermediate.dense.bias" in name:
                value.copy_(1.0 * noise)  # GELU inputs over [-2, 2], where tanh and erf part
            elif name.endswith("bias"):
                value.copy_(0.2 * noise)


def as_reference(loaded) -> SimpleNamespace:
    return SimpleNamespace(model=loaded.model, config=loaded.model.config,
                           folder=loaded.folder, tokenizer=loaded.tokenizer)


_imported: dict[Path, object] = {}


def port(relative: str):
    """The port file ``ports/<relative>`` imported by its path, once, under a unique name."""
    path = PORTS / relative
    if path not in _imported:
        if str(PORTS) not in sys.path:
            sys.path.insert(0, str(PORTS))  # the ports' helpers (adv_bert, helper_*)
        name = "adversarial_port_" + relative.replace("/", "_").removesuffix(".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _imported[path] = module
    return _imported[path]


def diff_port(mini, file: str, build: str, **options: Any):
    """``introspect.diff`` in this process of ``mini``'s reference, on its inputs, against
    what ``ports/<file>``'s ``build`` returns for it."""
    import introspect

    reference, inputs = mini
    return introspect.diff(reference.model, getattr(port(file), build)(reference), inputs,
                           **options)


def run_port(file: str, build: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``introspect diff --candidate ports/<file>:<build> [options]`` on the real CLI,
    offline, 200 columns wide; it must end without a traceback."""
    done = launch.run(
        [sys.executable, "-m", "introspect", "diff", "--candidate",
         f"{PORTS / file}:{build}", *options],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return done


def first_divergence(stdout: str) -> str:
    """The verdict's "first divergence:" line ("" where there is none)."""
    return next((line for line in stdout.splitlines()
                 if line.startswith("first divergence:")), "")


MECHANISMS = {
    "private_attr": "a private attribute (self._approx) picks the tanh GELU",
    "module_global": "a module global read in forward",
    "closure": "a closure variable of the layer's activation function",
    "partial": "functools.partial(F.gelu, approximate=...)",
    "bound_method": "a bound method of another object",
    "class_attr": "a class attribute of a same-named subclass made with type()",
    "class_patch": "the class's method patched after import",
    "helper_module": "a helper module in another file",
    "env_var": "an environment variable read in forward",
    "config_mutated": "a config object mutated after construction",
    "forward_hook": "a forward hook scaling the layer's output by 1.01",
    "pre_hook": "a forward pre-hook scaling the intermediate block's input by 1.01",
    "exec_class": "a class defined by exec, as in a notebook cell",
    "id_keyed": "LayerNorm eps from a dict keyed on id(self)",
    "stores_scores": "a forward storing self.scores, with 1/d scaling in one layer",
}
# The mechanisms also checked on MiniLM (6 layers, the fault in layer 3), where layer
# replay has layers to copy: the two the issue reproduced there.
ON_MINILM = ("private_attr", "id_keyed")
