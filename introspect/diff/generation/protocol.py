"""The protocol a model decodes by, as the generation diff calls it and reads it back.

HF's: ``model(input_ids=ids, past_key_values=cache, use_cache=True)`` (``cache=`` where
its forward takes that), returning the logits and its cache (see ``loop``). Here: the
prompt it is given, the keywords it is called with, the checks made before any step, and
the logits and cache read back from what it returns.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from introspect.errors import InputError
from introspect.models.load import TokenizedInputs


def prompt_row(inputs: TokenizedInputs | Mapping[str, torch.Tensor]
               ) -> tuple[torch.Tensor, list[str]]:
    """The first row of the prompt without its padding, and a note when rows were dropped."""
    tensors = inputs.tensors if isinstance(inputs, TokenizedInputs) else inputs
    ids = tensors.get("input_ids") if isinstance(tensors, Mapping) else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] == 0 \
            or ids.is_floating_point():
        raise InputError("generate needs a prompt: input_ids of shape (batch, length) "
                         "holding token ids")
    notes = []
    row = ids[:1]
    mask = tensors.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
        real = int(mask[0].sum())
        if real < ids.shape[1]:
            if bool(mask[0, :real].all()):  # right-padded: the real tokens first
                row = ids[:1, :real]
            else:
                raise InputError("generate needs an unpadded prompt; the first row is "
                                 "padded on the left: give one text")
    if ids.shape[0] > 1:
        notes.append(f"generation decodes the first prompt only ({ids.shape[0]} rows given)")
    return row.clone(), notes


def cache_keyword(model: torch.nn.Module) -> str | None:
    """The keyword a model takes its cache by: ``cache`` (transformers >= 5.2),
    ``past_key_values`` (older HF, most ports); any of them under ``**kwargs``."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return "past_key_values"
    return None


MAX_STEPS = 4096  # tokens one diff generates: each step keeps its tables and caches


def check_length(reference: torch.nn.Module, prompt: int, steps: int) -> None:
    """Refuse, before any step, what cannot end well: a reference that does not decode (a
    masked-LM head), more steps than ``MAX_STEPS``, or a prompt and steps past the
    reference's positions (it would fail, or grow until killed, at the last ones)."""
    can_generate = getattr(reference, "can_generate", None)
    if callable(can_generate) and not can_generate():
        raise InputError(f"generate: the reference ({type(reference).__name__}) is not a causal "
                         "language model: use a decoder model with --head causal-lm, or diff "
                         "without --generate")
    if steps > MAX_STEPS:
        raise InputError(f"generate: {steps} tokens is more than the {MAX_STEPS} one diff "
                         "compares; a divergence shows in far fewer steps")
    config = getattr(reference, "config", None)
    positions = next((value for key in ("max_position_embeddings", "n_positions", "n_ctx")
                      if isinstance(value := getattr(config, key, None), int) and value > 0),
                     None)
    if positions is not None and prompt + steps > positions:
        room = positions - prompt
        advice = f"generate at most {room} tokens" if room > 0 else "give a shorter prompt"
        raise InputError(f"generate: a prompt of {prompt} tokens and {steps} steps reach "
                         f"position {prompt + steps}, past the {positions} positions of the "
                         f"reference; {advice}")


def check_protocol(side: str, model: torch.nn.Module) -> None:
    if cache_keyword(model) is None:
        raise InputError(
            f"generate: the {side} ({type(model).__name__}) takes no past_key_values (nor "
            "cache): wrap it so model(ids, past_key_values=cache, use_cache=True) returns "
            "(logits, cache)")


def call_keywords(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    parameters = inspect.signature(model.forward).parameters
    keywords: dict[str, Any] = {cache_keyword(model) or "past_key_values": cache}
    if "use_cache" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                        for p in parameters.values()):
        keywords["use_cache"] = True
    return keywords


@contextlib.contextmanager
def captured_outputs(reference: torch.nn.Module,
              candidate: torch.nn.Module) -> Iterator[Callable[[], tuple[list[Any], list[Any]]]]:
    """Each side's output of its recorded call, as far as the calls went (the reference
    runs first; a model compared with itself runs twice)."""
    outputs: dict[int, list[Any]] = {id(reference): [], id(candidate): []}

    def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
        # (a copy made meanwhile, the noise budget's float64 reference, carries the hook:
        # its calls are not the reference's)
        if id(module) in outputs:
            outputs[id(module)].append(output)

    handles = [model.register_forward_hook(keep)
               for model in {id(m): m for m in (reference, candidate)}.values()]

    def sides() -> tuple[list[Any], list[Any]]:
        if reference is candidate:
            both = outputs[id(reference)]
            return both[:1], both[1:2]
        return outputs[id(reference)][:1], outputs[id(candidate)][:1]

    try:
        yield sides
    finally:
        for handle in handles:
            handle.remove()


def logits_and_cache(side: str, output: Any) -> tuple[torch.Tensor, Any]:
    if isinstance(output, Mapping) or hasattr(output, "logits"):
        logits = output["logits"] if isinstance(output, Mapping) else output.logits
        fields = output if isinstance(output, Mapping) else vars(output)
        cache = fields["cache"] if "cache" in fields else fields.get("past_key_values")
    elif isinstance(output, (tuple, list)) and output:
        logits, cache = output[0], output[1] if len(output) > 1 else None
    else:
        logits, cache = output, None
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise InputError(f"generate: the {side} returned {type(output).__name__}; expected "
                         "logits (batch, length, vocab) and a cache: a ModelOutput with "
                         ".logits and .past_key_values, or (logits, cache)")
    return logits.detach(), cache
