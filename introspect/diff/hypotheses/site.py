"""Where a divergence sits in an HF BERT-like reference, and the block's inputs there.

``locate`` finds the block (embeddings, encoder layer N, pooler) named by the context's
layer, checks that the reference holds HF BERT's modules there, and runs the reference
once with a forward pre-hook to capture the block's input. Anything it does not
recognise gives None: the hypotheses then stay silent.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from introspect.diff.hypotheses.blocks import Linears
from introspect.diff.hypotheses.context import DivergenceContext


@dataclass(frozen=True)
class Site:
    """One block of the reference, its weights and its input on the context's inputs."""

    kind: str  # "embeddings", "layer" or "pooler"
    index: int  # the encoder layer's number (-1 for embeddings and pooler)
    prefix: str  # module path of the reference's BERT (``""`` or ``"bert."``)
    weights: Mapping[str, torch.Tensor]  # the block's parameters, names relative to it
    layers: tuple[Mapping[str, torch.Tensor], ...]  # every encoder layer's parameters
    block_input: torch.Tensor | None  # hidden states entering the layer / pooler
    keep: torch.Tensor  # (B, S) bool: real tokens
    heads: int
    eps: float
    activation: Callable[[torch.Tensor], torch.Tensor]
    embeddings_eps: float
    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    # the quantity a hypothesis's run of the layer stops at (``blocks.encoder_layer``'s
    # ``stop``); None: the run computes every quantity
    stop: str | None = None
    # the unmodified layer's Linears on these rows, which a layer's run reuses where it
    # repeats one (``blocks.Linears``); None: each run computes its own
    linears: Linears | None = None

    def module(self, relative: str = "") -> str:
        """The reference's path of a module of this block (``relative`` to it; "" is the
        block itself): ``module("attention.self")`` is "encoder.layer.2.attention.self"."""
        block = {"layer": f"encoder.layer.{self.index}", "embeddings": "embeddings",
                 "pooler": "pooler"}[self.kind]
        return f"{self.prefix}{block}.{relative}" if relative else f"{self.prefix}{block}"

    def owner_of(self, weight: str) -> str:
        """The reference module whose own code reads this block's weight ``weight`` (its
        owner): ``owner_of("attention.self.query.weight")`` is "...attention.self.query"."""
        return self.module(weight.rpartition(".")[0])


def bert_prefix(model: torch.nn.Module) -> str | None:
    """Module path of the BERT body inside ``model`` ("" or e.g. "bert."), or None."""
    for name, module in model.named_modules():
        if all(hasattr(module, a) for a in ("embeddings", "encoder")) and hasattr(
                module.embeddings, "word_embeddings"):
            return f"{name}." if name else ""
    return None


def model_kwargs(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> dict:
    """The inputs ``model.forward`` takes by name."""
    params = inspect.signature(model.forward).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(inputs)
    return {k: v for k, v in inputs.items() if k in params}


def _parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in module.named_parameters()}


class _Seen(Exception):
    """The block's input was taken: the rest of the forward is not needed."""


def _capture_input(model: torch.nn.Module, module: torch.nn.Module,
                   inputs: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The input of ``module`` in a run of ``model`` (eval, no_grad), which stops there."""
    seen: list[torch.Tensor] = []

    def hook(_module, args, kwargs):
        value = args[0] if args else kwargs.get("hidden_states")
        if isinstance(value, torch.Tensor) and not seen:
            seen.append(value.detach())
            raise _Seen

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**model_kwargs(model, inputs))
    except _Seen:
        pass
    finally:
        handle.remove()
    return seen[0] if seen else None


def locate(context: DivergenceContext) -> Site | None:
    """The reference's block holding the divergence, or None when it is not HF BERT-like."""
    model = context.reference_model
    prefix = bert_prefix(model)
    ids = context.inputs.get("input_ids")
    if prefix is None or ids is None or ids.dim() != 2:
        return None
    body: Any = model.get_submodule(prefix.rstrip(".")) if prefix else model  # HF-like
    layers = getattr(body.encoder, "layer", None)
    if layers is None or not hasattr(layers[0], "attention"):
        return None
    mask = context.inputs.get("attention_mask")
    keep = (mask if mask is not None else torch.ones_like(ids)).bool()
    first = layers[0]
    attention = first.attention.self
    heads = getattr(attention, "num_attention_heads", None) or body.config.num_attention_heads
    common = dict(prefix=prefix, layers=tuple(_parameters(m) for m in layers), keep=keep,
                  heads=heads, eps=first.attention.output.LayerNorm.eps,
                  activation=first.intermediate.intermediate_act_fn,
                  embeddings_eps=body.embeddings.LayerNorm.eps, input_ids=ids,
                  token_type_ids=context.inputs.get("token_type_ids", torch.zeros_like(ids)))
    match = re.fullmatch(r"encoder\.layer\.(\d+)", context.layer)
    if context.layer == "embeddings":
        return Site("embeddings", -1, weights=_parameters(body.embeddings), block_input=None,
                    **common)
    if match and int(match.group(1)) < len(layers):
        n = int(match.group(1))
        return Site("layer", n, weights=common["layers"][n],
                    block_input=_capture_input(model, layers[n], context.inputs), **common)
    if context.layer == "pooler" and getattr(body, "pooler", None) is not None:
        pooler = body.pooler
        return Site("pooler", -1, weights=_parameters(pooler),
                    block_input=_capture_input(model, pooler, context.inputs), **common)
    return None
