"""A module's budget: what rounding explains of its local error, from its own noise.

A correct port computes a module's value in another order (its sums regrouped, a
LayerNorm written by hand, ``einsum``, a fused QKV, ``sdpa`` for eager attention), so its
output differs from the reference's by rounding: the rounding of each value inside the
module, amplified by what the module computes after it. Rounding every input of the module
once more (``local.local_error``'s ``noise``) is moved through the same amplification, so
the budget is ``NOISE_FACTOR`` times that noise, plus ``FLOOR_UNITS`` roundings of the
output's largest magnitude (a value computed mostly from weights, which input noise does
not reach), in the lower precision of the two sides. An int8 quantized Linear keeps the
quantization budget of ``introspect.diff.quantized``.

Not the user's ``--atol``/``--rtol``: those widen the outputs' budget only (issue 41).

Calibration (perturbed bert-tiny, float32, ``tests/ports``' seven styles: hand-written
LayerNorm and GELU, einsum, fused QKV, sdpa, ``nn.TransformerEncoderLayer``'s fast path):
the worst correct module pair measured 0.23 of its budget (most measure 0: the same
kernels on the same values); a tanh GELU in one layer 59x..80x at the GELU, the MLP or the
block; the tanh GELU on a quarter of one FFN's units, or a LayerNorm eps of 3e-5 for
1e-12 (``tests/adversarial/ports/modules_evidence.py``), a few times over it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from introspect.diff.devices import TF32
from introspect.diff.modules.local import UNIT, Local
from introspect.diff.quantized import int8_noise, is_quantized, quantized_word
from introspect.diff.tolerance import INT8_SIGMAS

NOISE_FACTOR = 8.0
FLOOR_UNITS = 16.0
# One rounding of a device's arithmetic that no dtype shows: a float32 matmul run in TF32
# (``devices.rounding_dtypes`` names it; 10 bits of mantissa).
DEVICE_UNIT = {TF32: 2.0 ** -11}


@dataclasses.dataclass(frozen=True)
class ModuleBudget:
    """The largest local error rounding explains for one module pair, and how it came."""

    limit: float
    why: str  # "32x noise 1.2e-07 + 64 roundings of 3.1"

    def __str__(self) -> str:
        return f"{self.limit:.3g} ({self.why})"


def unit_of(module: torch.nn.Module, output: torch.Tensor, reference: torch.Tensor,
            rounding: Sequence[str] = ()) -> float:
    """One rounding, relative, in the lowest precision the module or the reference's value
    is held in, or the devices compute in (``rounding``: "tfloat32" where a GPU's float32
    matmuls round as TF32)."""
    dtypes = {t.dtype for t in module.parameters() if t.is_floating_point()}
    dtypes |= {output.dtype, reference.dtype}
    return max([UNIT.get(d, UNIT[torch.float32]) for d in dtypes]
               + [DEVICE_UNIT.get(name, 0.0) for name in rounding])


def module_budget(module: torch.nn.Module, local: Local, unit: float,
                  input_value: torch.Tensor | None) -> ModuleBudget:
    """The budget of a pair whose local measurement is ``local``."""
    limit = FLOOR_UNITS * unit * local.scale
    if local.noise is None:  # its error was within the floor: the noise was not needed
        why = f"{FLOOR_UNITS:g} roundings of {local.scale:.3g} (its noise not needed)"
    else:
        limit += NOISE_FACTOR * local.noise
        why = (f"{NOISE_FACTOR:g}x its rounding noise {local.noise:.2g} + "
               f"{FLOOR_UNITS:g} roundings of {local.scale:.3g}")
    if is_quantized(module):
        noise = int8_noise(module, input_value)
        if noise is not None:
            limit += INT8_SIGMAS * noise
            why += (f" + {quantized_word(module)} rounding ({INT8_SIGMAS:g} sigma of "
                    f"{noise:.2g})")
    return ModuleBudget(limit, why)


def holds_int8_inside(module: torch.nn.Module) -> bool:
    """A module with int8 Linears below it: their rounding, carried through the rest of
    it, is judged at each of them (their own budgets), not here."""
    return not is_quantized(module) and any(is_quantized(m) for m in module.modules())


__all__ = ["FLOOR_UNITS", "NOISE_FACTOR", "ModuleBudget", "holds_int8_inside",
           "module_budget", "unit_of"]
